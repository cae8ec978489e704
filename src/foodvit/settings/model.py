"""The model's settings: ViTConfig, everything that defines a ViT; VitSettings, what a run sets over its model
variant; and the patch-grid rule the model, the trainer's sizes and the patch figure share. Plain data, no PyTorch:
a run's settings (foodvit.settings.run) hold VitSettings as their `vit` section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from foodvit.errors import ConfigError
from foodvit.settings.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    SHARE_BELOW_1,
    SIDE,
    check_field,
    check_fields,
    generated_fields,
    opt,
)

Pool = Literal["cls", "gap", "seq"]
PosEmbed = Literal["learned", "sincos2d", "none"]
Stem = Literal["patch", "conv", "spt"]
Init = Literal["jax", "mimetic", "impulse"]

# Choices of the model's text settings, named once.
POOLS, POS_EMBEDS, STEMS, INITS = get_args(Pool), get_args(PosEmbed), get_args(Stem), get_args(Init)


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a ViT. Defaults are ViT-B/16 at 224 px (Table 1). The deviations
    named below are listed and cited in model/vit.py's docstring."""

    image_size: int = opt(224, "input resolution H = W in pixels (paper: 224)", range=SIDE)
    patch_size: int = opt(16, "patch size P (paper: 16; 'ViT-B/16')", range=AT_LEAST_1)
    in_channels: int = opt(3, "image channels C", range=AT_LEAST_1)
    num_classes: int = opt(1000, "classes of the linear head (0: no head)", range=AT_LEAST_0)
    embed_dim: int = opt(768, "width D (Table 1: 'Hidden size')", range=AT_LEAST_1)
    depth: int = opt(12, "encoder blocks L (Table 1: 'Layers')", range=AT_LEAST_1)
    num_heads: int = opt(12, "attention heads h (Table 1: 'Heads')", range=AT_LEAST_1)
    mlp_dim: int = opt(3072, "MLP width M (Table 1: 'MLP size')", range=AT_LEAST_1)
    dropout: float = opt(
        0.0, "dropout after dense layers and the position embedding (App. B.1, Table 3)", range=SHARE_BELOW_1
    )
    attn_dropout: float = opt(0.0, "dropout on the attention weights (JAX reference: 0)", range=SHARE_BELOW_1)
    drop_path: float = opt(0.0, "stochastic depth rate of the last block (deviation 4; DeiT: 0.1)", range=SHARE_BELOW_1)
    pool: Pool = opt("cls", "'cls' (Eq. 4), 'gap' (deviation 1) or 'seq' (deviation 6)", choices=POOLS)
    pos_embed: PosEmbed = opt("learned", "'learned' (Eq. 1), 'sincos2d' or 'none' (deviation 2)", choices=POS_EMBEDS)
    class_token: bool = opt(True, "prepend the learnable class token (Eq. 1); off is deviation 3")
    stem: Stem = opt(
        "patch",
        "'patch' (one Conv2d, Eq. 1), 'conv' (convolutional tokeniser, deviation 5) or 'spt' "
        "(shifted patch tokenisation, deviation 10)",
        choices=STEMS,
    )
    locality: bool = opt(
        False,
        "locality self-attention: no self-attention to the own token (unless --no-locality-mask), learned "
        "temperature (deviation 7)",
    )
    locality_mask: bool = opt(
        True,
        "with --locality: hide each token from itself (LSA as published); false keeps the learned "
        "temperature alone (deviation 7)",
    )
    layer_norm_eps: float = opt(1e-6, "LayerNorm epsilon (JAX reference: 1e-6)", range=POSITIVE)
    init: Init = opt(
        "jax",
        "'jax' (the authors' code), 'mimetic' (attention starts near pre-trained shape, deviation 8) or "
        "'impulse' (each head starts attending to one neighbour, like a 3x3 convolution's tap; deviation 11)",
        choices=INITS,
    )
    mlp_conv: bool = opt(
        False,
        "a depthwise 3x3 convolution over the patch grid inside each MLP, after its first layer and "
        "its GELU: every patch token's hidden features also see its 8 neighbours' (LocalViT; deviation 12)",
    )
    distill_token: bool = opt(
        False,
        "DeiT's distillation token: a second prefix token whose own head learns the teacher's "
        "classes (needs --distill); prediction averages the two heads (deviation 9)",
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}: "
                f"each head gets d = D / h channels; pick num_heads from the divisors of "
                f"{self.embed_dim} (e.g. {_divisors_near(self.embed_dim, self.num_heads)})"
            )
        check_on_patch_grid("image size", self.image_size, self.patch_size)
        if not self.class_token and self.pool == "cls":
            raise ConfigError("pool='cls' needs the class token: set class_token=True or pool='gap' or 'seq'")
        if self.init == "impulse" and self.pos_embed != "sincos2d":
            raise ConfigError(
                "init='impulse' builds each head's attention from the fixed sin-cos positions: add --pos-embed sincos2d"
            )
        if not self.locality_mask and not self.locality:
            raise ConfigError(
                "--no-locality-mask keeps locality self-attention's learned temperature without its mask: "
                "add --locality"
            )
        if self.stem == "conv" and self.patch_size & (self.patch_size - 1):
            raise ConfigError(
                "stem='conv' halves the resolution per stage, so patch size must be a power of 2, "
                f"got {self.patch_size}"
            )

    @property
    def grid_size(self) -> int:
        """Patches per side, H / P."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """N = HW / P^2."""
        return self.grid_size**2

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token and the distillation token, each if any."""
        return int(self.class_token) + int(self.distill_token)

    @property
    def num_tokens(self) -> int:
        """T = N + the prefix tokens (N + 1 with the class token alone)."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def class_only_last_block(self) -> bool:
        """Whether forward() computes the last block for the class token alone: when Eq. 4 pools
        the class token, no other token's output of that block is read."""
        return self.pool == "cls"

    def replace(self, **changes) -> ViTConfig:
        return replace(self, **changes)


