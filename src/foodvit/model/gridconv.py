"""Deviation 12 of model/vit.py: a depthwise 3 x 3 convolution over the patch grid inside the MLP of
Eq. 3 (LocalViT, Li et al. 2021, arXiv 2104.05707; CeiT's LeFF, Yuan et al. 2021, is the same idea).

After the MLP's first layer and GELU, the patch tokens' M hidden features are laid out on their grid
(row-major, as Eq. 1 flattens the patches), and one 3 x 3 filter per hidden feature (zero padding)
adds, through a GELU, a mix of each patch token's and its 8 neighbours' features: h + GELU(DWConv(h)).
The prefix tokens have no place on the grid: they skip the convolution, not the MLP. The grid's side
is read from the token count, so any grid works (progressive resizing's smaller first epochs).

The filters start at zero, so at step 0 the model computes the paper's function (and any init's
analysis holds), and weights without them (a pre-trained ViT) load with them at zero (weights.py).
Building the filters still draws PyTorch's conv init from the random stream before zeroing it, so a
seed gives other draws of the rest than without them, as deviation 9's token does.

LocalViT differs: no residual, a batch norm, h-swish and squeeze-excitation, and its class token
skips the whole MLP. Attention rollout (viz/attention.py) reads the attention alone and does not
see this second path between tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GridConv(nn.Conv2d):
    """h + GELU(DWConv3x3(h)) on the patch tokens' grid: (B, T, M) -> (B, T, M), the first `prefix`
    tokens unchanged. Its parameters are a depthwise Conv2d's (weight (M, 1, 3, 3), bias (M,))."""

    def __init__(self, channels: int, prefix: int) -> None:
        super().__init__(channels, channels, 3, padding=1, groups=channels)
        self.prefix = prefix

    def reset_parameters(self) -> None:
        super().reset_parameters()  # PyTorch's init draws from the random stream: a seed's later weights follow it
        nn.init.zeros_(self.weight)
        assert self.bias is not None  # made by Conv2d's default bias=True
        nn.init.zeros_(self.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape[1] == self.prefix:  # a class-only last block: no patch token to convolve
            return h
        patches = h[:, self.prefix :]  # (B, N, M)
        B, N, M = patches.shape
        side = math.isqrt(N)
        grid = patches.transpose(1, 2).reshape(B, M, side, side)  # (B, N, M) -> (B, M, H/P, W/P)
        mixed = patches + F.gelu(super().forward(grid)).flatten(2).transpose(1, 2)  # -> (B, N, M)
        return torch.cat([h[:, : self.prefix], mixed], dim=1)
