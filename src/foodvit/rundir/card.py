"""The model card: what model.json beside a run's model.safetensors holds (architecture, class names,
preprocessing, final metrics), and an exported .onnx file's foodvit.card with it. Written when training finishes;
read, and checked, wherever a trained model is opened: by rundir/trained.py with PyTorch, and by the ONNX path
(deploy/onnx_runtime.py) without it. No PyTorch here."""

from __future__ import annotations

import json
import math
from pathlib import Path

from foodvit.data.preprocess import Preprocess
from foodvit.errors import RunError
from foodvit.files import read_json
from foodvit.settings.model import ViTConfig

# what the card's metrics hold that a page, a Space or a model's name reads: each field's kind
METRIC_KINDS = {
    "test_acc": "a share",
    "test_n": "a count",
    "train_photos": "a count",
    "epochs": "a count",
    "recipe": "text",
    "data": "text",
    "data_name": "text",
    "trained": "text",
}


def model_card(config: ViTConfig, classes, preprocess: Preprocess, extra: dict | None = None) -> dict:
    return {
        "format": "foodvit",
        "model": config.__dict__,
        "classes": list(classes),
        "preprocess": json.loads(preprocess.to_json()),
        **(extra or {}),
    }


def read_card(path: Path) -> dict:
    """model.json's object, or a RunError for a file that is not one."""
    try:
        card = read_json(path)
    except (OSError, ValueError) as err:
        raise RunError(
            f"{path} is not readable JSON ({err}); training writes it with the model: train again or restore it"
        ) from None
    if not isinstance(card, dict):
        raise RunError(f"{path} holds a JSON {type(card).__name__}, not the model card object training writes")
    return card


def is_class_list(classes) -> bool:
    """Whether a model card's classes are a list of distinct, non-empty names."""
    return (
        isinstance(classes, list)
        and all(isinstance(c, str) and c for c in classes)
        and len(set(classes)) == len(classes)
    )


def card_problem(card: dict) -> str | None:
    """What is wrong with the parts of a card that its readers show (its model and metrics objects, their
    fields of METRIC_KINDS, its parameter count), or None: a card edited or damaged by hand."""
    for part in ("model", "metrics"):
        if part in card and not isinstance(card[part], dict):
            return f"its {part} must be an object, got {json.dumps(card[part])[:80]}"
    for key, kind in METRIC_KINDS.items():
        value = card.get("metrics", {}).get(key)
        if value is not None and not _is(kind, value):
            return f"its metrics.{key} must be {kind}, got {json.dumps(value)[:80]}"
    if "params" in card and not _is("a count", card["params"]):
        return f"its params must be a count, got {json.dumps(card['params'])[:80]}"
    return None


def _is(kind: str, value) -> bool:
    if kind == "text":
        return isinstance(value, str)
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "a count":
        return number and value >= 0 and float(value).is_integer()
    return number and 0 <= value <= 1  # a share
