"""Settings as plain data: the model's (ViTConfig) and a run's (RunConfig), frozen dataclasses. The recipes
that fill them (TOML files) are read by foodvit.recipes, one layer up.

Every number's allowed range and every text setting's choices are named once, in the field's
metadata: the dataclasses check them when built (from a recipe, a config.json or Python), and the
command line (cli/options.py, which generates one option per field) checks them as it parses, with
the same message. This module imports no PyTorch and knows nothing of argparse or of pre-trained
weights: it is the ground the other layers stand on.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

from foodvit.errors import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    SHARE,
    SHARE_ABOVE_0,
    SHARE_BELOW_1,
    ConfigError,
    FoodVitError,
    Range,
    check_value,
)
from foodvit.objective_settings import CONTRAST_TEMPERATURE, OBJECTIVES

Pool = Literal["cls", "gap", "seq"]
PosEmbed = Literal["learned", "sincos2d", "none"]
Stem = Literal["patch", "conv", "spt"]
Init = Literal["jax", "mimetic", "impulse"]

# Choices of the text settings, named once (preprocess.py and transforms.py read them from here).
POOLS, POS_EMBEDS, STEMS, INITS = get_args(Pool), get_args(PosEmbed), get_args(Stem), get_args(Init)
RESIZE_MODES = ("crop", "square")
INTERPOLATIONS = ("bilinear", "bicubic")
AUGMENT_PRESETS = ("none", "flip", "light", "medium", "strong")
TEACHERS = ("resnet18", "resnet34", "resnet50")  # torchvision architectures a run can train as its distillation teacher
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
GUIDANCE_SCHEDULES = ("constant", "linear")  # the weight of locality guidance over the epochs (objectives/guidance.py)
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def opt(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None, range: Range | None = None) -> Any:
    """A settings field with its command-line help, and optionally a flag name, its choices and
    the range its number(s) must lie in."""
    meta = {"help": help, "flag": flag, "choices": choices, "range": range}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(f) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def _check_field(f, value) -> None:
    """A ConfigError unless value lies in the field's range and among its choices (its metadata)."""
    if f.metadata.get("range") is not None:
        check_value(flag_of(f), value, f.metadata["range"])
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{flag_of(f)} must be one of {', '.join(choices)}, got {value!r}")


def _check(settings) -> None:
    for f in fields(settings):
        _check_field(f, getattr(settings, f.name))


