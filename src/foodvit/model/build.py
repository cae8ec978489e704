"""A run's model and its preprocessing, from its settings: a registered variant built from scratch
(Table 1 plus the run's overrides), or the model that pre-trained weights dictate."""

from __future__ import annotations

from foodvit.data.preprocess import Preprocess, make_preprocess
from foodvit.model.variants import get_variant, run_model_config
from foodvit.model.vit import VisionTransformer
from foodvit.settings.run import RunConfig


def default_preprocess(config: RunConfig) -> Preprocess:
    """Preprocessing from the model's registry entry (size, normalisation) and the data settings."""
    variant = get_variant(config.model)
    d = config.data
    return make_preprocess(
        run_model_config(config).image_size,
        d.mean or variant.mean,
        d.std or variant.std,
        d.resize_mode,
        d.crop_pct,
        d.interpolation,
    )


def build_model(config: RunConfig, num_classes: int) -> tuple[VisionTransformer, Preprocess]:
    """The model to train and its preprocessing (from pre-trained weights when given)."""
    if config.train.pretrained:
        from foodvit.model.pretrained import pretrained_model  # torchvision / timm only when weights are named

        return pretrained_model(config, num_classes)
    return VisionTransformer(run_model_config(config).replace(num_classes=num_classes)), default_preprocess(config)
