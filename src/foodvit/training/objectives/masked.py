"""Masked-patch reconstruction as an auxiliary loss during supervised training (self-supervision on
the same photos, in the manner of SimMIM, Xie et al. 2022, and of masked autoencoding used as an
auxiliary task, Das et al. 2023, arXiv 2310.20704).

With --masked W, in training a share --mask-ratio of each image's patches is hidden: their
embeddings x_p^i E are replaced by one learned mask token before the position embedding is added
(so the position stays known, the content does not). The ViT classifies the image as it is shown,
and a linear decoder reads each hidden patch's output token and predicts that patch's pixels,
each patch normalised to zero mean and unit variance (MAE's normalised-pixel target):

    loss = CE(student(masked x), y) + W x mean over hidden patches of || decoder(z_L^i) - norm(x_p^i) ||^2

To fill a hole from its neighbours the tokens must carry what lies around them: local structure a
ViT otherwise learns only from large data. The hiding also acts as an augmentation. (With
--stem spt a neighbour's token also holds half-patch shifted copies of a hidden patch's pixels,
and a conv stem's receptive fields overlap: the holes are then partly visible and the task easier,
unless --mask-pixels sets their pixels to 0 before the tokeniser.) One forward
pass, as cheap as plain training. Training only: the saved model is the plain ViT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.errors import ConfigError
from foodvit.model.vit import VisionTransformer
from foodvit.settings.objectives import OBJECTIVE_SETTINGS
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs, vit_of


def patch_pixels(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C P^2), patches in the token order, each normalised over its pixels."""
    B, C, H, W = images.shape
    P = patch_size
    patches = (
        images.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // P) * (W // P), C * P * P)
    )
    centred = patches - patches.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-6)


def draw_mask(batch: int, patches: int, ratio: float, device: torch.device) -> torch.Tensor:
    """(B, N) booleans, exactly round(ratio x N) True (hidden) per image, at random positions."""
    hidden = round(ratio * patches)
    order = torch.rand(batch, patches, device=device).argsort(dim=1)
    return order < hidden  # the positions whose random rank falls among the first `hidden`


class Reconstruction(nn.Module):
    """The auxiliary task's own parameters: the mask token and the linear pixel decoder."""

    def __init__(self, embed_dim: int, patch_pixels: int) -> None:
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        self.decoder = nn.Linear(embed_dim, patch_pixels)

    def no_weight_decay(self) -> set[str]:
        return {"mask_token"}


def check_reconstructable(pool: str, option: str) -> None:
    """Reconstruction reads every patch's output token, which a class-token model's last block does not compute."""
    if pool == "cls":
        raise ConfigError(
            f"{option} reconstructs each hidden patch from its output token, which a class-token model's "
            "last block does not compute: use --pool gap or --pool seq"
        )


def hide_pixels(images: torch.Tensor, hidden: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The images with the hidden patches' pixels set to 0 (the mean of normalised photos)."""
    B, _, H, W = images.shape
    shown = ~hidden.reshape(B, 1, H // patch_size, W // patch_size)
    return images * shown.repeat_interleave(patch_size, dim=-2).repeat_interleave(patch_size, dim=-1)


class MaskedPatches(Objective):
    """Masked-patch reconstruction: before the forward pass a share `ratio` of each image's patches
    is drawn to be shown as the mask token; the term is the decoder's error on their pixels. With
    hide_pixels (--mask-pixels; always in pre-training, pretrain.py) their pixels are also set to 0
    before the tokeniser, so that a stem whose receptive fields overlap (--stem conv, --stem spt)
    cannot show them to their neighbours' tokens. checkpoint.pt keeps the mask token and the
    decoder under "masked"."""

    settings = OBJECTIVE_SETTINGS["masked"]
    checkpoint_key = "masked"
    reads_all_tokens = True

    def __init__(
        self, vit: VisionTransformer, weight: float, ratio: float, hide_pixels: bool = False, option: str = "--masked"
    ) -> None:
        check_reconstructable(vit.config.pool, option)
        super().__init__(weight)
        self.ratio, self.hide_pixels = ratio, hide_pixels
        c = vit.config
        self.reconstruction = Reconstruction(c.embed_dim, c.in_channels * c.patch_size**2)

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> MaskedPatches:
        vit = vit_of(model)
        if config.masked.pixels and vit.config.stem == "patch":
            raise ConfigError(
                "--mask-pixels changes nothing with --stem patch, whose tokens each see their own patch alone "
                "(the mask token already hides it): use --stem conv or spt, or leave --mask-pixels out"
            )
        return cls(vit, config.masked.weight, config.masked.ratio, hide_pixels=config.masked.pixels)

    @property
    def part(self) -> nn.Module:
        return self.reconstruction

    def prepare(self, batch: Batch) -> None:
        P = vit_of(batch.model).config.patch_size
        images = batch.images
        batch.mask = draw_mask(
            images.shape[0], (images.shape[-2] // P) * (images.shape[-1] // P), self.ratio, images.device
        )
        batch.mask_token = self.reconstruction.mask_token
        if self.hide_pixels:
            batch.shown = hide_pixels(batch.shown, batch.mask, P)

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        c = vit_of(batch.model).config
        hidden = batch.mask
        # (hidden patches, C P^2)
        predicted = self.reconstruction.decoder(outputs.tokens[:, c.num_prefix_tokens :][hidden])
        target = patch_pixels(batch.images, c.patch_size)[hidden]
        # the mean over the hidden pixels, as a sum over their count: an empty share of a batch gives 0
        return F.mse_loss(predicted.float(), target.float(), reduction="sum") / max(1, predicted.numel())