# ------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a ViT. Defaults are ViT-B/16 at 224 px (Table 1). The deviations
    named below are listed and cited in model/vit.py's docstring."""

    image_size: int = opt(224, "input resolution H = W in pixels (paper: 224)", range=AT_LEAST_1)
    patch_size: int = opt(16, "patch size P (paper: 16; 'ViT-B/16')", range=AT_LEAST_1)
    in_channels: int = opt(3, "image channels C", range=AT_LEAST_1)
    num_classes: int = opt(1000, "classes of the linear head (0: no head)", range=AT_LEAST_0)
    embed_dim: int = opt(768, "width D (Table 1: 'Hidden size')", range=AT_LEAST_1)
    depth: int = opt(12, "encoder blocks L (Table 1: 'Layers')", range=AT_LEAST_1)
    num_heads: int = opt(12, "attention heads h (Table 1: 'Heads')", range=AT_LEAST_1)
    mlp_dim: int = opt(3072, "MLP width M (Table 1: 'MLP size')", range=AT_LEAST_1)
    dropout: float = opt(0.0, "dropout after dense layers and the position embedding (App. B.1, Table 3)", range=SHARE_BELOW_1)
    attn_dropout: float = opt(0.0, "dropout on the attention weights (JAX reference: 0)", range=SHARE_BELOW_1)
    drop_path: float = opt(0.0, "stochastic depth rate of the last block (deviation 4; DeiT: 0.1)", range=SHARE_BELOW_1)
    pool: Pool = opt("cls", "'cls' (Eq. 4), 'gap' (deviation 1) or 'seq' (deviation 6)", choices=POOLS)
    pos_embed: PosEmbed = opt("learned", "'learned' (Eq. 1), 'sincos2d' or 'none' (deviation 2)", choices=POS_EMBEDS)
    class_token: bool = opt(True, "prepend the learnable class token (Eq. 1); off is deviation 3")
    stem: Stem = opt("patch", "'patch' (one Conv2d, Eq. 1), 'conv' (convolutional tokeniser, deviation 5) or 'spt' "
                     "(shifted patch tokenisation, deviation 10)", choices=STEMS)
    locality: bool = opt(False, "locality self-attention: no self-attention to the own token (unless --no-locality-mask), learned "
                         "temperature (deviation 7)")
    locality_mask: bool = opt(True, "with --locality: hide each token from itself (LSA as published); false keeps the learned "
                              "temperature alone (deviation 7)")
    layer_norm_eps: float = opt(1e-6, "LayerNorm epsilon (JAX reference: 1e-6)", range=POSITIVE)
    init: Init = opt("jax", "'jax' (the authors' code), 'mimetic' (attention starts near pre-trained shape, deviation 8) or "
                     "'impulse' (each head starts attending to one neighbour, like a 3x3 convolution's tap; deviation 11)",
                     choices=INITS)
    mlp_conv: bool = opt(False, "a depthwise 3x3 convolution over the patch grid inside each MLP, after its first layer and "
                         "its GELU: every patch token's hidden features also see its 8 neighbours' (LocalViT; deviation 12)")
    distill_token: bool = opt(False, "DeiT's distillation token: a second prefix token whose own head learns the teacher's "
                              "classes (needs --distill); prediction averages the two heads (deviation 9)")

    def __post_init__(self) -> None:
        _check(self)
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
            raise ConfigError("init='impulse' builds each head's attention from the fixed sin-cos positions: add --pos-embed sincos2d")
        if not self.locality_mask and not self.locality:
            raise ConfigError("--no-locality-mask keeps locality self-attention's learned temperature without its mask: add --locality")
        if self.stem == "conv" and self.patch_size & (self.patch_size - 1):
            raise ConfigError(f"stem='conv' halves the resolution per stage, so patch size must be a power of 2, got {self.patch_size}")

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
    divs = sorted((k for k in range(1, n + 1) if n % k == 0), key=lambda k: abs(k - target))
    return ", ".join(str(k) for k in sorted(divs[:3]))


# ------------------------------------------------------------------------------------ a run


DEFAULT_RECIPE = "default"


@dataclass(frozen=True)
class DataConfig:
    source: str = opt("", "data: a URL of a zip, a local zip, a folder with train/ and test/, or food101 (Food-101, downloaded "
                      "once; food101:pizza,steak,sushi for some of its classes) (default: $FOODVIT_DATA, else the course's "
                      "pizza_steak_sushi.zip); a run stores the source it used", flag="data")
    train_fraction: float = opt(1.0, "train on this share of each class's training photos, drawn with the seed "
                                "(the course's 20%% of Food-101: --data food101 --train-fraction 0.2)", range=SHARE_ABOVE_0)
    val_fraction: float = opt(0.0, "share of each training class held out as a validation split for model selection", range=SHARE_BELOW_1)
    resize_mode: str = opt("crop", "eval preprocessing: 'crop' resizes the shorter side then centre-crops; 'square' squashes to a square (the course)",
                           choices=RESIZE_MODES)
    crop_pct: float = opt(0.875, "with resize_mode=crop, crop size / resize size (0.875: 224 from 256)", range=SHARE_ABOVE_0)
    interpolation: str = opt("bilinear", "resize interpolation", choices=INTERPOLATIONS)
    test_size: int = opt(0, "after training, test and save the model at this resolution, position embeddings resampled "
                         "(FixRes, Touvron et al. 2019: random crops make objects look larger in training than a centre "
                         "crop at test; a test size above the training one evens that out); 0 = the training size", range=AT_LEAST_0)
    start_size: int = opt(0, "progressive resizing (Tan & Le 2021, EfficientNetV2): train the first --start-share of the epochs "
                          "at this resolution, each batch resized before the model (needs fixed position embeddings); 0 = off",
                          range=AT_LEAST_0)
    start_share: float = opt(0.67, "share of the epochs trained at --start-size", range=SHARE)
    mean: tuple[float, ...] = opt((), "normalisation mean, three numbers (default: the model's or the weights')", range=Range())
    std: tuple[float, ...] = opt((), "normalisation std, three positive numbers (default: the model's or the weights')", range=POSITIVE)
    augment: str = opt("none", "augmentation preset", choices=AUGMENT_PRESETS)
    scale_min: float = opt(0.25, "smallest crop area share of random resized crops (light, medium and strong presets)", range=SHARE_ABOVE_0)
    random_erasing: float = opt(0.0, "probability of random erasing (Zhong et al. 2020; DeiT: 0.25)", range=SHARE)
    mixup: float = opt(0.0, "mixup alpha, 0 = off (Zhang et al. 2018; DeiT: 0.8)", range=AT_LEAST_0)
    cutmix: float = opt(0.0, "cutmix alpha, 0 = off (Yun et al. 2019; DeiT: 1.0)", range=AT_LEAST_0)
    mix_prob: float = opt(1.0, "probability that a batch is mixed when mixup or cutmix is on", range=SHARE)
    repeated_aug: int = opt(1, "repeated augmentation: each image appears this many times an epoch (Hoffer et al. 2020; DeiT: 3)",
                            range=AT_LEAST_1)
    cache: bool = opt(True, "decode each photo once and keep it in memory (small data sets; JPEG decoding dominates CPU time); "
                      "on or off, a run computes exactly the same")
    cache_gb: float = opt(4.0, "memory budget of that cache in GiB, per process: photos past it are decoded each time they are used",
                          range=Range(0, lo_open=True, hint="for no cache at all, use --no-cache"))
    workers: int = opt(0, "DataLoader worker processes, kept up between epochs (0: load in the training process; "
                       "on a GPU try 4-8); any number from 1 up gives the same run", range=AT_LEAST_0)
    strict: bool = opt(False, "refuse corrupt or non-image files instead of skipping them")

    def __post_init__(self) -> None:
        _check(self)
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (0, 3):
                raise ConfigError(f"--{name} takes three numbers (red, green, blue), got {len(getattr(self, name))}")



