"""Progressive resizing (--start-size, --start-share): the first epochs train on smaller batches, the rest
at the model's own side. The model never changes size: its config, its saved weights and every evaluation
keep its own; a ViT with fixed (sin-cos) or no position embeddings embeds a smaller batch with that grid's
embedding (Eq. 1 holds for any grid of patches, deviation 2 gives the positions of any grid), which this
module hands it, built once per grid, device and dtype: rebuilding it at every step would cost a
host-to-device copy a step on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

from foodvit.model.vit import VisionTransformer


class AnyGrid(nn.Module):
    """A ViT as progressive resizing trains it: batches of any side on its patch grid, each embedded
    with its grid's position embedding; batches of the model's own side take the model's own path.
    forward, forward_features, forward_intermediates, forward_head and config mean what the ViT's do (the
    training objectives read them); the parameters are the ViT's own."""

    def __init__(self, vit: VisionTransformer) -> None:
        super().__init__()
        self.vit = vit
        self._pos_embeds: dict[tuple, torch.Tensor] = {}  # (grid, device, dtype) -> (1, T', D)

    @property
    def config(self):
        return self.vit.config

    def pos_embed_for(self, images: torch.Tensor) -> torch.Tensor | None:
        """The E_pos of the batch's grid, or None (the model's own) at the model's side."""
        grid = images.shape[-1] // self.vit.config.patch_size
        if grid == self.vit.config.grid_size:
            return None
        like = self.vit.norm.weight  # where the model is now: a move to another device builds it again there
        key = (grid, like.device, like.dtype)
        if key not in self._pos_embeds:
            self._pos_embeds[key] = self.vit.pos_embed_for_grid(grid).detach()  # fixed: nothing to learn in it
        return self._pos_embeds[key]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit(images, pos_embed=self.pos_embed_for(images))  # through __call__: the ViT's hooks still run

    def forward_features(self, images: torch.Tensor, **options) -> torch.Tensor:
        return self.vit.forward_features(images, pos_embed=self.pos_embed_for(images), **options)

    def forward_intermediates(self, images: torch.Tensor, indices=None, **options):
        return self.vit.forward_intermediates(images, indices, pos_embed=self.pos_embed_for(images), **options)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, **options):
        return self.vit.forward_head(x, pre_logits, **options)
