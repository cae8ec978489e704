import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Read once, before any test's monkeypatching of the environment.
REAL_DATA = os.environ.get("FOODVIT_DATA")


@pytest.fixture
def real_data() -> Path:
    """The FoodVision Mini folder, when FOODVIT_DATA names it (set by .ci/run)."""
    path = REAL_DATA
    if not path or not (Path(path) / "train").is_dir():
        pytest.skip("FOODVIT_DATA does not name a FoodVision Mini folder")
    return Path(path)
