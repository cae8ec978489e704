"""Eq. 2 and 3 of the Vision Transformer: the encoder block (multi-head self-attention, the MLP, a
residual around each) and stochastic depth (deviation 4). model/vit.py names the deviations and the
shape legend (B batch, T tokens, D embed_dim, h heads, d = D / h, M mlp_dim).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.model.gridconv import GridConv
from foodvit.settings.model import ViTConfig


class Attention(nn.Module):
    """MSA of Eq. 2, as Appendix A defines it.

    One fused projection U_qkv (D -> 3D, with bias), softmax(q k^T / sqrt(d)) v for each of the
    h heads, heads concatenated, output projection U_msa (D -> D), then dropout (App. B.1).
    `fused=True` computes the middle with torch's scaled_dot_product_attention (flash or
    memory-efficient kernels where available); the plain path below it is the same math, written
    out, and is the one that can hand back the attention weights.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
        locality: bool = False,
        locality_mask: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim**-0.5  # 1 / sqrt(d)
        self.attn_dropout = attn_dropout
        self.fused = True
        if locality:  # deviation 7: a learned temperature tau in softmax(q k^T / tau), starting at sqrt(d)
            self.temperature = nn.Parameter(torch.tensor(self.head_dim**0.5))
        self.mask_self = locality and locality_mask  # deviation 7: no token attends to itself
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)  # U_qkv
        self.proj = nn.Linear(embed_dim, embed_dim)  # U_msa
        self.proj_drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, return_attention: bool = False, queries: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, D) -> (B, Q, D): every token attends to all T tokens; queries=Q keeps only the first
        Q tokens' outputs (Q = T by default), computing no others."""
        B, T, D = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).reshape(B, T, 3, h, d).permute(2, 0, 3, 1, 4)  # (B, T, 3D) -> (3, B, h, T, d)
        q, k, v = qkv.unbind(0)  # each (B, h, T, d)
        if queries is not None:
            q = q[:, :, :queries]  # (B, h, T, d) -> (B, h, Q, d); k and v keep all T tokens
        Q = q.shape[2]
        p = self.attn_dropout if self.training else 0.0
        scale, mask = self.scale, None  # mask: True where attention is allowed
        if hasattr(self, "temperature"):  # deviation 7: softmax(q k^T / tau)
            q, scale = q / self.temperature, 1.0
        if self.mask_self:  # deviation 7: no token attending to itself
            mask = ~torch.eye(Q, T, dtype=torch.bool, device=x.device)  # (Q, T), False where query i meets key i
        weights = None
        if self.fused and not return_attention:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)  # (B, h, Q, d)
        else:
            weights = (q * scale) @ k.transpose(-2, -1)  # (B, h, Q, d) @ (B, h, d, T) -> (B, h, Q, T)
            if mask is not None:
                weights = weights.masked_fill(~mask, float("-inf"))
            weights = weights.softmax(dim=-1)
            x = F.dropout(weights, p, self.training) @ v  # (B, h, Q, T) @ (B, h, T, d) -> (B, h, Q, d)
        x = x.transpose(1, 2).reshape(B, Q, D)  # (B, h, Q, d) -> (B, Q, h, d) -> (B, Q, D)
        return self.proj_drop(self.proj(x)), weights


class MLP(nn.Module):
    """The MLP of Eq. 3: Linear(D, M), GELU, Dropout, Linear(M, D), Dropout. With conv_prefix (the
    number of prefix tokens), deviation 12's convolution over the patch grid follows the GELU."""

    def __init__(self, embed_dim: int, mlp_dim: int, dropout: float = 0.0, conv_prefix: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, mlp_dim)
        self.act = nn.GELU()
        self.conv = GridConv(mlp_dim, conv_prefix) if conv_prefix is not None else None  # deviation 12
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(mlp_dim, embed_dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))  # (B, T, D) -> (B, T, M)
        if self.conv is not None:
            h = self.conv(h)  # deviation 12: (B, T, M) -> (B, T, M)
        return self.drop2(self.fc2(self.drop1(h)))  # (B, T, M) -> (B, T, D)


class DropPath(nn.Module):
    """Deviation 4: stochastic depth. In training, drop a sample's whole residual branch with
    probability p and scale the kept ones by 1 / (1 - p); identity in eval."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # one draw per sample
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """One pre-norm encoder layer: Eq. 2 then Eq. 3, a residual after each."""

    def __init__(self, config: ViTConfig, drop_path: float = 0.0) -> None:
        super().__init__()
        D, eps = config.embed_dim, config.layer_norm_eps
        self.norm1 = nn.LayerNorm(D, eps=eps)
        self.attn = Attention(
            D, config.num_heads, config.attn_dropout, config.dropout, config.locality, config.locality_mask
        )
        self.norm2 = nn.LayerNorm(D, eps=eps)
        self.mlp = MLP(D, config.mlp_dim, config.dropout, config.num_prefix_tokens if config.mlp_conv else None)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, x: torch.Tensor, return_attention: bool = False, queries: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, D) -> (B, T, D), or (B, Q, D) with queries=Q: only the first Q tokens' outputs."""
        a, weights = self.attn(self.norm1(x), return_attention, queries)
        if queries is not None:
            x = x[:, :queries]  # the residual stream of the tokens still computed
        x = x + self.drop_path(a)  # Eq. 2: z'_l = MSA(LN(z_{l-1})) + z_{l-1}
        x = x + self.drop_path(self.mlp(self.norm2(x)))  # Eq. 3: z_l = MLP(LN(z'_l)) + z'_l
        return x, weights
