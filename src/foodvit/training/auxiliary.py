"""The auxiliary losses of a run, wired in one place: which wrap the model, in which order, which
need the CNN teacher, and what of theirs a checkpoint keeps.

Each loss is a wrapper whose training-mode forward returns (logits, auxiliary loss) and whose
forward_heads gives the heads with the auxiliary loss so far (heads.HeadsAndLoss), so they stack:

    ViT (or AnyGrid) -> dense relative localization -> masked patches -> locality guidance -> distillation
        -> instance discrimination (whose second view goes through the bare ViT, outside the others)

The saved model is the ViT alone; these parts live only while training (and in checkpoint.pt, so
a resumed run ends exactly as an uninterrupted one would). None of them can train a frozen backbone.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from foodvit.config import OptimConfig
from foodvit.errors import ConfigError
from foodvit.training.contrast import WithInstanceDiscrimination
from foodvit.training.distill import WithDistillation, teacher_skeleton
from foodvit.training.drloc import WithDenseRelativeLocalization
from foodvit.training.guidance import WithLocalityGuidance
from foodvit.training.heads import innermost_vit
from foodvit.training.masked import WithMaskedPatches


# The losses with trained parts of their own: (Auxiliaries field, checkpoint.pt key, the wrapper's part).
PARTS = (("localization", "auxiliary", "drloc"), ("guide", "guidance", "adapters"), ("masked", "masked", "reconstruction"),
         ("contrast", "contrast", "projection"))


@dataclass
class Auxiliaries:
    trained: nn.Module  # what the optimiser steps: the model inside every wrapper that is on
    localization: WithDenseRelativeLocalization | None = None
    masked: WithMaskedPatches | None = None
    guide: WithLocalityGuidance | None = None
    distiller: WithDistillation | None = None
    contrast: WithInstanceDiscrimination | None = None

    @property
    def need_teacher(self) -> bool:
        return self.guide is not None or self.distiller is not None

    def set_teacher(self, teacher: nn.Module) -> None:
        """One CNN for both: its labels to distil, its feature maps to guide."""
        for wrapper in (self.guide, self.distiller):
            if wrapper is not None:
                wrapper.set_teacher(teacher)

    def state_dict(self) -> dict:
        """Their own trained parts, for checkpoint.pt (None for a loss that is off)."""
        return {key: getattr(getattr(self, name), part).state_dict() if getattr(self, name) else None for name, key, part in PARTS}

    def load_state_dict(self, state: dict) -> None:
        for name, key, part in PARTS:
            if getattr(self, name) is not None:
                getattr(getattr(self, name), part).load_state_dict(state[key])


def wrap(model: nn.Module, optim: OptimConfig, num_classes: int, frozen: bool = False) -> Auxiliaries:
    """The model wrapped for the auxiliary losses the settings turn on (none with a frozen backbone)."""
    aux = Auxiliaries(model)
    if frozen:
        return aux
    if optim.drloc > 0:
        aux.trained = aux.localization = WithDenseRelativeLocalization(aux.trained, optim.drloc, optim.drloc_pairs)
    if optim.masked > 0:
        if optim.mask_pixels and innermost_vit(model).config.stem == "patch":
            raise ConfigError("--mask-pixels changes nothing with --stem patch, whose tokens each see their own patch alone "
                              "(the mask token already hides it): use --stem conv or spt, or leave --mask-pixels out")
        aux.trained = aux.masked = WithMaskedPatches(aux.trained, optim.masked, optim.mask_ratio, hide_pixels=optim.mask_pixels)
    if optim.guidance > 0:  # its teacher, like distillation's, is trained when the run starts fitting
        aux.trained = aux.guide = WithLocalityGuidance(aux.trained, optim.guidance, teacher_skeleton(optim.teacher, num_classes),
                                                           optim.guidance_stages)
    if optim.distill > 0:
        aux.trained = aux.distiller = WithDistillation(aux.trained, optim.distill, temperature=optim.distill_temperature)
    if optim.contrast > 0:
        aux.trained = aux.contrast = WithInstanceDiscrimination(aux.trained, optim.contrast, optim.contrast_temperature)
    return aux