def check_on_patch_grid(name: str, size: int, patch_size: int) -> None:
    """The patch-grid rule, written once: a side length the P x P patches tile exactly, or a
    ConfigError naming the two nearest that do (the model, the trainer's sizes and the patch
    figure all ask here)."""
    if size % patch_size:
        lower = size // patch_size * patch_size
        nearest = f"{lower} or {lower + patch_size}" if lower else f"{patch_size}"  # below one patch: one choice
        raise ConfigError(f"{name} {size} is not a multiple of the patch size {patch_size}; use {nearest}")


def _divisors_near(n: int, target: int) -> str:
    """The three divisors of n nearest to target, found in pairs (k, n // k) with k up to sqrt(n), and k to a
    million at most: a typo's embed_dim of 10^11 is answered at once (trying every number up to n took hours)."""
    divisors = set()
    for k in range(1, min(math.isqrt(n), 10**6) + 1):
        if n % k == 0:
            divisors |= {k, n // k}
    nearest = sorted(sorted(divisors), key=lambda k: abs(k - target))  # of two as near, the smaller
    return ", ".join(str(k) for k in sorted(nearest[:3]))


# ViTConfig fields offered as options; num_classes comes from the data, in_channels is always 3.
VIT_OPTIONS = tuple(f for f in fields(ViTConfig) if f.name not in ("num_classes", "in_channels"))


@dataclass(frozen=True)
@generated_fields((f.name, f"{f.type} | None", field(default=None, metadata=f.metadata)) for f in VIT_OPTIONS)
class VitSettings:
    """A run's model settings: ViTConfig's fields (but the classes, which come from the data, and the image
    channels, always 3), each None where the run takes the chosen model variant's value (model/variants.py).
    The fields are generated from ViTConfig's (VIT_OPTIONS), in their order, with their help, range and choices;
    each value given is checked against them."""

    if TYPE_CHECKING:  # the generated fields, as a type checker sees them

        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        for name, value in self.given().items():
            check_field(self.__dataclass_fields__[name], value)

    def given(self) -> dict:
        """The settings given (not None), by name: what the run sets over its model variant."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, values: dict, where: str = "model settings") -> VitSettings:
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: expected a table of model settings, got {type(values).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown model setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**values)
