"""foodvit: the Vision Transformer (Dosovitskiy et al., 2021) built from the paper, proven equal to
torchvision and timm, and trained end to end on FoodVision Mini or any folder of labelled photos.

The names below are loaded when first used, so that `import foodvit` (and the command line's
help) does not load PyTorch until something needs it.
"""

from __future__ import annotations

import importlib

from foodvit.errors import FoodVitError

# public name -> module that defines it
_LAZY = {
    "Predictor": "deploy.predictor",
    "ViTConfig": "settings.model",
    "VisionTransformer": "model.vit",
    "resample_pos_embed": "model.positions",
    "create_model": "model.variants",
    "get_variant": "model.variants",
    "list_models": "model.variants",
    "export_weights": "model.weights",
    "load_weights": "model.weights",
    "resize_model": "model.weights",
    "save_weights": "model.weights",
    "load_recipe": "recipes",
    "resolve": "model.resolve",
    "train": "training.run",
    "cross_validate": "tuning.cv",
    "tune": "tuning.search",
}

__all__ = ["FoodVitError", "load_model", "load_predictor", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    try:  # a sub-package or module, e.g. foodvit.data, imported on first use
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":  # the module exists but something it needs is missing (torchvision, ...)
            raise
        raise AttributeError(f"module 'foodvit' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_model(run, device: str | None = None):
    """A trained run's model (an nn.Module in eval mode). For predictions with the run's classes
    and preprocessing use foodvit.load_predictor."""
    from foodvit.rundir.trained import load_model as _load

    return _load(run, device=device)


def load_predictor(run, device: str | None = None):
    """A trained model's Predictor (a run directory, or an exported .onnx): classify(photo),
    classify_many(photos), .classes, .preprocess."""
    from foodvit.deploy.predictor import Predictor

    return Predictor.open(run, device=device)
