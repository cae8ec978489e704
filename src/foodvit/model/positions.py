"""Eq. 1's E_pos beyond the learned table model/vit.py keeps: the fixed 2D sin-cos embedding (deviation 2)
and section 3.2's 2D interpolation of position embeddings to another patch grid (fine-tuning at a new
resolution, FixRes, progressive resizing). Shapes: N patches, D width, g the grid side."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from foodvit.errors import ConfigError, InputError


def sincos_2d_pos_embed(grid_size: int, embed_dim: int, temperature: float = 10000.0, prefix: int = 0) -> torch.Tensor:
    """Deviation 2: fixed 2D sine-cosine position embedding, (prefix + N, D), as MoCo v3 builds it.

    For patch (r, c) and k < D/4, with omega_k = 1 / temperature^(k / (D/4)): channel k is
    sin(r omega_k), D/4 + k is cos(r omega_k), D/2 + k is sin(c omega_k), 3D/4 + k is cos(c omega_k)
    (Vaswani et al. 2017's encoding, once per axis). The prefix tokens (class, distillation) come
    first, at position zero.
    """
    if embed_dim % 4:
        raise ConfigError(f"sincos2d position embedding needs embed_dim divisible by 4, got {embed_dim}")
    rows, cols = torch.meshgrid(
        torch.arange(grid_size, dtype=torch.float64), torch.arange(grid_size, dtype=torch.float64), indexing="ij"
    )
    omega = 1.0 / temperature ** (torch.arange(embed_dim // 4, dtype=torch.float64) / (embed_dim // 4))
    rows = rows.flatten()[:, None] * omega[None, :]  # (N, D/4)
    cols = cols.flatten()[:, None] * omega[None, :]  # (N, D/4)
    table = torch.cat([rows.sin(), rows.cos(), cols.sin(), cols.cos()], dim=1).float()  # (N, D)
    return torch.cat([table.new_zeros(prefix, embed_dim), table])  # (prefix + N, D)


def resample_pos_embed(
    pos_embed: torch.Tensor,
    grid_size: int | tuple[int, int],
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    align_corners: bool = False,
    antialias: bool = False,
) -> torch.Tensor:
    """Section 3.2: 2D-interpolate patch position embeddings to a new grid; keep the class position.

    (1, prefix + g_old^2, D) -> (1, prefix + g_new^2, D). The old grid must be square.
    torchvision resamples with mode='bicubic', align_corners=True; timm with bicubic and
    align_corners=False (the default here).
    """
    new_h, new_w = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    _, T, D = pos_embed.shape
    old = math.isqrt(T - num_prefix_tokens)
    if old * old != T - num_prefix_tokens:
        raise InputError(
            f"position embedding of {T} tokens with {num_prefix_tokens} prefix token(s) does not hold a square "
            f"grid of patches; was it trained with{'out' if num_prefix_tokens else ''} a class token?"
        )
    if (old, old) == (new_h, new_w):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = grid.float().reshape(1, old, old, D).permute(0, 3, 1, 2)  # (1, N, D) -> (1, D, g, g)
    kwargs = {"align_corners": align_corners} if mode in ("bilinear", "bicubic") else {}
    grid = F.interpolate(grid, size=(new_h, new_w), mode=mode, antialias=antialias, **kwargs)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_h * new_w, D)  # (1, D, g', g') -> (1, N', D)
    return torch.cat([prefix, grid.to(pos_embed.dtype)], dim=1)
