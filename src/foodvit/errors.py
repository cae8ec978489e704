"""Errors a user can act on.

Every error that a person can fix (a wrong option, a bad photo, a run directory that cannot be
used as asked) is a FoodVitError: the command line prints its message on one line and exits 2.
Anything else is a bug and keeps its traceback. This module imports nothing heavy, so that the
settings (foodvit.settings) and the command line can use it without loading PyTorch.
"""

from __future__ import annotations


class FoodVitError(Exception):
    """An error with a message that says what was expected and what to do."""


class OutputError(FoodVitError):
    """Standard output refuses what a command writes to it (a full disk behind `> file`, /dev/full)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a scheduler or service manager stopping a command), where a command handles it as ctrl-C: its
    work stops as for ctrl-C, and the command ends as interrupted, with SIGTERM's exit status (143)."""


class ConfigError(FoodVitError, ValueError):
    """A setting out of its range or of the wrong kind."""


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
