"""The settings' fields: the range a number must lie in (Range, and the ranges used most, named once), a
dataclass field that carries its command-line help, flag name, choices and range (`opt`), and the checks that
read them. Every section of the settings declares its fields with it; cli/options.py generates one option per
field from the same metadata, and the command line's own numbers are checked against the same ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from foodvit.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """The allowed values of a number: lo <= x <= hi, either end open or absent; never NaN or an
    infinity (no setting means either). hint: what to do instead, added to the message."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    hint: str = ""

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return False
        return True

    def __str__(self) -> str:
        if self.lo is None and self.hi is None:
            return "a finite number"
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


# the ranges used most, named once
AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
SHARE = Range(0, 1)  # a probability or a share, ends included
SHARE_BELOW_1 = Range(0, 1, hi_open=True)
SHARE_ABOVE_0 = Range(0, 1, lo_open=True)
# an image's side in pixels, for the model, its test, its first epochs and its CNN teacher: memory grows with the
# side's square (100000 px would be a 120 GB position embedding), and photos are decoded at about 1024 px at least
MAX_SIDE = 1024
SIDE_HINT = "memory grows with the side's square (the paper trains at 224 px and fine-tunes at 384)"
SIDE = Range(1, MAX_SIDE, hint=SIDE_HINT)
SIDE_OR_0 = Range(0, MAX_SIDE, hint=SIDE_HINT)


def check_value(flag: str, value, allowed: Range) -> None:
    """A ConfigError unless every number in value (a number or a tuple of them) is in range."""
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            what = "a finite number" if allowed.lo is None and allowed.hi is None else f"a number {allowed}"
            raise ConfigError(f"{flag} must be {what}, got {v!r}")
        if v not in allowed:
            raise ConfigError(f"{flag} must be {allowed}, got {v:g}" + (f"; {allowed.hint}" if allowed.hint else ""))


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


# what a field of each plain type takes, by its annotation's text, and those words for a message
KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str": ((str,), "text"),
}


def check_kind(f, value) -> None:
    """A ConfigError unless value is of the field's plain type (int, float, bool, str; None where it may be), or a
    list of them for a tuple's: a recipe's `epochs = 1.5` or `betas = 0.9` is refused here rather than failing deep in
    training."""
    kind = f.type.removesuffix(" | None") if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    if kind.startswith("tuple[") and not isinstance(value, (tuple, list)):  # its numbers are checked by its range
        raise ConfigError(f"{flag_of(f)} must be a list of numbers ([a, b, ...]), got {value!r}")
    if kind not in KINDS or (value is None and f.type != kind):
        return
    types, words = KINDS[kind]
    if not isinstance(value, types) or (isinstance(value, bool) and kind != "bool"):
        raise ConfigError(f"{flag_of(f)} must be {words}, got {value!r}")


def check_field(f, value) -> None:
    """A ConfigError unless value is of the field's type, lies in its range and among its choices (its metadata)."""
    check_kind(f, value)
    if f.metadata.get("range") is not None:
        check_value(flag_of(f), value, f.metadata["range"])
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{flag_of(f)} must be one of {', '.join(choices)}, got {value!r}")


def check_fields(settings) -> None:
    """check_field for every field of a settings dataclass."""
    for f in fields(settings):
        check_field(f, getattr(settings, f.name))


T = TypeVar("T", bound=type)


def generated_fields(new: Iterable[tuple[str, Any, Any]], after: str | None = None) -> Callable[[T], T]:
    """A class decorator, written under @dataclass, that adds fields generated from a table rather than written out
    a second time: (name, type or its text, default or field()) each, after the field `after` (at the end without
    one). Type checkers see only the fields written in the class."""

    def add(cls: T) -> T:
        written = dict(cls.__dict__.get("__annotations__", {}))
        new_fields = list(new)
        at = list(written).index(after) + 1 if after is not None else len(written)
        items = list(written.items())
        cls.__annotations__ = dict(items[:at] + [(name, kind) for name, kind, _ in new_fields] + items[at:])
        for name, _, default in new_fields:
            setattr(cls, name, default)
        return cls

    return add
