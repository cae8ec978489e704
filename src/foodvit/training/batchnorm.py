"""Batch norms in a training pass whose statistics must not count: sharpness-aware minimisation's
second pass (engine.py) and instance discrimination's second view (objectives/contrast.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def running_statistics_untouched(model: nn.Module) -> Iterator[None]:
    """Within the block the model's batch norms normalise with each batch's own statistics, as in any
    training pass, and leave their running statistics (and batch count) as they are: nothing is
    written, so an earlier pass's saved tensors stay valid for the backward pass."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    for norm in norms:
        norm.track_running_stats = False  # read by _BatchNorm.forward: no running statistics passed, none updated
    try:
        yield
    finally:
        for norm in norms:
            norm.track_running_stats = True
