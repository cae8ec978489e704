"""Run configuration: frozen dataclasses, recipes that set their defaults, and command-line
options generated from the fields (never written out one by one).

Resolution order: dataclass defaults < recipe file < command-line options. The resolved
configuration is saved with every run (config.json) and checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .model import _LITERALS, ViTConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPES_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "default"


def opt(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None) -> Any:
    """A config field with its command-line help (and an optional flag name)."""
    meta = {"help": help, "flag": flag, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DataConfig:
    source: str = opt("", "data: a URL of a zip, a local zip, or a folder with train/ and test/ "
                      "(default: $FOODVIT_DATA, else the course's pizza_steak_sushi.zip)", flag="data")
    val_fraction: float = opt(0.0, "share of each training class held out as a validation split for model selection")
    resize_mode: str = opt("crop", "eval preprocessing: 'crop' resizes the shorter side then centre-crops; 'square' squashes to a square (the course)",
                           choices=("crop", "square"))
    crop_pct: float = opt(0.875, "with resize_mode=crop, crop size / resize size (0.875: 224 from 256)")
    interpolation: str = opt("bilinear", "resize interpolation", choices=("bilinear", "bicubic"))
    mean: tuple[float, ...] = opt((), "normalisation mean (default: the model's or the weights')")
    std: tuple[float, ...] = opt((), "normalisation std (default: the model's or the weights')")
    augment: str = opt("none", "augmentation preset", choices=("none", "flip", "light", "medium", "strong"))
    scale_min: float = opt(0.25, "smallest crop area share of random resized crops (light, medium and strong presets)")
    random_erasing: float = opt(0.0, "probability of random erasing (Zhong et al. 2020; DeiT: 0.25)")
    mixup: float = opt(0.0, "mixup alpha, 0 = off (Zhang et al. 2018; DeiT: 0.8)")
    cutmix: float = opt(0.0, "cutmix alpha, 0 = off (Yun et al. 2019; DeiT: 1.0)")
    mix_prob: float = opt(1.0, "probability that a batch is mixed when mixup or cutmix is on")
    repeated_aug: int = opt(1, "repeated augmentation: each image appears this many times an epoch (Hoffer et al. 2020; DeiT: 3)")
    cache: bool = opt(True, "decode each photo once and keep it in memory (small data sets; JPEG decoding dominates CPU time)")
    workers: int = opt(0, "DataLoader worker processes, kept up between epochs (0: load in the training process; "
                       "on a GPU try 4-8); any number from 1 up gives the same run")
    strict: bool = opt(False, "refuse corrupt or non-image files instead of skipping them with a warning")


@dataclass(frozen=True)
class OptimConfig:
    optimizer: str = opt("adamw", "optimiser", choices=("adam", "adamw", "sgd"))
    lr: float = opt(1e-3, "peak learning rate")
    betas: tuple[float, float] = opt((0.9, 0.999), "Adam betas (Table 3: 0.9, 0.999)")
    momentum: float = opt(0.9, "SGD momentum (fine-tuning: 0.9)")
    weight_decay: float = opt(0.05, "weight decay")
    decay_all: bool = opt(False, "decay every parameter, biases, norms, class token and position embedding included (the course)")
    schedule: str = opt("cosine", "learning-rate decay after warmup", choices=("constant", "cosine", "linear"))
    warmup_epochs: float = opt(0.0, "linear warmup from 0, in epochs (fractions allowed)")
    min_lr_ratio: float = opt(0.0, "final learning rate as a share of the peak")
    clip_grad: float = opt(0.0, "clip gradients at this global norm, 0 = off (Table 3: 1.0)")
    label_smoothing: float = opt(0.0, "label smoothing (Szegedy et al. 2016; DeiT: 0.1)")
    accum_steps: int = opt(1, "gradient accumulation steps: effective batch = batch_size x accum_steps")
    ema: float = opt(0.0, "exponential moving average of the weights, decay per step, 0 = off (DeiT: 0.99996)")
    drloc: float = opt(0.0, "weight of the dense relative localization loss: predict the grid offset of two output "
                       "tokens (Liu et al. 2021: 0.1 for ViTs), 0 = off; skipped with a frozen backbone, which it cannot train")
    drloc_pairs: int = opt(64, "token pairs per image for the dense relative localization loss (Liu et al. 2021: 64)")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = opt(10, "training epochs")
    batch_size: int = opt(32, "images per step")
    seed: int = opt(42, "random seed: same seed, same run (on the CPU; on a GPU with --deterministic)")
    deterministic: bool = opt(False, "deterministic algorithms only, so that a GPU run (and its resume) repeats exactly; "
                              "slower on a GPU, no effect on the CPU's results")
    device: str = opt("auto", "'auto' (CUDA if present), 'cpu', 'cuda', 'cuda:1', 'mps'")
    amp: bool = opt(True, "bf16 autocast on CUDA (ignored on the CPU)")
    compile: bool = opt(False, "torch.compile the model")
    eval_every: int = opt(1, "evaluate on the validation and test splits every N epochs (and always at the end)")
    pretrained: str = opt("", "start from weights: torchvision:NAME, timm:NAME or a file")
    freeze_backbone: bool = opt(False, "train the head only (feature extractor)")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; saved as config.json."""

    recipe: str = DEFAULT_RECIPE
    model: str = "ViT-B/16"
    vit: dict = field(default_factory=dict)  # ViTConfig overrides (dropout, pool, image_size, ...)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(
            recipe=d.get("recipe", DEFAULT_RECIPE),
            model=d.get("model", cls.model),
            vit=dict(d.get("vit", {})),
            data=_build(DataConfig, d.get("data", {})),
            optim=_build(OptimConfig, d.get("optim", {})),
            train=_build(TrainConfig, d.get("train", {})),
        )


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
# ViTConfig fields offered as options; num_classes comes from the data, in_channels is always 3.
VIT_OPTIONS = tuple(f for f in fields(ViTConfig) if f.name not in ("num_classes", "in_channels"))


