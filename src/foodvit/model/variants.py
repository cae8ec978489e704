"""The variant registry: paper names ("ViT-B/16") -> model configuration and preprocessing.

Sizes come from one table, the paper's Table 1 (Base, Large, Huge) with the two smaller sizes
that DeiT (Touvron et al. 2021, Table 1) added (Tiny, Small). A name is SIZE/P with any patch
size P, e.g. "ViT-B/16", "ViT-L/32", "ViT-H/14", "ViT-Ti/8".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from foodvit.errors import ConfigError
from foodvit.settings.model import ViTConfig, check_on_patch_grid
from foodvit.settings.run import RunConfig


class UnknownModelError(ConfigError, KeyError):
    """A model name that is not SIZE/P of Table 1 (a KeyError too: the registry is a lookup)."""

    __str__ = Exception.__str__  # the message as written, not quoted as a KeyError's key


if TYPE_CHECKING:  # the registry itself needs no PyTorch: `foodvit models` stays fast
    from foodvit.model.vit import VisionTransformer


@dataclass(frozen=True)
class Size:
    """One row of Table 1."""

    name: str  # "Base"
    depth: int  # Layers
    embed_dim: int  # Hidden size D
    mlp_dim: int  # MLP size M
    num_heads: int  # Heads
    source: str


# Table 1 of Dosovitskiy et al. (2021); Ti and S from DeiT's Table 1.
SIZES: dict[str, Size] = {
    "Ti": Size("Tiny", 12, 192, 768, 3, "DeiT Table 1"),
    "S": Size("Small", 12, 384, 1536, 6, "DeiT Table 1"),
    "B": Size("Base", 12, 768, 3072, 12, "ViT Table 1"),
    "L": Size("Large", 24, 1024, 4096, 16, "ViT Table 1"),
    "H": Size("Huge", 32, 1280, 5120, 16, "ViT Table 1"),
}
LISTED_PATCH_SIZES = (8, 14, 16, 32)

# The JAX reference scales pixels to [-1, 1]; torchvision's weights use ImageNet statistics and
# carry their own (see foodvit.model.pretrained).
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_NAME = re.compile(
    r"^vit[-_ ]?(?P<size>ti|s|b|l|h|tiny|small|base|large|huge)\s*[/_-]\s*(?P<patch>\d+)$", re.IGNORECASE
)
_LONG = {size.name.lower(): key for key, size in SIZES.items()}


@dataclass(frozen=True)
class Variant:
    """A registered model name, what it builds and how its inputs are prepared."""

    name: str
    size: Size
    patch_size: int
    image_size: int = 224
    mean: tuple[float, float, float] = DEFAULT_MEAN
    std: tuple[float, float, float] = DEFAULT_STD

    def config(self, num_classes: int = 1000, image_size: int | None = None, **overrides) -> ViTConfig:
        s = self.size
        return ViTConfig(
            image_size=self.image_size if image_size is None else image_size,  # 0 is refused by ViTConfig, not 224
            patch_size=self.patch_size,
            num_classes=num_classes,
            embed_dim=s.embed_dim,
            depth=s.depth,
            num_heads=s.num_heads,
            mlp_dim=s.mlp_dim,
        ).replace(**overrides)

    @property
    def num_params(self) -> int:
        """Expected parameter count at 1000 classes and 224 px."""
        return count_params(self.config(1000, 224))


def run_model_config(config: RunConfig) -> ViTConfig:
    """The from-scratch model a run's settings describe: its variant's Table 1 row with the run's
    model settings over it (what build_model builds, read without PyTorch)."""
    vit = config.vit.given()
    return get_variant(config.model).config(image_size=vit.pop("image_size", None), **vit)


def check_start_size(model: ViTConfig, start: int) -> None:
    """Progressive resizing's rule, written once (the trainer and the recipe rule below ask here): a
    start (0: off) on the model's patch grid, not above its image size, and, below it, fixed
    positions; else a ConfigError that says what to change."""
    check_on_patch_grid("--start-size", start, model.patch_size)
    if start > model.image_size:
        raise ConfigError(
            f"--start-size {start} is above the image size {model.image_size}: progressive "
            "resizing trains smaller photos first; give a smaller --start-size, or 0 to turn it off"
        )
    if start and start != model.image_size and model.pos_embed == "learned":
        raise ConfigError(
            "--start-size (progressive resizing) needs fixed position embeddings: add --pos-embed sincos2d"
        )


def _takes_start(config: RunConfig, start: int) -> bool | None:
    """Whether the from-scratch model of config can be trained from `start` px up to a larger size;
    None when the settings make no model (building it says why, with its own message)."""
    try:
        model = run_model_config(config)
    except ConfigError:
        return None
    try:
        check_start_size(model, start)
    except ConfigError:
        return False
    return start < model.image_size


def without_recipe_resizing(base: RunConfig, config: RunConfig, given: dict) -> RunConfig:
    """A recipe's progressive resizing (data.start_size) goes with the model it was set for. Settings
    `given` over the recipe `base` that leave a model which cannot take its start (an image no larger
    than the start, a patch that misses it, learned positions) or that take pre-trained weights train
    without it, unless they give a start size themselves; any other change keeps it (one rule for
    train, cv and tune). A recipe whose own model cannot take its start keeps it: the trainer refuses
    it with its own message, as it does a start the user gave."""
    start = base.data.start_size
    if not start or given.get("data.start_size") is not None or base.train.pretrained or not _takes_start(base, start):
        return config
    if config.train.pretrained or _takes_start(config, start) is False:
        return replace(config, data=replace(config.data, start_size=0))
    return config


def parse_name(name: str) -> tuple[str, int]:
    """'ViT-B/16' -> ('B', 16). Also accepts 'vit_b_16', 'ViT-Base/16'."""
    match = _NAME.match(name.strip())
    if not match:
        raise UnknownModelError(
            f"unknown model {name!r}; expected a paper name SIZE/P with SIZE in {', '.join(SIZES)} and any patch size "
            f"P, e.g. {', '.join(list_models()[:4])} ... (foodvit.list_models() lists the common ones)"
        )
    size = match["size"].lower()
    key = _LONG.get(size) or {"ti": "Ti", "s": "S", "b": "B", "l": "L", "h": "H"}[size]
    return key, int(match["patch"])


def get_variant(name: str) -> Variant:
    size, patch = parse_name(name)
    if patch < 1:
        raise UnknownModelError(f"patch size must be positive, got {patch} in {name!r}")
    return Variant(f"ViT-{size}/{patch}", SIZES[size], patch)


def list_models() -> list[str]:
    """The common names (any other patch size works too)."""
    return [f"ViT-{size}/{patch}" for size in SIZES for patch in LISTED_PATCH_SIZES]


def create_model(name: str, num_classes: int = 1000, image_size: int = 224, **overrides) -> VisionTransformer:
    """Build a registered ViT, initialised as the JAX reference does.

    overrides: any ViTConfig field (dropout, drop_path, pool, pos_embed, class_token, depth, ...).
    """
    from foodvit.model.vit import VisionTransformer

    config = get_variant(name).config(num_classes, image_size, **overrides)
    return VisionTransformer(config)


def count_params(config: ViTConfig) -> int:
    """Closed-form parameter count of the paper's ViT (patchify stem) for a configuration."""
    # deviations that add parameters: count them built
    if config.stem != "patch" or config.pool == "seq" or config.locality or config.mlp_conv or config.distill_token:
        return sum(p.numel() for p in _meta_model(config).parameters())
    C, P, D, M, K, L = (
        config.in_channels,
        config.patch_size,
        config.embed_dim,
        config.mlp_dim,
        config.num_classes,
        config.depth,
    )
    embed = C * P * P * D + D  # patch conv E and its bias
    embed += D * config.class_token  # x_class
    embed += config.num_tokens * D * (config.pos_embed == "learned")  # E_pos
    block = 2 * 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + (D * M + M) + (M * D + D)  # 2 LN, U_qkv, U_msa, MLP
    head = D * K + K if K > 0 else 0
    return embed + L * block + 2 * D + head  # + final LN


def count_macs(config: ViTConfig, executed: bool = False) -> int:
    """Multiply-accumulates of one forward pass of one image (patchify stem), from the config.

    ViT-B/16 at 224: 17.56 G, the whole model's count (what the peers compute). FLOPs are twice
    this; a training step is about three forward passes. executed=True: what foodvit's forward
    runs, where a class-token model's last block computes only the class token's output
    (VisionTransformer.forward_features(class_only=True)); ViT-B/16: 16.46 G.
    """
    N, T, D, M, L = config.num_patches, config.num_tokens, config.embed_dim, config.mlp_dim, config.depth

    def layer(queries: int) -> int:  # U_qkv on all T tokens; q k^T, A v, U_msa and the MLP for the queries
        return T * 3 * D * D + 2 * queries * T * D + queries * D * D + 2 * queries * D * M

    embed = N * D * config.in_channels * config.patch_size**2  # x_p E
    head = D * config.num_classes
    last = 1 if executed and config.class_only_last_block else T
    return embed + (L - 1) * layer(T) + layer(last) + head


def _meta_model(config: ViTConfig) -> VisionTransformer:
    import torch

    from foodvit.model.vit import VisionTransformer

    with torch.device("meta"):
        return VisionTransformer(config)
