"""Errors a user can act on, and the range checks behind the settings' messages.

Every error that a person can fix (a wrong option, a bad photo, a run directory that cannot be
used as asked) is a FoodVitError: the command line prints its message on one line and exits 2.
Anything else is a bug and keeps its traceback. This module imports nothing heavy, so that the
settings (config.py) and the command line can use it without loading PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class FoodVitError(Exception):
    """An error with a message that says what was expected and what to do."""


class OutputError(FoodVitError):
    """Standard output refuses what a command writes to it (a full disk behind `> file`, /dev/full)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a scheduler or service manager stopping a command), where a command handles it as ctrl-C: its
    work stops as for ctrl-C, and the command ends as interrupted, with SIGTERM's exit status (143)."""


class ConfigError(FoodVitError, ValueError):
    """A setting out of its range or of the wrong kind."""


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
            raise ConfigError(f"{flag} must be a number {allowed}, got {v!r}")
        if v not in allowed:
            raise ConfigError(f"{flag} must be {allowed}, got {v:g}" + (f"; {allowed.hint}" if allowed.hint else ""))


class InputError(FoodVitError, ValueError):
    """Input the model or a file reader cannot take as it is: a tensor of the wrong shape, weights
    of another layout or size."""


class RunError(FoodVitError, ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


class DataError(FoodVitError, ValueError):
    """A data source or photo that cannot be used as it is; the message says what to do."""


class StudyError(FoodVitError, ValueError):
    """A cross-validation or tuning study that cannot be used as asked (another data set or space
    in its folder, a budget too small for one fold); the message says what to do."""
