"""Dense relative localization (Liu et al., "Efficient Training of Visual Transformers with Small
Datasets", NeurIPS 2021): an auxiliary self-supervised task for training from scratch on small data.

From the final patch-token grid (k x k tokens after the last LayerNorm), sample pairs of
positions (i, j) and (p, h) in each image; a small MLP reads the two tokens, concatenated, and
predicts their offset ((i - p) / k, (j - h) / k); the loss is the L1 distance to the true offset.
To solve it the tokens must keep where they came from and what lies around them: the spatial
knowledge a ViT otherwise learns only from large data. The classification loss becomes
cross-entropy + weight x this loss. Training only: the saved model is the plain ViT.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.settings.objectives import OBJECTIVE_SETTINGS
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs, vit_of


def pair_offsets(first: torch.Tensor, second: torch.Tensor, grid: int) -> torch.Tensor:
    """Row and column offset of flat grid positions first - second, over the grid side: (...) -> (..., 2)."""
    rows = torch.div(first, grid, rounding_mode="floor") - torch.div(second, grid, rounding_mode="floor")
    cols = first % grid - second % grid
    return torch.stack([rows, cols], dim=-1).float() / grid


class DenseRelativeLocalization(nn.Module):
    """The auxiliary head: two tokens in, their relative grid position out. (B, N, D) -> scalar loss."""

    def __init__(self, embed_dim: int, pairs: int = 64, hidden: int = 512) -> None:
        super().__init__()
        self.pairs = pairs
        self.mlp = nn.Sequential(
            nn.Linear(2 * embed_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
        )

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        B, N, D = patches.shape
        # the grid of this batch: smaller than the model's while progressive resizing trains at a lower size
        grid = math.isqrt(N)
        if grid * grid != N:
            raise ValueError(f"expected a square grid of patch tokens, got {N}")
        index = torch.randint(N, (B, self.pairs, 2), device=patches.device)  # (B, m, 2) flat positions
        # (B, 2m, D): first, second, first, ...
        tokens = patches.gather(1, index.view(B, 2 * self.pairs, 1).expand(-1, -1, D))
        predicted = self.mlp(tokens.view(B, self.pairs, 2 * D))  # each pair's two tokens concatenated -> (B, m, 2)
        # the mean over pairs, as a sum over their count: a process whose share of the batch is
        # empty (distributed training) gets 0 and still takes part in the gradient's all-reduce
        error = F.l1_loss(predicted.float(), pair_offsets(index[..., 0], index[..., 1], grid), reduction="sum")
        return error / max(1, predicted.numel())


class Localization(Objective):
    """The dense relative localization term: the auxiliary head reads the final patch tokens.
    checkpoint.pt keeps the head under "auxiliary"."""

    settings = OBJECTIVE_SETTINGS["drloc"]
    checkpoint_key = "auxiliary"
    reads_all_tokens = True

    def __init__(self, embed_dim: int, weight: float, pairs: int = 64) -> None:
        super().__init__(weight)
        self.drloc = DenseRelativeLocalization(embed_dim, pairs)

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> Localization:
        return cls(vit_of(model).config.embed_dim, config.drloc.weight, config.drloc.pairs)

    @property
    def part(self) -> nn.Module:
        return self.drloc

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        return self.drloc(outputs.tokens[:, vit_of(batch.model).config.num_prefix_tokens :])