def _build(cls, values: dict):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    # TOML and JSON give lists where the dataclass holds tuples
    return cls(**{k: tuple(v) if isinstance(known[k].default, tuple) else v for k, v in values.items()})


# ------------------------------------------------------------------------------------ recipes


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_path(name_or_file: str) -> Path:
    path = Path(name_or_file)
    if path.suffix == ".toml" and path.is_file():
        return path
    builtin = RECIPES_DIR / f"{name_or_file}.toml"
    if builtin.is_file():
        return builtin
    raise ValueError(f"unknown recipe {name_or_file!r}: expected one of {', '.join(list_recipes())} or a path to a .toml file")


def load_recipe(name_or_file: str = DEFAULT_RECIPE) -> RunConfig:
    """A RunConfig with the recipe's values over the dataclass defaults."""
    path = recipe_path(name_or_file)
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"recipe {path} is not valid TOML: {err}") from err
    allowed = {"model", "vit", *SECTIONS}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"recipe {path}: unknown section(s) or key(s) {', '.join(unknown)}; expected {', '.join(sorted(allowed))}")
    _check_vit(values.get("vit", {}), str(path))
    name = path.stem if path.parent == RECIPES_DIR else str(path)
    return RunConfig.from_dict({**values, "recipe": name})


def _check_vit(values: dict, where: str) -> None:
    known = {f.name for f in VIT_OPTIONS}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown model setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


# ------------------------------------------------------------------------------------ command line


def _flag(f) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _arg_type(f):
    """The option's parser, from the field's default (every field has one)."""
    default = f.default
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, tuple):
        return _parse_floats
    if isinstance(default, (int, float)):
        return type(default)
    return str


def _choices(f):
    return f.metadata.get("choices") or _LITERALS.get(f.name)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per field of ViTConfig (model), DataConfig, OptimConfig and TrainConfig."""
    seen: set[str] = set()
    groups = [("model", VIT_OPTIONS, "vit")] + [(name, fields(cls), name) for name, cls in SECTIONS.items()]
    for title, group_fields, dest_prefix in groups:
        group = parser.add_argument_group(f"{title} settings (override the recipe)")
        for f in group_fields:
            flag = _flag(f)
            if flag in seen:
                raise RuntimeError(f"duplicate option {flag}: config field names must be unique across sections")
            seen.add(flag)
            help_text = f.metadata.get("help", "")
            group.add_argument(flag, dest=f"{dest_prefix}.{f.name}", type=_arg_type(f), choices=_choices(f),
                               default=None, help=help_text, metavar=None if _choices(f) else f.name.upper())


def apply_overrides(config: RunConfig, args: argparse.Namespace, model: str | None = None) -> RunConfig:
    """The recipe's config with every option the user gave on the command line."""
    changes: dict[str, dict] = {"vit": dict(config.vit), **{name: {} for name in SECTIONS}}
    for dest, value in vars(args).items():
        if value is None or "." not in dest:
            continue
        section, name = dest.split(".", 1)
        if section in changes:
            changes[section][name] = value
    return replace(
        config,
        model=model or config.model,
        vit=changes["vit"],
        **{name: replace(getattr(config, name), **changes[name]) for name in SECTIONS},
    )


def given_overrides(args: argparse.Namespace) -> list[str]:
    """The config options present on a command line (for refusing them with --resume)."""
    return [dest for dest, value in vars(args).items() if value is not None and "." in dest]
