"""What the auxiliary losses' wrappers share (drloc, masked, guidance, distill, contrast; wired by auxiliary.py).

Each wraps the model it trains, its student (a VisionTransformer, the progressive-resizing AnyGrid
around one, or another wrapper), and adds one term to the loss. forward_heads(images) gives the
student's heads with every term so far (HeadsAndLoss), so the wrappers stack; forward gives
(logits, auxiliary loss) in training mode, as the engine expects, and the student's own prediction
in eval mode: the saved model is the ViT alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from foodvit.model.vit import Heads


@dataclass(frozen=True)
class HeadsAndLoss(Heads):
    """The ViT's heads and the auxiliary losses the wrappers added, weighted and summed (a scalar)."""

    auxiliary: torch.Tensor


def loss_so_far(heads: Heads) -> torch.Tensor | float:
    """The auxiliary losses of the wrappers inside this one (0 for a bare ViT's heads)."""
    return heads.auxiliary if isinstance(heads, HeadsAndLoss) else 0.0


def innermost_vit(module: nn.Module) -> nn.Module:
    """The VisionTransformer inside the training wrappers: each auxiliary loss holds its student as
    .student, progressive resizing's AnyGrid its ViT as .vit."""
    while hasattr(module, "student") or hasattr(module, "vit"):
        module = module.student if hasattr(module, "student") else module.vit
    return module


def bare_student(module: nn.Module) -> nn.Module:
    """The model inside every auxiliary loss's wrapper: the ViT, or progressive resizing's AnyGrid around it."""
    while isinstance(module, AuxiliaryLoss):
        module = module.student
    return module


class AuxiliaryLoss(nn.Module):
    """A student trained with one more loss term, weight x the term that forward_heads adds."""

    def __init__(self, student: nn.Module, weight: float) -> None:
        super().__init__()
        self.student, self.weight = student, weight

    def forward(self, images: torch.Tensor):
        if not self.training:
            return self.student(images)
        out = self.forward_heads(images)
        return out.logits, out.auxiliary

    def forward_heads(self, images: torch.Tensor) -> HeadsAndLoss:
        raise NotImplementedError

    def student_heads(self, images: torch.Tensor, hooks=()) -> Heads:
        """The student's heads, with forward hooks [(module, hook), ...] on its modules for this pass only."""
        handles = [module.register_forward_hook(hook) for module, hook in hooks]
        try:
            return self.student.forward_heads(images)
        finally:
            for handle in handles:
                handle.remove()


class TaughtLoss(AuxiliaryLoss):
    """An auxiliary loss that reads a frozen CNN teacher. The teacher is held outside the module's
    parameters: the optimiser, DistributedDataParallel and the checkpoint never see it."""

    def __init__(self, student: nn.Module, weight: float, teacher: nn.Module | None = None) -> None:
        super().__init__(student, weight)
        self.set_teacher(teacher)

    def set_teacher(self, teacher: nn.Module | None) -> None:
        if teacher is not None:
            teacher.eval().requires_grad_(False)  # batch-norm statistics stay as trained
        object.__setattr__(self, "teacher", teacher)  # not a submodule: not trained, not saved with the student

    def trained_teacher(self) -> nn.Module:
        if self.teacher is None:
            raise RuntimeError(f"{type(self).__name__} needs its teacher before training (set_teacher)")
        return self.teacher
