"""The flat layout of settings: a run directory's config.json, a study, a recipe, a search space or an override may
name the training objectives', the CNN teacher's and the pre-training's settings inside the optimiser's section. One
table (MOVED) maps each flat name to its sectioned one; foodvit.settings.run reads every stored setting through it. No
PyTorch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from foodvit.errors import ConfigError

# Each setting the flat layout names inside the optimiser's section -> its key in a section of its own. Run
# directories, studies, recipes, search spaces and overrides written in the flat layout are read through this table;
# the command line's options keep the flat names (each field's flag).
MOVED = {
    "optim.drloc": "drloc.weight",
    "optim.drloc_pairs": "drloc.pairs",
    "optim.masked": "masked.weight",
    "optim.mask_ratio": "masked.ratio",
    "optim.mask_pixels": "masked.pixels",
    "optim.guidance": "guidance.weight",
    "optim.guidance_schedule": "guidance.schedule",
    "optim.guidance_stages": "guidance.stages",
    "optim.distill": "distill.weight",
    "optim.distill_temperature": "distill.temperature",
    "optim.contrast": "contrast.weight",
    "optim.contrast_temperature": "contrast.temperature",
    "optim.pretrain_epochs": "pretrain.epochs",
    "optim.pretrain_mask_ratio": "pretrain.mask_ratio",
    "optim.teacher": "teacher.architecture",
    "optim.teacher_epochs": "teacher.epochs",
    "optim.teacher_size": "teacher.size",
}


def setting_key(key: str) -> str:
    """A setting's "section.name" in the sectioned layout ("optim.drloc" -> "drloc.weight")."""
    return MOVED.get(key, key)


def _one_setting(where: str, old: str, value: object, new: str, other: object) -> ConfigError:
    return ConfigError(f"{where}{old} = {value!r} and {new} = {other!r} are one setting; remove {old}")


def current_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings named "section.name" (the command line's overrides), flat-layout names under their sections' (MOVED),
    None values being settings not given; a setting given under both names with two values is refused."""
    named: dict[str, Any] = {}
    for key, value in sorted(values.items(), key=lambda item: setting_key(item[0]) != item[0]):  # sectioned first
        new = setting_key(key)
        if value is not None and named.get(new) is not None and named[new] != value:
            raise _one_setting("", key, value, new, named[new])
        if value is not None:
            named[new] = value
    return named


def current_layout(d: dict, where: str = "settings") -> dict:
    """Settings (config.json's, a recipe's) with every setting of the flat layout in its section (MOVED); a
    setting given in both layouts with two values is refused."""
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for old, new in MOVED.items():
        section, _, name = old.partition(".")
        if not isinstance(d.get(section), dict) or name not in d[section]:
            continue
        value = d[section].pop(name)
        to, _, key = new.partition(".")
        target = d.setdefault(to, {})
        if isinstance(target, dict):
            if key in target and target[key] != value:
                raise _one_setting(f"{where}: ", old, value, new, target[key])
            target.setdefault(key, value)
    return d
