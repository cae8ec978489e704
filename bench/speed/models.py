"""The benchmarks' models: a run folder (model.safetensors + model.json) of a named architecture with
random weights (speed does not depend on them), shared by deploy.py, predict.py and serve.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CLASSES = ["pizza", "steak", "sushi"]


def random_run(name: str, folder: Path) -> Path:
    """'default': the default recipe's model (ViT-Ti/8, 6 blocks, 96 px); any other name: that model
    (e.g. ViT-B/16) with the paper recipe's size and preprocessing, as a fine-tuning run would use.
    Three classes; the head drawn at random (the paper's zero head would make every logit 0, and
    the exports' parity checks empty)."""
    import torch

    from foodvit.model.build import build_model
    from foodvit.model.resolve import resolve
    from foodvit.rundir.trained import save_model

    torch.manual_seed(0)
    config = resolve("default") if name == "default" else resolve("paper", model=name)
    model, preprocess = build_model(config, num_classes=len(CLASSES))
    with torch.no_grad():
        model.head.weight.normal_(0, 0.02)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model.eval(), CLASSES, preprocess, {"metrics": {"recipe": f"{config.recipe} (random weights)"}})
    return folder


def in_work_folder(measure: Callable[[Path, list[str] | None], int], argv: list[str] | None = None) -> int:
    """measure(work, argv) with a temporary folder for its runs and files, removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        return measure(work, argv)
    finally:
        shutil.rmtree(work, ignore_errors=True)
