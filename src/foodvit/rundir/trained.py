"""A run's trained model: model.safetensors (the state dict, foodvit layout) and model.json beside
it (the model card: architecture, class names, preprocessing, final metrics; rundir/card.py). Training writes them
when it finishes; every use of a trained model reads them through here (deploy/predictor.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from foodvit.data.preprocess import Preprocess
from foodvit.errors import ConfigError, InputError, RunError
from foodvit.files import parse_json, write_text
from foodvit.model.vit import VisionTransformer
from foodvit.rundir.card import card_problem, is_class_list, model_card, read_card
from foodvit.rundir.directory import training_now
from foodvit.settings.model import ViTConfig


def save_model(run: Path, model: VisionTransformer, classes, preprocess: Preprocess, extra: dict | None = None) -> Path:
    """model.safetensors (the model's own state dict) and model.json beside it."""
    from foodvit.model.weights import save_weights

    run = Path(run)
    card = model_card(model.config, classes, preprocess, extra)
    save_weights(model, run / "model.safetensors", {"classes": card["classes"], "preprocess": card["preprocess"]})
    write_text(run / "model.json", json.dumps(card, indent=2))
    return run / "model.safetensors"


def read_trained(run: str | os.PathLike) -> tuple[VisionTransformer, list[str], Preprocess, dict]:
    """The trained model of a run directory (or a foodvit .safetensors file), in eval mode on the
    CPU, with its class names, preprocessing and model card (model.json, plus "params")."""
    from foodvit.model.weights import config_from_metadata, load_weights, read_weights

    run = Path(run)
    weights = run / "model.safetensors" if run.is_dir() else run
    if not weights.is_file():
        if run.is_dir() and (holder := training_now(run)):
            raise RunError(
                f"{run} is being trained right now ({holder}); its model is written when training finishes: wait for it"
            )
        hint = (
            " (training writes it when it finishes; resume an unfinished run with foodvit train --resume DIR)"
            if run.is_dir()
            else ""
        )
        raise RunError(f"no trained model at {weights}{hint}")
    state, meta = read_weights(weights)
    card_path = weights.with_name("model.json")
    card = read_card(card_path) if card_path.is_file() else {}
    if problem := card_problem(card):
        raise RunError(f"{card_path} is damaged: {problem}; restore it (training writes it with the model)")
    try:
        config = ViTConfig(**card["model"]) if "model" in card else config_from_metadata(meta)
    except TypeError as err:
        raise RunError(
            f"{card_path} describes a model this foodvit does not build ({err}); was it written by another version?"
        ) from None
    except ConfigError as err:  # a value out of its range: the card was edited or damaged
        raise RunError(
            f"{card_path} is damaged: a model setting is out of its range ({err}); restore it (training writes it "
            "with the model)"
        ) from None
    if config is None:
        raise RunError(
            f"{weights} carries no model configuration: it is not a foodvit model file; "
            "load foreign weights with foodvit.load_weights(foodvit.create_model(...), path)"
        )
    classes = card.get("classes") or parse_json(meta.get("classes", "[]"))
    preprocess = card.get("preprocess") or parse_json(meta.get("preprocess", "null"))
    if not classes or not preprocess:
        raise RunError(f"{weights} lacks class names or preprocessing; it was not written by foodvit train")
    where = card_path if card else weights
    if not is_class_list(classes):
        raise RunError(
            f"{where} is damaged: its classes must be a list of distinct names, got {json.dumps(classes)[:200]}; "
            "restore it (training writes it with the model)"
        )
    try:
        saved = Preprocess.from_dict(preprocess)
    except ConfigError as err:
        raise RunError(f"{where} is damaged: {err}; restore it (training writes it with the model)") from None
    if len(classes) != config.num_classes:
        raise RunError(
            f"{weights}: {len(classes)} class names for a model with {config.num_classes} outputs; "
            "the files do not belong together"
        )
    if saved.image_size != config.image_size:  # else every photo would be refused as the wrong size
        raise RunError(
            f"{where} is damaged: its preprocessing gives {saved.image_size} px photos to a model of "
            f"{config.image_size} px; restore it (training writes it with the model)"
        )
    try:
        model = load_weights(VisionTransformer(config), state).eval()
    except InputError:  # the weights are of another model than the card describes
        raise RunError(
            f"{weights} does not hold the model {card_path.name if card else 'its metadata'} describes (its "
            f"tensors' names or shapes differ); the files do not belong together: restore the run's model.json"
        ) from None
    broken = [name for name, tensor in state.items() if tensor.is_floating_point() and not tensor.isfinite().all()]
    if broken:  # every answer would be NaN, or one class for every photo
        raise RunError(
            f"{weights} is damaged: {len(broken)} of its tensors hold NaN or infinite values ({broken[0]} ...); "
            "restore it, or train the run again"
        )
    card = {
        **card,
        "model": config.__dict__,
        "classes": list(classes),
        "preprocess": preprocess,
        "params": sum(p.numel() for p in model.parameters()),
    }
    return model, list(classes), saved, card


def load_model(run: str | os.PathLike, device: str | torch.device | None = None) -> VisionTransformer:
    """The trained model (an nn.Module in eval mode) of a run directory or foodvit .safetensors
    file. Its class names and preprocessing come with foodvit.Predictor.from_run(run)."""
    return read_trained(run)[0].to(device or "cpu")