@dataclass(frozen=True)
class OptimConfig:
    optimizer: str = opt("adamw", "optimiser", choices=OPTIMIZERS)
    lr: float = opt(1e-3, "peak learning rate", range=POSITIVE)
    betas: tuple[float, float] = opt((0.9, 0.999), "Adam betas (Table 3: 0.9, 0.999)", range=SHARE_BELOW_1)
    momentum: float = opt(0.9, "SGD momentum (fine-tuning: 0.9)", range=SHARE_BELOW_1)
    weight_decay: float = opt(0.05, "weight decay", range=AT_LEAST_0)
    decay_all: bool = opt(False, "decay every parameter, biases, norms, class token and position embedding included (the course)")
    schedule: str = opt("cosine", "learning-rate decay after warmup", choices=SCHEDULES)
    warmup_epochs: float = opt(0.0, "linear warmup from 0, in epochs (fractions allowed)", range=AT_LEAST_0)
    min_lr_ratio: float = opt(0.0, "final learning rate as a share of the peak", range=SHARE)
    clip_grad: float = opt(0.0, "clip gradients at this global norm, 0 = off (Table 3: 1.0)", range=AT_LEAST_0)
    label_smoothing: float = opt(0.0, "label smoothing (Szegedy et al. 2016; DeiT: 0.1)", range=SHARE_BELOW_1)
    sam: float = opt(0.0, "sharpness-aware minimisation's radius (Foret et al. 2021: 0.05): each step's gradient taken again "
                     "at the worst nearby weights, twice the compute; 0 = off; not in the teacher's or pre-training's", range=AT_LEAST_0)
    accum_steps: int = opt(1, "gradient accumulation steps: effective batch = batch_size x accum_steps", range=AT_LEAST_1)
    ema: float = opt(0.0, "exponential moving average of the weights, decay per step, 0 = off (DeiT: 0.99996)", range=SHARE_BELOW_1)
    drloc: float = opt(0.0, "weight of the dense relative localization loss: an auxiliary head predicts the grid offset "
                       "of two output tokens (Liu et al. 2021), 0 = off; none with a frozen backbone", range=AT_LEAST_0)
    drloc_pairs: int = opt(64, "token pairs per image for --drloc", range=AT_LEAST_1)
    distill: float = opt(0.0, "weight of distillation from a CNN teacher trained first on the same photos (DeiT): its "
                         "predicted classes, or with --distill-temperature its probabilities, 0 = off; none with a frozen "
                         "backbone", range=AT_LEAST_0)
    distill_temperature: float = opt(0.0, "with --distill: match the teacher's class probabilities softened at this "
                                     "temperature, --distill x T^2 x KL(teacher || student); 0 = its predicted classes",
                                     range=AT_LEAST_0)
    guidance: float = opt(0.0, "weight of locality guidance: a few blocks' patch tokens predict, through 1x1 adapters, the "
                          "feature maps of a CNN teacher trained first on the same photos (Li et al. 2022), 0 = off; none "
                          "with a frozen backbone", range=AT_LEAST_0)
    guidance_schedule: str = opt("constant", "the weight of --guidance over the epochs: constant, or linear from --guidance "
                                 "down towards 0 (epoch e of E weighs W x (1 - e/E))", choices=GUIDANCE_SCHEDULES)
    guidance_stages: int = opt(3, "the teacher's first stages that guide with --guidance: 3 (blocks before the last) or 4 "
                               "(the last block too; needs --pool gap or seq)", range=Range(3, 4))
    masked: float = opt(0.0, "weight of masked-patch reconstruction: --mask-ratio of each training image's patches shown as "
                        "a learned mask token, a linear decoder predicts their pixels, 0 = off; needs --pool gap or seq",
                        range=AT_LEAST_0)
    mask_ratio: float = opt(0.25, "share of each training image's patches hidden with --masked", range=SHARE_ABOVE_0)
    mask_pixels: bool = opt(False, "with --masked: also set the hidden patches' pixels to 0 before the tokeniser, so that "
                            "a conv or spt stem cannot show them to their neighbours' tokens")
    contrast: float = opt(0.0, "weight of instance discrimination: a second view of each image (cropped, flipped and "
                          "recoloured at random) goes through the ViT, and each pooled state learns to find its photo's "
                          "other view in the batch (SimCLR's NT-Xent), 0 = off; none with a frozen backbone",
                          range=AT_LEAST_0)
    contrast_temperature: float = opt(CONTRAST_TEMPERATURE, "temperature of --contrast's cosine similarities",
                                      range=POSITIVE)
    pretrain_epochs: int = opt(0, "epochs of self-supervised pre-training on the training photos before the supervised "
                               "ones: the hidden patches' pixels predicted, the classes not read, 0 = off; needs --pool gap "
                               "or seq", range=AT_LEAST_0)
    pretrain_mask_ratio: float = opt(0.5, "share of each image's patches hidden in pre-training (--pretrain-epochs)",
                                     range=SHARE_ABOVE_0)
    teacher: str = opt("resnet18", "the CNN teacher of --distill and --guidance: a torchvision architecture trained from "
                       "random initialisation in the run, on its photos with its optimiser and schedule", choices=TEACHERS)

    def __post_init__(self) -> None:
        _check(self)
        if len(self.betas) != 2:
            raise ConfigError(f"--betas takes two numbers (beta1, beta2), got {len(self.betas)}")
        for objective in OBJECTIVES:
            objective.check(self)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = opt(10, "training epochs", range=AT_LEAST_1)
    batch_size: int = opt(32, "images per step", range=AT_LEAST_1)
    seed: int = opt(42, "random seed: same seed, same run (on the CPU; on a GPU with --deterministic)", range=AT_LEAST_0)
    deterministic: bool = opt(False, "deterministic algorithms only, so that a GPU run (and its resume) repeats exactly; "
                              "slower on a GPU, no effect on the CPU's results")
    device: str = opt("auto", "'auto' (CUDA if present), 'cpu', 'cuda', 'cuda:1', 'mps'")
    amp: bool = opt(True, "bf16 autocast on CUDA (ignored on the CPU)")
    compile: bool = opt(False, "torch.compile the model")
    eval_every: int = opt(1, "evaluate on the validation and test splits every N epochs (and always at the end)", range=AT_LEAST_1)
    pretrained: str = opt("", "start from weights: torchvision:NAME, timm:NAME or a file")
    freeze_backbone: bool = opt(False, "train the head only (feature extractor)")
    tensorboard: bool = opt(False, "also write TensorBoard event files into RUN/tensorboard (tensorboard --logdir runs/ compares runs)")

    def __post_init__(self) -> None:
        _check(self)
        if not DEVICE_PATTERN.match(self.device):
            raise ConfigError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; saved as config.json."""

    recipe: str = DEFAULT_RECIPE
    model: str = "ViT-B/16"
    vit: dict = field(default_factory=dict)  # ViTConfig overrides (dropout, pool, image_size, ...)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        _check_vit(self.vit, "model settings")
        if self.optim.pretrain_epochs and self.train.freeze_backbone:
            raise ConfigError("--pretrain-epochs pre-trains the backbone, which --freeze-backbone keeps as it is: drop one of the two")
        if self.vit.get("distill_token") and (self.optim.distill <= 0 or self.train.freeze_backbone):
            raise ConfigError("--distill-token trains its own head on a teacher's classes: add --distill W (e.g. --distill 1) "
                              "and train the whole model (no --freeze-backbone)")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict, where: str = "settings") -> RunConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object of settings, got {type(d).__name__}")
        unknown = sorted(set(d) - {"recipe", "model", "vit", *SECTIONS})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; expected recipe, model, vit, {', '.join(SECTIONS)}")
        return cls(
            recipe=d.get("recipe", DEFAULT_RECIPE),
            model=d.get("model", cls.model),
            vit=dict(d.get("vit", {})),
            data=_build(DataConfig, d.get("data", {})),
            optim=_build(OptimConfig, d.get("optim", {})),
            train=_build(TrainConfig, d.get("train", {})),
        )


def settings_as_today(stored: dict) -> dict:
    """Settings a run or a study stored, as this version writes them: a setting added since is absent
    from them and counts at its default (a new setting's default keeps the old behaviour, so the recipe
    is the same). Settings this version cannot read (a setting since removed, a wrong type) come back
    as stored, so that a comparison shows them rather than drops them."""
    try:
        return RunConfig.from_dict(stored).to_dict()
    except (FoodVitError, TypeError):
        return stored


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
# ViTConfig fields offered as options; num_classes comes from the data, in_channels is always 3.
VIT_OPTIONS = tuple(f for f in fields(ViTConfig) if f.name not in ("num_classes", "in_channels"))


def _build(cls, values: dict):
    if not isinstance(values, dict):
        raise ConfigError(f"{cls.__name__}: expected a table of settings, got {type(values).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    # TOML and JSON give lists where the dataclass holds tuples
    return cls(**{k: tuple(v) if isinstance(known[k].default, tuple) else v for k, v in values.items()})


def _check_vit(values: dict, where: str) -> None:
    """Model settings of a run: known names, each in its field's range or choices."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a table of model settings, got {type(values).__name__}")
    known = {f.name: f for f in VIT_OPTIONS}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown model setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for name, value in values.items():
        _check_field(known[name], value)


