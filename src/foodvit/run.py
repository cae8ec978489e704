"""A run directory and what lives in it.

    config.json        the resolved RunConfig
    metrics.csv        one row per epoch
    checkpoint.pt      everything needed to resume (written atomically after every epoch)
    model.safetensors  the trained model's state dict (foodvit layout)
    model.json         beside it: model config, class names, preprocessing, final metrics
    curves.png, confusion.png, report.md
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path

import torch

from .model import ViTConfig, VisionTransformer
from .transforms import Preprocess

METRIC_COLUMNS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "test_loss", "test_acc", "lr", "seconds")


class RunError(ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


def atomic_write(path: Path, write) -> Path:
    """Call write(tmp_path), then rename over `path`: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_metrics(path: Path, history: list[dict]) -> Path:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for row in history:
                writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})

    return atomic_write(path, write)


def read_metrics(path: Path) -> list[dict]:
    with Path(path).open() as f:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()} for row in csv.DictReader(f)]


def save_checkpoint(path: Path, state: dict) -> Path:
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path} does not exist: nothing to resume (a run writes it after its first epoch)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise RunError(f"{path} is not a readable foodvit checkpoint ({type(err).__name__}: {err})") from err


def model_card(config: ViTConfig, classes, preprocess: Preprocess, extra: dict | None = None) -> dict:
    return {"format": "foodvit", "model": config.__dict__, "classes": list(classes), "preprocess": json.loads(preprocess.to_json()),
            **(extra or {})}


def save_model(run: Path, model: VisionTransformer, classes, preprocess: Preprocess, extra: dict | None = None) -> Path:
    """model.safetensors (the model's own state dict) and model.json beside it."""
    from .weights import save_weights

    run = Path(run)
    card = model_card(model.config, classes, preprocess, extra)
    save_weights(model, run / "model.safetensors", {"classes": card["classes"], "preprocess": card["preprocess"]})
    write_text(run / "model.json", json.dumps(card, indent=2))
    return run / "model.safetensors"


def load_model(run: str | os.PathLike, device: str | torch.device | None = None) -> VisionTransformer:
    """The trained model of a run directory (or a foodvit .safetensors file), in eval mode, with
    `.class_names` and `.preprocess` (a Preprocess) attached."""
    from .weights import config_from_metadata, load_weights, read_weights

    run = Path(run)
    weights = run / "model.safetensors" if run.is_dir() else run
    if not weights.is_file():
        hint = " (training writes it when it finishes; resume an unfinished run with foodvit train --resume DIR)" if run.is_dir() else ""
        raise RunError(f"no trained model at {weights}{hint}")
    state, meta = read_weights(weights)
    card_path = weights.with_name("model.json")
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    config = ViTConfig(**card["model"]) if "model" in card else config_from_metadata(meta)
    if config is None:
        raise RunError(f"{weights} carries no model configuration: it is not a foodvit model file; "
                       "load foreign weights with foodvit.load_weights(foodvit.create_model(...), path)")
    classes = card.get("classes") or json.loads(meta.get("classes", "[]"))
    preprocess = card.get("preprocess") or json.loads(meta.get("preprocess", "null"))
    if not classes or not preprocess:
        raise RunError(f"{weights} lacks class names or preprocessing; it was not written by foodvit train")
    model = load_weights(VisionTransformer(config), state)
    model.class_names = list(classes)
    model.preprocess = Preprocess.from_dict(preprocess)
    return model.to(device or "cpu").eval()
