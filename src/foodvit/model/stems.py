"""The tokenisers that replace Eq. 1's single patchify projection (deviations 5 and 10 of
model/vit.py, where PatchEmbed chooses between them): each turns (B, C, H, W) images into the
same H/P x W/P grid of tokens the paper's stem makes."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn


class ConvStem(nn.Module):
    """Deviation 5: convolutional tokeniser (CCT, Hassani et al. 2021; BatchNorm as Xiao et al. 2021).

    log2(P) stages of [conv 3x3, BatchNorm, ReLU, max-pool 3x3 stride 2], widths doubling up to D,
    so the total stride is P and the token grid is the same H/P x W/P as the patchify stem.
    """

    def __init__(self, in_channels: int, embed_dim: int, patch_size: int) -> None:
        super().__init__()
        stages = int(math.log2(patch_size))
        widths = [in_channels] + [max(embed_dim // 2 ** (stages - 1 - i), 16) for i in range(stages)]
        layers: list[nn.Module] = []
        for c_in, c_out in itertools.pairwise(widths):
            layers += [
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # channels-last: the convolutions, batch norms and max-pools run faster on it than on (B, C, H, W) rows
        # (results/speed-layouts.csv); the same sums in another order
        return self.layers(images.contiguous(memory_format=torch.channels_last))  # (B, C, H, W) -> (B, D, H/P, W/P)


class ShiftedPatches(nn.Module):
    """Deviation 10: shifted patch tokenisation (Lee et al. 2021). The image and its four diagonal
    shifts by P/2 (zeros shifted in), stacked on the channels, cut into P x P patches, each
    flattened and layer-normalised: (B, C, H, W) -> (B, N, 5 C P^2)."""

    COPIES = 5  # the image and its four diagonal shifts
    # (rows, columns) in half patches: up-left, up-right, down-left, down-right
    SHIFTS = ((-1, -1), (-1, 1), (1, -1), (1, 1))

    def __init__(self, in_channels: int, patch_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.norm = nn.LayerNorm(self.COPIES * in_channels * patch_size**2, eps=eps)

    @staticmethod
    def shift(images: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """The image moved by (rows, cols) pixels, zeros shifted in: out[y, x] = images[y - rows, x - cols]."""
        H, W = images.shape[-2:]
        padded = F.pad(images, (max(cols, 0), max(-cols, 0), max(rows, 0), max(-rows, 0)))  # (left, right, top, bottom)
        top, left = max(-rows, 0), max(-cols, 0)
        return padded[..., top : top + H, left : left + W]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        half, P = self.patch_size // 2, self.patch_size
        shifted = [self.shift(images, r * half, c * half) for r, c in self.SHIFTS]
        x = torch.cat([images, *shifted], dim=1)  # (B, 5C, H, W)
        B, C5, H, W = x.shape
        x = x.reshape(B, C5, H // P, P, W // P, P).permute(0, 2, 4, 1, 3, 5)  # (B, H/P, W/P, 5C, P, P)
        return self.norm(x.reshape(B, (H // P) * (W // P), C5 * P * P))  # (B, N, 5CP^2), each patch normalised
