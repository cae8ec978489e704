"""A run's model and its preprocessing, from its settings: a registered variant built from scratch
(Table 1 plus the run's overrides), or the model that pre-trained weights dictate."""

from __future__ import annotations

from foodvit.config import RunConfig
from foodvit.data.preprocess import Preprocess, make_preprocess
from foodvit.model.variants import create_model, get_variant
from foodvit.model.vit import VisionTransformer


def default_preprocess(config: RunConfig) -> Preprocess:
    """Preprocessing from the model's registry entry (size, normalisation) and the data settings."""
    variant = get_variant(config.model)
    d = config.data
    image_size = config.vit.get("image_size", variant.image_size)
    return make_preprocess(image_size, d.mean or variant.mean, d.std or variant.std, d.resize_mode, d.crop_pct, d.interpolation)


def build_model(config: RunConfig, num_classes: int) -> tuple[VisionTransformer, Preprocess]:
    """The model to train and its preprocessing (from pre-trained weights when given)."""
    if config.train.pretrained:
        from foodvit.model.pretrained import pretrained_model  # torchvision / timm only when weights are named

        return pretrained_model(config, num_classes)
    vit = dict(config.vit)
    image_size = vit.pop("image_size", get_variant(config.model).image_size)
    return create_model(config.model, num_classes=num_classes, image_size=image_size, **vit), default_preprocess(config)
