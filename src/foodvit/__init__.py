"""foodvit: the Vision Transformer (Dosovitskiy et al., 2021) built from the paper, proven equal to
torchvision and timm, and trained end to end on FoodVision Mini or any folder of labelled photos."""

from .model import ViTConfig, VisionTransformer, resample_pos_embed
from .variants import create_model, get_variant, list_models
from .weights import export_weights, load_weights, resize_model, save_weights

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "export_weights",
    "get_variant",
    "list_models",
    "load_model",
    "load_weights",
    "resample_pos_embed",
    "resize_model",
    "save_weights",
]
__version__ = "0.1.0"


def load_model(run, device: str | None = None):
    """A trained run's model, ready for inference, with .class_names and .preprocess attached."""
    from .run import load_model as _load

    return _load(run, device=device)
