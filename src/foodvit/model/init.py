"""The model's initialisation, as the authors' JAX code does it (google-research/vision_transformer,
models_vit.py), each rule next to the line it reproduces; deviation 8, mimetic initialisation
of the attention (Trockman & Kolter 2023); and deviation 11, impulse initialisation (Zheng et al.
2024). vit.py builds the model and calls init_weights."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def lecun_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """Flax's lecun_normal: truncated normal (+-2 std) with variance 1 / fan_in after truncation."""
    fan_in = tensor[0].numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # the std of a unit normal truncated at +-2
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def init_head(head: nn.Module) -> None:
    if isinstance(head, nn.Linear):
        nn.init.zeros_(head.weight)  # JAX: Dense(num_classes, kernel_init=zeros); the paper fine-tunes from a zero head
        nn.init.zeros_(head.bias)


MIMETIC_QK = (0.7, 0.7)  # (a, b) of W_q W_k^T ~ a Z + b I: the paper's values for ViT-Tiny
MIMETIC_VO = (0.4, 0.4)  # (a, b) of W_v W_o ~ a Z - b I


@torch.no_grad()
def mimetic_init_(attn, qk: tuple[float, float] = MIMETIC_QK, vo: tuple[float, float] = MIMETIC_VO) -> None:
    """Deviation 8: set U_qkv's query and key rows per head and the value rows with U_msa so that
    the products mimic a pre-trained ViT's (see the module docstring). In the paper's notation a
    head's logits are X W_q W_k^T X^T with W_q = (its rows of U_qkv)^T, and the value path is
    X W_v W_o with W_v = U_qkv's value rows ^T and W_o = U_msa.weight^T. Each product's target M
    is split as M = U S V^T: W_q = U_k S_k^1/2, W_k = V_k S_k^1/2 (the best rank-d approximation),
    W_v = U S^1/2, W_o = (V S^1/2)^T. Biases stay zero."""
    D, h, d = attn.proj.weight.shape[0], attn.num_heads, attn.head_dim
    weight = attn.qkv.weight  # (3D, D): rows [q heads | k heads | v heads]

    def split(a: float, b: float, sign: float) -> tuple[torch.Tensor, torch.Tensor]:
        target = a * torch.randn(D, D) / math.sqrt(D) + sign * b * torch.eye(D)
        u, s, vh = torch.linalg.svd(target)
        root = s.sqrt()
        return u * root, vh.T * root  # (D, D) each: left @ right.T == target

    for head in range(h):
        left, right = split(*qk, +1.0)
        rows = slice(head * d, (head + 1) * d)
        weight[rows] = left[:, :d].T.to(weight)  # W_q,h^T: (d, D)
        weight[D:][rows] = right[:, :d].T.to(weight)  # W_k,h^T
    left, right = split(*vo, -1.0)
    weight[2 * D :] = left.T.to(weight)  # W_v^T: (D, D)
    attn.proj.weight.copy_(right)  # U_msa.weight = W_o^T = (V S^1/2)
    # W_v W_o = (U S^1/2)(V S^1/2)^T = a Z - b I


# target logit of the chosen neighbour's row and of its column (0 elsewhere): at step 0 about 64% of the attention on
# the chosen neighbour on an 8 x 8 grid, less on larger ones (47% on 12 x 12, about 40% on 14 x 14)
IMPULSE_LOGIT = 10.0
IMPULSE_RIDGE = 1e-4  # ridge of the solve, as a share of the largest squared singular value of the positions


def impulse_offsets(grid: int, rows: int, cols: int) -> torch.Tensor:
    """The key each patch of a grid x grid meets in an impulse filter of offset (rows, cols), the
    edge clamped: (N,) flat positions."""
    r, c = torch.arange(grid * grid) // grid, torch.arange(grid * grid) % grid
    return (r + rows).clamp(0, grid - 1) * grid + (c + cols).clamp(0, grid - 1)


def impulse_taps(heads: int, locality: bool = False) -> list[tuple[int, int]]:
    """One random (dy, dx) of the 3 x 3 neighbourhood per head; never (0, 0) under locality
    self-attention (deviation 7), which hides a token from itself."""
    taps = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if not (locality and dy == dx == 0)]
    return [taps[i] for i in torch.randint(len(taps), (heads,), device="cpu").tolist()]


