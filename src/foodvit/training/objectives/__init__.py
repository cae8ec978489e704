"""The training objectives beside the classes, one module each, and their registry.

An objective (base.Objective) names its settings (objective_settings.OBJECTIVES: its section of the settings,
whether it reads the CNN teacher, the settings that need it on), the part of it checkpoint.pt
keeps, how it is built, its weight at an epoch and its loss. Everything else is derived from
REGISTRY: which objectives a run builds (build), the trainer's sum (compose.WithObjectives), the
checkpoint's keys, whether a run trains a CNN teacher and which settings that teacher depends on
(training/teacher.py), and tune's refusal of a search space that needs an objective off
(tuning/space.py). Adding an objective: its module here and one line in REGISTRY (and, in
objective_settings.py, its settings section and registry line).

    drloc     dense relative localization (Liu et al. 2021)        objectives/drloc.py
    masked    masked-patch reconstruction (SimMIM-style)           objectives/masked.py
    guidance  locality guidance from the CNN teacher (Li et al.)   objectives/guidance.py
    distill   distillation from the CNN teacher (DeiT)             objectives/distill.py
    contrast  instance discrimination (SimCLR's NT-Xent)           objectives/contrast.py

The saved model is the ViT alone; the objectives live only while training (and in checkpoint.pt,
so a resumed run ends exactly as an uninterrupted one would). None trains a frozen backbone.
"""

from __future__ import annotations

from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.contrast import InstanceDiscrimination
from foodvit.training.objectives.distill import Distillation
from foodvit.training.objectives.drloc import Localization
from foodvit.training.objectives.guidance import LocalityGuidance
from foodvit.training.objectives.masked import MaskedPatches

# Every objective, in the order their terms are drawn and added.
REGISTRY: tuple[type[Objective], ...] = (
    Localization,
    MaskedPatches,
    LocalityGuidance,
    Distillation,
    InstanceDiscrimination,
)

__all__ = ["REGISTRY", "Batch", "Objective", "Outputs", "WithObjectives", "build", "checkpoint_keys"]


def build(
    model: Computing,
    config: RunConfig,
    num_classes: int,
    frozen: bool = False,
    registry: tuple[type[Objective], ...] | None = None,
) -> WithObjectives:
    """The model with the objectives the settings turn on (none with a frozen backbone), each built in
    the registry's order (their parameters drawn in that order)."""
    registry = REGISTRY if registry is None else registry
    on = [] if frozen else [kind.build(model, config, num_classes) for kind in registry if kind.enabled(config)]
    return WithObjectives(model, on, order=registry)


def checkpoint_keys(registry: tuple[type[Objective], ...] | None = None) -> tuple[str, ...]:
    """The keys under which checkpoint.pt keeps the objectives' parts (None for an objective that is off)."""
    return tuple(kind.checkpoint_key for kind in (REGISTRY if registry is None else registry) if kind.checkpoint_key)