def setting_field(key: str):
    """The field behind a setting named "section.name" (vit.depth, optim.lr, ...), as the command
    line's overrides name them; a ConfigError for an unknown one, listing its section's names."""
    section, _, name = key.partition(".")
    known = {f.name: f for f in VIT_OPTIONS} if section == "vit" else {f.name: f for f in fields(SECTIONS[section])} \
        if section in SECTIONS else None
    if known is None:
        raise ConfigError(f"unknown setting {key!r}: the sections are vit, {', '.join(SECTIONS)}")
    if name not in known:
        raise ConfigError(f"unknown setting {key!r}; {section} has {', '.join(sorted(known))}")
    return known[name]


def check_setting(key: str, value) -> None:
    """A ConfigError unless value is allowed for the setting "section.name": the same range and
    choices check, and message, as the command line's."""
    _check_field(setting_field(key), value)


def with_settings(config: RunConfig, values: dict) -> RunConfig:
    """config with the settings named "section.name" (vit.depth, optim.lr, ...) replaced, each
    checked as the command line checks it (e.g. a tuning trial's sampled settings)."""
    vit, sections = dict(config.vit), {name: {} for name in SECTIONS}
    for key, value in values.items():
        check_setting(key, value)
        section, name = key.split(".", 1)
        if section == "vit":
            vit[name] = value
        else:
            sections[section][name] = value
    return replace(config, vit=vit, **{name: replace(getattr(config, name), **changes) for name, changes in sections.items()})