@torch.no_grad()
def impulse_init_(attn, positions: torch.Tensor, offsets: list[tuple[int, int]]) -> None:
    """Deviation 11: set each head's query and key rows of U_qkv so that, on the layer-normalised
    position embeddings `positions` (N, D) of a square grid, head h's logits are near
    IMPULSE_LOGIT x ([row of key = row of query + dy] + [column of key = column of query + dx]) for
    offsets[h] = (dy, dx): the softmax of that sum peaks on the one patch at the offset. Sin-cos
    positions hold a row part and a column part, so this additive target is one they can express.
    Solved as M = argmin ||X M X^T - target||^2 + ridge ||M||^2 (X = the positions), M scaled by
    sqrt(d) so that the attention's X M X^T / sqrt(d) meets the target, then W_q,h W_k,h^T = the
    best rank-d part of M.
    Biases stay zero; the value path keeps the JAX initialisation."""
    D, d = attn.proj.weight.shape[0], attn.head_dim
    grid = math.isqrt(positions.shape[0])
    X = positions.double()
    u, s, vh = torch.linalg.svd(X, full_matrices=False)
    shrink = s / (s**2 + IMPULSE_RIDGE * s[0] ** 2)  # the ridge's pseudo-inverse of the singular values
    weight = attn.qkv.weight  # (3D, D): rows [q heads | k heads | v heads]
    rows_of = torch.arange(grid * grid) // grid
    cols_of = torch.arange(grid * grid) % grid
    for head, (dy, dx) in enumerate(offsets):
        key = impulse_offsets(grid, dy, dx)
        target = IMPULSE_LOGIT * (
            (rows_of[None, :] == rows_of[key][:, None]).double() + (cols_of[None, :] == cols_of[key][:, None]).double()
        )
        M = (vh.T * shrink) @ (u.T @ target @ u) @ (shrink[:, None] * vh) * math.sqrt(d)  # (D, D): X M X^T ~ target
        left, sv, right = torch.linalg.svd(M)
        root = sv[:d].sqrt()
        rows = slice(head * d, (head + 1) * d)
        weight[rows] = (left[:, :d] * root).T.to(weight)  # W_q,h^T: (d, D)
        weight[D:][rows] = (right[:d].T * root).T.to(weight)  # W_k,h^T


@torch.no_grad()
def init_weights(model) -> None:
    """Initialise as the authors' JAX code does; each rule names the line it reproduces."""
    lecun_normal_(model.patch_embed.proj.weight)  # embedding: nn.Conv default kernel_init = lecun_normal
    nn.init.zeros_(model.patch_embed.proj.bias)  # ... and bias_init = zeros
    if model.config.pos_embed == "learned":
        nn.init.normal_(model.pos_embed, std=0.02)  # pos_embedding: initializers.normal(stddev=0.02)
    if model.config.class_token:
        nn.init.zeros_(model.cls_token)  # cls: initializers.zeros
    if model.config.distill_token:
        # DeiT's: unlike the zero class token, so the two differ at step 0
        nn.init.trunc_normal_(model.dist_token, std=0.02)
    for block in model.blocks:
        # MultiHeadDotProductAttention(kernel_init=xavier_uniform): q, k and v are separate D -> D
        # projections there, so each third of the fused U_qkv gets xavier with fan_in = fan_out = D.
        for chunk in block.attn.qkv.weight.chunk(3, dim=0):
            nn.init.xavier_uniform_(chunk)
        nn.init.zeros_(block.attn.qkv.bias)  # flax's bias_init = zeros
        nn.init.xavier_uniform_(block.attn.proj.weight)  # the attention's output projection, same kernel_init
        nn.init.zeros_(block.attn.proj.bias)
        for fc in (block.mlp.fc1, block.mlp.fc2):
            nn.init.xavier_uniform_(fc.weight)  # MlpBlock: kernel_init=xavier_uniform
            nn.init.normal_(fc.bias, std=1e-6)  # MlpBlock: bias_init=normal(stddev=1e-6)
        # LayerNorm: scale ones, bias zeros (PyTorch's default is flax's).
        if model.config.init == "mimetic":
            mimetic_init_(block.attn)
        # (a meta model has no values to solve for)
        elif model.config.init == "impulse" and not model.pos_embed.is_meta:
            impulse_init_(
                block.attn,
                F.layer_norm(model.pos_embed[0, model.config.num_prefix_tokens :].double(), (model.config.embed_dim,)),
                impulse_taps(block.attn.num_heads, model.config.locality and model.config.locality_mask),
            )
    # Deviation 5's stem keeps PyTorch's default (Kaiming-uniform) conv init, as CCT does; deviation 6's
    # attn_pool keeps nn.Linear's default (Kaiming-uniform); deviation 12's filters start at zero
    # (GridConv.reset_parameters).
    init_head(model.head)
    if model.config.distill_token:
        init_head(model.head_dist)
