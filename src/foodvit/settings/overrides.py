"""A setting by its name, "section.name" (vit.depth, optim.lr, drloc.weight, ...), as the command line's
overrides, a search space, a tuning trial and a study name it: the field behind a name, a value checked as the
command line checks it, and a RunConfig with some settings replaced. A name of the flat layout (optim.drloc) is
read as its sectioned one (foodvit.settings.layout). No PyTorch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from foodvit.errors import ConfigError
from foodvit.settings.fields import check_field
from foodvit.settings.layout import current_names, setting_key
from foodvit.settings.model import VIT_OPTIONS
from foodvit.settings.run import SECTIONS, RunConfig


def setting_field(key: str):
    """The field behind a setting named "section.name" (vit.depth, optim.lr, drloc.weight, ..., or a name of the
    flat layout, MOVED), as the command line's overrides name them; a ConfigError for an unknown one, listing its
    section's names."""
    section, _, name = setting_key(key).partition(".")
    if section == "vit":
        known = {f.name: f for f in VIT_OPTIONS}
    elif section in SECTIONS:
        known = {f.name: f for f in fields(SECTIONS[section])}
    else:
        raise ConfigError(f"unknown setting {key!r}: the sections are vit, {', '.join(SECTIONS)}")
    if name not in known:
        raise ConfigError(f"unknown setting {key!r}; {section} has {', '.join(sorted(known))}")
    return known[name]


def check_setting(key: str, value) -> None:
    """A ConfigError unless value is allowed for the setting "section.name": the same range and
    choices check, and message, as the command line's."""
    check_field(setting_field(key), value)


def with_settings(config: RunConfig, values: dict) -> RunConfig:
    """config with the settings named "section.name" (vit.depth, optim.lr, drloc.weight, ..., or their old
    names, MOVED) replaced, each checked as the command line checks it (e.g. a tuning trial's sampled
    settings)."""
    sections: dict[str, dict[str, object]] = {name: {} for name in ("vit", *SECTIONS)}
    for key, value in values.items():
        check_setting(key, value)
        section, name = setting_key(key).split(".", 1)
        sections[section][name] = value
    return replace(config, **{name: replace(getattr(config, name), **changes) for name, changes in sections.items()})


def is_setting_key(key: str) -> bool:
    """Whether `key` names a setting as "section.name" ("vit.depth", "optim.lr", "drloc.weight", ...)."""
    return "." in key and key.split(".", 1)[0] in ("vit", *SECTIONS)


def apply_overrides(config: RunConfig, overrides: Mapping[str, Any], model: str | None = None) -> RunConfig:
    """`config` with every setting given: "section.name" -> value ("vit.depth", "optim.lr", ...); None
    values are not settings given, and a key that names no section is refused rather than ignored."""
    unknown = sorted(key for key, value in overrides.items() if value is not None and not is_setting_key(key))
    if unknown:
        raise ConfigError(
            f"unknown setting {', '.join(map(repr, unknown))}: overrides are 'section.name' with a section among "
            f"{', '.join(('vit', *SECTIONS))}, e.g. 'train.epochs' or 'optim.lr'"
        )
    return replace(with_settings(config, current_names(overrides)), model=model or config.model)
