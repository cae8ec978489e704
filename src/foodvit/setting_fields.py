"""The settings' fields: a dataclass field that carries its command-line help, flag name, choices and
range (`opt`), and the checks that read them. foodvit.config and foodvit.vit_settings declare their
fields with it; cli/options.py generates one option per field from the same metadata. No PyTorch here.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from foodvit.errors import ConfigError, Range, check_value


def opt(
    default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None, range: Range | None = None
) -> Any:
    """A settings field with its command-line help, and optionally a flag name, its choices and
    the range its number(s) must lie in."""
    meta = {"help": help, "flag": flag, "choices": choices, "range": range}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(f) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def check_field(f, value) -> None:
    """A ConfigError unless value lies in the field's range and among its choices (its metadata)."""
    if f.metadata.get("range") is not None:
        check_value(flag_of(f), value, f.metadata["range"])
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{flag_of(f)} must be one of {', '.join(choices)}, got {value!r}")


def check_fields(settings) -> None:
    """check_field for every field of a settings dataclass."""
    for f in fields(settings):
        check_field(f, getattr(settings, f.name))
