"""The training objectives beside the classes, one module each, and their registry.

An objective (base.Objective) names its line of the settings' registry (settings.objectives.OBJECTIVES: its
section of the settings, whether it reads the CNN teacher, the settings that need it on), the part of it
checkpoint.pt keeps, how it is built, its weight at an epoch and its loss. The settings' table is the one list
of objectives: REGISTRY maps each of its names to the Objective of the module named after it, in its order, and
everything else is derived from them: which objectives a run builds (build), the trainer's sum
(compose.WithObjectives), the checkpoint's keys, whether a run trains a CNN teacher and which settings that teacher
depends on (training/teacher.py), and tune's refusal of a search space that needs an objective off
(tuning/space.py). Adding an objective: its settings section and its line in settings/objectives.py, and its
module here, named after its section, with one Objective whose `settings` is that line.

    drloc     dense relative localization (Liu et al. 2021)        objectives/drloc.py
    masked    masked-patch reconstruction (SimMIM-style)           objectives/masked.py
    guidance  locality guidance from the CNN teacher (Li et al.)   objectives/guidance.py
    distill   distillation from the CNN teacher (DeiT)             objectives/distill.py
    contrast  instance discrimination (SimCLR's NT-Xent)           objectives/contrast.py

The saved model is the ViT alone; the objectives live only while training (and in checkpoint.pt,
so a resumed run ends exactly as an uninterrupted one would). None trains a frozen backbone.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from foodvit.settings.objectives import OBJECTIVES, ObjectiveSettings
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Computing, Objective
from foodvit.training.objectives.compose import WithObjectives

Registry = Mapping[str, type[Objective]]


def objective_of(line: ObjectiveSettings) -> type[Objective]:
    """The Objective of a line of the settings' registry: the one class of the module named after its section
    whose `settings` is that line."""
    module = importlib.import_module(f"{__name__}.{line.name}")
    found = [
        kind
        for kind in vars(module).values()
        if isinstance(kind, type) and issubclass(kind, Objective) and kind.__dict__.get("settings") is line
    ]
    if len(found) != 1:
        raise ImportError(
            f"{module.__name__} holds {len(found)} Objectives whose settings are the {line.name!r} line of OBJECTIVES; "
            "it should hold one"
        )
    return found[0]


# Every objective by its name, in the settings' order: the order their parts are built and their terms drawn and added.
REGISTRY: Registry = {line.name: objective_of(line) for line in OBJECTIVES}

__all__ = ["REGISTRY", "build", "checkpoint_keys", "objective_of"]


def build(
    model: Computing,
    config: RunConfig,
    num_classes: int,
    frozen: bool = False,
    registry: Registry | None = None,
) -> WithObjectives:
    """The model with the objectives the settings turn on (none with a frozen backbone), each built in
    the registry's order (their parameters drawn in that order)."""
    kinds = list((REGISTRY if registry is None else registry).values())
    on = [] if frozen else [kind.build(model, config, num_classes) for kind in kinds if kind.enabled(config)]
    return WithObjectives(model, on, order=kinds)


def checkpoint_keys(registry: Registry | None = None) -> tuple[str, ...]:
    """The keys under which checkpoint.pt keeps the objectives' parts (None for an objective that is off)."""
    kinds = (REGISTRY if registry is None else registry).values()
    return tuple(kind.checkpoint_key for kind in kinds if kind.checkpoint_key)
