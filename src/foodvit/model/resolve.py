"""A run's settings resolved from a recipe: the one path that `foodvit train`, `cv`, `tune`, the
notebook, bench and `foodvit.train` take.

Resolution order: dataclass defaults < recipe (a built-in name or a TOML file) < overrides
("section.name" -> value) < what pre-trained weights dictate (model/pretrained.py). A from-scratch
recipe used with pre-trained weights keeps only its regularisation (TRANSFER_KEEPS) and turns its
self-supervision off (TRANSFER_OFF) unless given; its progressive resizing goes with the model it was
set for (variants.without_recipe_resizing). No PyTorch here unless pre-trained weights are named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from foodvit.model.variants import without_recipe_resizing
from foodvit.recipes import load_recipe
from foodvit.settings.layout import current_names
from foodvit.settings.model import VitSettings
from foodvit.settings.objectives import OBJECTIVES
from foodvit.settings.overrides import apply_overrides, with_settings
from foodvit.settings.run import DEFAULT_RECIPE, RunConfig

# Regularisation settings a from-scratch recipe keeps when it is used with pre-trained weights: its
# other model settings (size, pooling, 96 px ...) are not meant for the weights, nor is its
# progressive resizing (variants.without_recipe_resizing).
TRANSFER_KEEPS = ("dropout", "attn_dropout", "drop_path")
# Training settings of a from-scratch recipe that are off with pre-trained weights unless given: masked-patch
# reconstruction is self-supervision for a model that starts from nothing, and it reads every output token,
# which the weights' class-token model does not compute in its last block (its pixel hiding goes with it).
TRANSFER_OFF = {"masked.weight": 0.0, "masked.pixels": False}


def with_objectives_off(given: dict[str, Any]) -> dict[str, Any]:
    """An objective turned off by its weight (`--guidance 0`) takes its dependent settings off with it unless they
    are given too: a recipe's `guidance.schedule = "linear"` means something only with guidance on, so it must not
    stop the user who turns guidance off from the command line."""
    out = dict(given)
    for objective in OBJECTIVES:
        weight = given.get(objective.weight_key)
        if weight is None or float(weight) > 0:
            continue
        for dependent in objective.dependents:
            if out.get(dependent.key) is None:
                out[dependent.key] = dependent.off
    return out


def resolve(
    recipe: str = DEFAULT_RECIPE,
    overrides: Mapping[str, Any] | None = None,
    *,
    model: str | None = None,
    pretrained: str | None = None,
) -> RunConfig:
    """A run's settings: the recipe, then the overrides, then, with pre-trained weights (`pretrained`, or
    "train.pretrained" among the overrides or in the recipe), the model that the weights dictate
    (pretrained.adapt_config; a `model` that disagrees stops the run)."""
    given = with_objectives_off(current_names(overrides or {}))
    given.update({"train.pretrained": pretrained} if pretrained else {})
    base = load_recipe(recipe)
    config = without_recipe_resizing(base, apply_overrides(base, given, model=model), given)
    if config.train.pretrained and not base.train.pretrained:
        kept = {k: v for k, v in base.vit.given().items() if k in TRANSFER_KEEPS}
        asked = {k[4:]: v for k, v in given.items() if k.startswith("vit.") and v is not None}
        config = replace(config, vit=VitSettings(**{**kept, **asked}))
        config = with_settings(config, {k: v for k, v in TRANSFER_OFF.items() if given.get(k) is None})
    if config.train.pretrained:
        from foodvit.model.pretrained import adapt_config  # reads the weights' description (PyTorch)

        config = adapt_config(config, explicit_model=model)
    return config
