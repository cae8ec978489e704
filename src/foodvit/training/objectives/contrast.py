"""Instance discrimination as an auxiliary loss during supervised training (self-supervision on the
same photos: SimCLR's contrastive loss, Chen et al. 2020, used beside the classes as the small-data
literature's self-supervised recipes suggest: Gani et al. 2022, arXiv 2210.07240; Cao et al. 2022,
arXiv 2201.10728).

With --contrast W, each training batch x is shown twice: as the loader gives it (the view the
classifier and every other auxiliary loss read, so with --masked its patches partly hidden) and as a
second view drawn from it on the device, a random resized crop of the whole batch image, flipped at
random and its colours distorted (second_view), that no other loss reads. A conv stem's batch norms
normalise it with its own statistics but keep the running ones of the first view alone. Both go through
the ViT; a small projection MLP g maps each pooled state (Eq. 4's z_L^0, or deviation 1's or 6's
pooled tokens) to z, and the loss asks each photo's two z to be nearer to each other than to any
other photo's, of either view (NT-Xent over the 2B views, temperature T = --contrast-temperature):

    loss = CE(student(x), y) + W x mean over the 2B views i of -log softmax_j(cos(z_i, z_j) / T)[pair(i)]

To tell a photo from every other in the batch by what survives cropping and recolouring, the
pooled state must carry what the photo shows rather than only which class it is: the features that
the self-supervised papers find a ViT lacks on small data. The classes are not read by this term
(the cross-entropy has them). It costs a second forward and backward pass of the ViT per step.
Training only: the projection is not part of the saved model.

Where this differs from SimCLR: the second view is drawn from the first, already augmented, batch on
the device (the loader keeps one view a photo, so every other loss is unchanged), the colour
distortion is an affine change of the normalised channels (contrast, a shift per channel, grey at
random) in place of a jitter of hue and saturation, and the negatives are the other photos of each
process's share of the batch (of each micro-batch with --accum-steps; no gathering across processes),
so the term depends on how the batch is split, unlike the other losses; copies of one photo in a batch
(--repeated-aug) count as negatives of each other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.settings.objectives import CONTRAST_TEMPERATURE, OBJECTIVE_SETTINGS
from foodvit.settings.run import RunConfig
from foodvit.training.batchnorm import running_statistics_untouched
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs, vit_of

CROP_SCALE = (0.35, 1.0)  # the crop's share of the first view's area
CROP_RATIO = (3 / 4, 4 / 3)  # its width over its height
CONTRAST = (0.6, 1.4)  # a view's contrast factor around its mean
SHIFT = 0.3  # a channel's shift, in normalised units (a photo's standard deviations)
GREY = 0.2  # the probability that a view loses its colour


def draw_boxes(batch: int, height: int, width: int, scale=CROP_SCALE, ratio=CROP_RATIO) -> torch.Tensor:
    """(B, 4) integer boxes (top, left, height, width) inside a height x width image, each covering a
    share of its area drawn uniformly in `scale`, its aspect ratio log-uniform in `ratio` (clipped to the image)."""
    area = height * width * torch.empty(batch).uniform_(*scale)
    aspect = torch.exp(torch.empty(batch).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    h = torch.sqrt(area / aspect).round().clamp(1, height).long()
    w = torch.sqrt(area * aspect).round().clamp(1, width).long()
    top = (torch.rand(batch) * (height - h + 1)).long()
    left = (torch.rand(batch) * (width - w + 1)).long()
    return torch.stack([top, left, h, w], dim=1)


def crop_resize(images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Each image's box resized back to the batch's side (antialiased bilinear): (B, C, H, W) -> (B, C, H, W)."""
    size = images.shape[-2:]
    crops = [
        F.interpolate(
            image[None, :, t : t + h, left : left + w], size=size, mode="bilinear", antialias=True, align_corners=False
        )
        for image, (t, left, h, w) in zip(images, boxes.tolist(), strict=True)
    ]
    return torch.cat(crops) if crops else images.clone()


def distort_colours(
    images: torch.Tensor, contrast: torch.Tensor, shift: torch.Tensor, grey: torch.Tensor
) -> torch.Tensor:
    """Each image's channels stretched about its mean by contrast (B,), shifted by shift (B, C), and
    with grey (B,) True replaced by their mean over the channels."""
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    out = (images - mean) * contrast[:, None, None, None] + mean + shift[:, :, None, None]
    return torch.where(grey[:, None, None, None], out.mean(dim=1, keepdim=True).expand_as(out), out)


def second_view(images: torch.Tensor) -> torch.Tensor:
    """Another view of each image of the batch: a random resized crop, flipped half the time, its
    colours distorted; drawn from PyTorch's random streams (the run's seed repeats it): the boxes on
    the CPU, where their sizes are read, the rest on the images' device (no wait for it)."""
    B, C, H, W = images.shape
    device = images.device
    view = crop_resize(images, draw_boxes(B, H, W))
    flip = torch.rand(B, device=device) < 0.5
    view = torch.where(flip[:, None, None, None], view.flip(-1), view)
    contrast = torch.empty(B, device=device).uniform_(*CONTRAST).to(images.dtype)
    shift = torch.empty(B, C, device=device).uniform_(-SHIFT, SHIFT).to(images.dtype)
    return distort_colours(view, contrast, shift, torch.rand(B, device=device) < GREY)


def nt_xent(first: torch.Tensor, second: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's loss for B pairs (B, K), (B, K): for each of the 2B views, the cross-entropy of picking
    its pair among the other 2B - 1 by cosine similarity over the temperature; the mean over views (0 for no pairs)."""
    z = F.normalize(torch.cat([first, second]).float(), dim=1)
    n = z.shape[0]
    if n == 0:
        return z.sum()  # 0, still joined to the graph: an empty share of a batch takes part in the step
    similarity = (z @ z.T / temperature).masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
    pairs = torch.arange(n, device=z.device).roll(n // 2)  # view i's pair: i + B, and i - B for the second half
    return F.cross_entropy(similarity, pairs)


class Projection(nn.Module):
    """SimCLR's projection head g: the pooled state -> the vector the contrast compares (D -> 2D -> 128)."""

    def __init__(self, embed_dim: int, out_dim: int = 128) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 2 * embed_dim), nn.GELU(), nn.Linear(2 * embed_dim, out_dim))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp(pooled)


class InstanceDiscrimination(Objective):
    """Each photo told from the batch's others across two views: the pooled state of the forward pass
    and that of a second view, which goes through the model alone (the ViT, or AnyGrid around it),
    its batch norms' running statistics untouched. checkpoint.pt keeps the projection under "contrast"."""

    settings = OBJECTIVE_SETTINGS["contrast"]
    checkpoint_key = "contrast"

    def __init__(self, embed_dim: int, weight: float, temperature: float = CONTRAST_TEMPERATURE) -> None:
        super().__init__(weight)
        self.temperature = temperature
        self.projection = Projection(embed_dim)

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> InstanceDiscrimination:
        return cls(vit_of(model).config.embed_dim, config.contrast.weight, config.contrast.temperature)

    @property
    def part(self) -> nn.Module:
        return self.projection

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        # a conv stem's batch norms keep the statistics of the photos as shown
        with running_statistics_untouched(batch.model):
            tokens = batch.model.forward_features(second_view(batch.images))
        first = self.projection(outputs.heads.pooled)
        second = self.projection(batch.model.forward_head(tokens, pre_logits=True))
        return nt_xent(first, second, self.temperature)
