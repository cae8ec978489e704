"""A run directory and what lives in it.

    config.json        the resolved RunConfig
    metrics.csv        one row per epoch
    checkpoint.pt      everything needed to resume (written atomically after every epoch)
    model.safetensors  the trained model's state dict (foodvit layout)
    model.json         beside it: model config, class names, preprocessing, final metrics
    curves.png, confusion.png, most_wrong.png, report.md
    .foodvit.lock      while a process writes the run (files.RunLock)
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch

from foodvit.config import RunConfig
from foodvit.data.preprocess import Preprocess
from foodvit.errors import ConfigError, RunError
from foodvit.files import atomic_write, write_text  # noqa: F401  (write_text re-exported)
from foodvit.model.vit import VisionTransformer, ViTConfig

# every file a run writes (a failed start removes these, and only these)
TEACHER_FILE = "teacher.pt"  # a distilled run's CNN teacher (distill.py)
RUN_FILES = ("config.json", "metrics.csv", "checkpoint.pt", "model.safetensors", "model.json", "curves.png", "confusion.png",
             "most_wrong.png", "report.md", TEACHER_FILE)
# *_loss: plain cross-entropy per image, comparable across splits; train_objective: what was minimised
METRIC_COLUMNS = ("epoch", "train_loss", "train_objective", "train_acc", "val_loss", "val_acc", "test_loss", "test_acc", "lr", "seconds",
                  "images_per_s", "model_share")


def write_metrics(path: Path, history: list[dict]) -> Path:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for row in history:
                writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})

    return atomic_write(path, write)


def read_config(path: Path) -> RunConfig:
    """A run's config.json, or a RunError that names the file and what is wrong with it."""
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise RunError(f"cannot read {path} ({err})") from None
    except json.JSONDecodeError as err:
        raise RunError(f"{path} is not valid JSON ({err}); restore it from the checkpoint's settings or start a new run") from None
    try:
        return RunConfig.from_dict(values, where=str(path))
    except (ConfigError, TypeError) as err:
        raise RunError(f"{path}: {err}") from None


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
    from foodvit.model.weights import save_weights

    run = Path(run)
    card = model_card(model.config, classes, preprocess, extra)
    save_weights(model, run / "model.safetensors", {"classes": card["classes"], "preprocess": card["preprocess"]})
    write_text(run / "model.json", json.dumps(card, indent=2))
    return run / "model.safetensors"


def _read_card(path: Path) -> dict:
    try:
        card = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunError(f"{path} is not readable JSON ({err}); training writes it with the model: train again or restore it") from None
    if not isinstance(card, dict):
        raise RunError(f"{path} holds a JSON {type(card).__name__}, not the model card object training writes")
    return card


def read_trained(run: str | os.PathLike) -> tuple[VisionTransformer, list[str], Preprocess, dict]:
    """The trained model of a run directory (or a foodvit .safetensors file), in eval mode on the
    CPU, with its class names, preprocessing and model card (model.json, plus "params")."""
    from foodvit.model.weights import config_from_metadata, load_weights, read_weights

    run = Path(run)
    weights = run / "model.safetensors" if run.is_dir() else run
    if not weights.is_file():
        hint = " (training writes it when it finishes; resume an unfinished run with foodvit train --resume DIR)" if run.is_dir() else ""
        raise RunError(f"no trained model at {weights}{hint}")
    state, meta = read_weights(weights)
    card_path = weights.with_name("model.json")
    card = _read_card(card_path) if card_path.is_file() else {}
    try:
        config = ViTConfig(**card["model"]) if "model" in card else config_from_metadata(meta)
    except TypeError as err:
        raise RunError(f"{card_path} describes a model this foodvit does not build ({err}); was it written by another version?") from None
    if config is None:
        raise RunError(f"{weights} carries no model configuration: it is not a foodvit model file; "
                       "load foreign weights with foodvit.load_weights(foodvit.create_model(...), path)")
    classes = card.get("classes") or json.loads(meta.get("classes", "[]"))
    preprocess = card.get("preprocess") or json.loads(meta.get("preprocess", "null"))
    if not classes or not preprocess:
        raise RunError(f"{weights} lacks class names or preprocessing; it was not written by foodvit train")
    if len(classes) != config.num_classes:
        raise RunError(f"{weights}: {len(classes)} class names for a model with {config.num_classes} outputs; the files do not belong together")
    model = load_weights(VisionTransformer(config), state).eval()
    card = {**card, "model": config.__dict__, "classes": list(classes), "preprocess": preprocess,
            "params": sum(p.numel() for p in model.parameters())}
    return model, list(classes), Preprocess.from_dict(preprocess), card


def load_model(run: str | os.PathLike, device: str | torch.device | None = None) -> VisionTransformer:
    """The trained model (an nn.Module in eval mode) of a run directory or foodvit .safetensors
    file. Its class names and preprocessing come with foodvit.Predictor.from_run(run)."""
    return read_trained(run)[0].to(device or "cpu")
