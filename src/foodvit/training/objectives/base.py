"""What every training objective is, and what it reads.

An objective adds one weighted term to the loss a run minimises beside the classes' cross-entropy.
It may prepare the batch the ViT sees (masked patches hide some), ask the ViT's forward pass for
some blocks' patch tokens or for every final token, read the CNN teacher it holds (training/teacher.py,
given to it once trained), and keep trained parts of its own (a head, adapters, a mask token) that
checkpoint.pt keeps under its key. Its loss reads the step's outputs and adds nothing to another
objective's term: compose.py sums the terms, one forward pass of the ViT serving them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from foodvit.model.vit import Heads, VisionTransformer
from foodvit.settings.objectives import ObjectiveSettings
from foodvit.settings.run import RunConfig, objectives_on
from foodvit.training.resizing import AnyGrid
from foodvit.training.teacher import Teacher

# the model that computes a step: the ViT, or progressive resizing's AnyGrid around it
Computing = VisionTransformer | AnyGrid


@dataclass
class Batch:
    """A training batch as the objectives prepare it: the photos as loaded (images), what the ViT is
    shown (shown: the images, or with some pixels hidden), which patches it sees as a mask token
    (mask (B, N) and mask_token (D,)), and the model that computes (the ViT, or AnyGrid around it)."""

    images: torch.Tensor
    model: Computing
    shown: torch.Tensor = field(init=False)  # the images until an objective hides some pixels
    mask: torch.Tensor | None = None
    mask_token: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.shown = self.images


@dataclass
class Outputs:
    """One forward pass of the ViT on the batch as shown."""

    tokens: torch.Tensor  # (B, T, D) after the final norm (the prefix tokens alone when none reads the others)
    heads: Heads  # the pooled state (B, D) and each head's logits
    blocks: dict[int, torch.Tensor] = field(default_factory=dict)  # block index -> its patch tokens (B, D, g, g)


class Objective(nn.Module):
    """One term of the loss: weight_at(epoch, epochs) x loss(batch, outputs). Subclasses set the
    class attributes and build(); parts of their own are submodules, saved as `part`."""

    settings: ClassVar[ObjectiveSettings]  # its line of the registry (settings.objectives.OBJECTIVES)
    checkpoint_key: ClassVar[str | None] = None  # where checkpoint.pt keeps `part`; None: nothing of its own
    reads_all_tokens: ClassVar[bool] = False  # reads the final patch tokens (the last block computes all of them)
    # the CNN teacher, for an objective that reads one (settings.teacher): trained after the objective is built, and
    # given to it then (compose.WithObjectives.set_teacher). Not a submodule: never trained, moved or saved with it
    teacher: Teacher | None = None

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight
        self.blocks: tuple[int, ...] = ()  # the ViT blocks whose output tokens it reads

    @classmethod
    def name(cls) -> str:
        return cls.settings.name

    @classmethod
    def enabled(cls, config: RunConfig) -> bool:
        """Whether the settings turn it on (its weight above 0)."""
        return cls.settings in objectives_on(config)

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> Objective:
        """The objective for a model (the ViT, or AnyGrid around it), from its settings."""
        raise NotImplementedError

    @property
    def part(self) -> nn.Module | None:
        """Its trained parameters, saved in checkpoint.pt under checkpoint_key."""
        return None

    def weight_at(self, epoch: int, epochs: int) -> float:
        """The term's weight in epoch `epoch` (from 0) of `epochs`."""
        return self.weight

    def prepare(self, batch: Batch) -> None:
        """Change what the ViT is shown (before the forward pass); most objectives do nothing."""

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        """The unweighted term, a scalar (0 for a process's empty share of a batch)."""
        raise NotImplementedError

    def the_teacher(self) -> Teacher:
        """The CNN teacher it reads, once given."""
        if self.teacher is None:
            raise RuntimeError(f"{self.name()} reads the CNN teacher, which was not set (set_teacher)")
        return self.teacher


def vit_of(model: Computing) -> VisionTransformer:
    """The VisionTransformer a model computes with: itself, or progressive resizing's AnyGrid's."""
    return model.vit if isinstance(model, AnyGrid) else model
