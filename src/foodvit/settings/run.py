"""A run's settings (RunConfig), saved as config.json: one frozen dataclass section per concern, the model's
settings over its variant (VitSettings, foodvit.settings.model), the data, the optimiser, one per training
objective (foodvit.settings.objectives), the CNN teacher, the self-supervised pre-training and the training. A
setting is named "section.name" (foodvit.settings.overrides); settings in the flat layout (the objectives', the
teacher's and the pre-training's inside optim) are read through one table (foodvit.settings.layout). The recipes
that fill them (TOML files) are read by foodvit.recipes, one layer up.

Every number's allowed range and every text setting's choices are named once, in the field's
metadata: the dataclasses check them when built (from a recipe, a config.json or Python), and the
command line (cli/options.py, which generates one option per field) checks them as it parses, with
the same message. This module imports no PyTorch and knows nothing of argparse or of pre-trained
weights.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from foodvit.errors import ConfigError, FoodVitError
from foodvit.settings.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    SHARE,
    SHARE_ABOVE_0,
    SHARE_BELOW_1,
    SIDE_OR_0,
    Range,
    check_fields,
    generated_fields,
    opt,
)
from foodvit.settings.layout import current_layout
from foodvit.settings.model import VitSettings
from foodvit.settings.objectives import OBJECTIVES, ObjectiveSettings

# Choices of the run's text settings, named once (preprocess.py and transforms.py read them from here).
RESIZE_MODES = ("crop", "square")
INTERPOLATIONS = ("bilinear", "bicubic")
AUGMENT_PRESETS = ("none", "flip", "light", "medium", "strong")
TEACHERS = ("resnet18", "resnet34", "resnet50")  # torchvision architectures a run can train as its distillation teacher
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")

DEFAULT_RECIPE = "default"


@dataclass(frozen=True)
class DataConfig:
    source: str = opt(
        "",
        "data: a URL of a zip, a local zip, a folder with train/ and test/, or food101 (Food-101, downloaded "
        "once; food101:pizza,steak,sushi for some of its classes) (default: $FOODVIT_DATA, else the course's "
        "pizza_steak_sushi.zip); a run stores the source it used",
        flag="data",
    )
    train_fraction: float = opt(
        1.0,
        "train on this share of each class's training photos, drawn with the seed "
        "(the course's 20%% of Food-101: --data food101 --train-fraction 0.2)",
        range=SHARE_ABOVE_0,
    )
    val_fraction: float = opt(
        0.0, "share of each training class held out as a validation split for model selection", range=SHARE_BELOW_1
    )
    validate_on: str = opt(
        "",
        "judge the run on these photos (a folder of class folders, or a set with train/ and test/: both) where it "
        "evaluates during training, and again at the end beside the test split, which is then read once; a photo "
        "whose bytes are also in the run's data is dropped and counted",
        flag="validate-on",
    )
    resize_mode: str = opt(
        "crop",
        "eval preprocessing: 'crop' resizes the shorter side then centre-crops; "
        "'square' squashes to a square (the course)",
        choices=RESIZE_MODES,
    )
    crop_pct: float = opt(
        0.875,
        "with resize_mode=crop, crop size / resize size (0.875: 224 from 256)",
        range=Range(0.1, 1, hint="timm's models crop 0.875 to 1 of the resized photo"),  # 1e-310: a side of 1e312
    )
    interpolation: str = opt("bilinear", "resize interpolation", choices=INTERPOLATIONS)
    test_size: int = opt(
        0,
        "after training, test and save the model at this resolution, position embeddings resampled "
        "(FixRes, Touvron et al. 2019: random crops make objects look larger in training than a centre "
        "crop at test; a test size above the training one evens that out); 0 = the training size",
        range=SIDE_OR_0,
    )
    start_size: int = opt(
        0,
        "progressive resizing (Tan & Le 2021, EfficientNetV2): train the first --start-share of the epochs "
        "at this resolution, each batch resized before the model (needs fixed position embeddings); 0 = off",
        range=SIDE_OR_0,
    )
    start_share: float = opt(0.67, "share of the epochs trained at --start-size", range=SHARE)
    mean: tuple[float, ...] = opt(
        (), "normalisation mean, three numbers (default: the model's or the weights')", range=Range()
    )
    std: tuple[float, ...] = opt(
        (), "normalisation std, three positive numbers (default: the model's or the weights')", range=POSITIVE
    )
    augment: str = opt("none", "augmentation preset", choices=AUGMENT_PRESETS)
    scale_min: float = opt(
        0.25, "smallest crop area share of random resized crops (light, medium and strong presets)", range=SHARE_ABOVE_0
    )
    random_erasing: float = opt(0.0, "probability of random erasing (Zhong et al. 2020; DeiT: 0.25)", range=SHARE)
    mixup: float = opt(0.0, "mixup alpha, 0 = off (Zhang et al. 2018; DeiT: 0.8)", range=AT_LEAST_0)
    cutmix: float = opt(0.0, "cutmix alpha, 0 = off (Yun et al. 2019; DeiT: 1.0)", range=AT_LEAST_0)
    mix_prob: float = opt(1.0, "probability that a batch is mixed when mixup or cutmix is on", range=SHARE)
    repeated_aug: int = opt(
        1,
        "repeated augmentation: each image appears this many times an epoch (Hoffer et al. 2020; DeiT: 3)",
        range=AT_LEAST_1,
    )
    cache: bool = opt(
        True,
        "decode each photo once and keep it in memory (small data sets; JPEG decoding dominates CPU time); "
        "on or off, a run computes exactly the same",
    )
    cache_gb: float = opt(
        4.0,
        "memory budget of that cache in GiB, per process: photos past it are decoded each time they are used",
        range=Range(0, lo_open=True, hint="for no cache at all, use --no-cache"),
    )
    workers: int = opt(
        0,
        "DataLoader worker processes, kept up between epochs (0: load in the training process; "
        "on a GPU try 4-8); any number from 1 up gives the same run, and at most one a core is started",
        range=AT_LEAST_0,
    )
    strict: bool = opt(False, "refuse corrupt or non-image files instead of skipping them")

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("mean", "std"):
            if len(getattr(self, name)) not in (0, 3):
                raise ConfigError(f"--{name} takes three numbers (red, green, blue), got {len(getattr(self, name))}")
        if self.validate_on and self.val_fraction:
            raise ConfigError(
                "--validate-on and --val-fraction both give the run a validation split: keep one of the two"
            )


@dataclass(frozen=True)
class OptimConfig:
    """The optimiser and its step, shared by every network a run trains (the ViT, its pre-training and its CNN
    teacher, except where a help text says otherwise). Label smoothing is here because it is a setting of the
    step's classification loss, which the teacher trains with too; sharpness-aware minimisation because it
    changes how a step's gradient is taken, and the average of the weights (ema) because it follows every step:
    both are the ViT's alone (objectives.STUDENT_SETTINGS). Each objective's settings are in its own
    section (objectives.OBJECTIVES), the teacher's and the pre-training's too."""

    optimizer: str = opt("adamw", "optimiser", choices=OPTIMIZERS)
    # at most 10: past it a step of Adam or SGD throws every weight to infinity (10^300 overflowed in the optimiser)
    lr: float = opt(
        1e-3,
        "peak learning rate",
        range=Range(0, 10, lo_open=True, hint="the paper's are 1e-3 to 0.06; larger ones diverge"),
    )
    betas: tuple[float, float] = opt((0.9, 0.999), "Adam betas (Table 3: 0.9, 0.999)", range=SHARE_BELOW_1)
    momentum: float = opt(0.9, "SGD momentum (fine-tuning: 0.9)", range=SHARE_BELOW_1)
    weight_decay: float = opt(0.05, "weight decay", range=AT_LEAST_0)
    decay_all: bool = opt(
        False, "decay every parameter, biases, norms, class token and position embedding included (the course)"
    )
    schedule: str = opt("cosine", "learning-rate decay after warmup", choices=SCHEDULES)
    warmup_epochs: float = opt(0.0, "linear warmup from 0, in epochs (fractions allowed)", range=AT_LEAST_0)
    min_lr_ratio: float = opt(0.0, "final learning rate as a share of the peak", range=SHARE)
    clip_grad: float = opt(0.0, "clip gradients at this global norm, 0 = off (Table 3: 1.0)", range=AT_LEAST_0)
    label_smoothing: float = opt(0.0, "label smoothing (Szegedy et al. 2016; DeiT: 0.1)", range=SHARE_BELOW_1)
    sam: float = opt(
        0.0,
        "sharpness-aware minimisation's radius (Foret et al. 2021: 0.05): each step's gradient taken again "
        "at the worst nearby weights, twice the compute; 0 = off; not in the teacher's or pre-training's",
        range=AT_LEAST_0,
    )
    accum_steps: int = opt(
        1, "gradient accumulation steps: effective batch = batch_size x accum_steps", range=AT_LEAST_1
    )
    ema: float = opt(
        0.0, "exponential moving average of the weights, decay per step, 0 = off (DeiT: 0.99996)", range=SHARE_BELOW_1
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if len(self.betas) != 2:
            raise ConfigError(f"--betas takes two numbers (beta1, beta2), got {len(self.betas)}")


@dataclass(frozen=True)
class TeacherSettings:
    """The CNN teacher that distillation and locality guidance read (training/teacher.py)."""

    architecture: str = opt(
        "resnet18",
        "the CNN teacher of --distill and --guidance: a torchvision architecture trained from "
        "random initialisation in the run, on its photos with its optimiser and schedule",
        flag="teacher",
        choices=TEACHERS,
    )
    epochs: int = opt(
        0,
        "epochs the CNN teacher trains for, on a schedule of its own (its warmup at most half of them); "
        "0 = the run's --epochs",
        flag="teacher_epochs",
        range=AT_LEAST_0,
    )
    size: int = opt(
        0,
        "side in pixels of the photos the CNN teacher trains on (its batches resized, as progressive resizing "
        "does); the objectives that read it still give it the ViT's batches; 0 = the model's image size",
        flag="teacher_size",
        range=SIDE_OR_0,
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class PretrainSettings:
    """The self-supervised pre-training stage before the supervised epochs (training/pretrain.py)."""

    epochs: int = opt(
        0,
        "epochs of self-supervised pre-training on the training photos before the supervised "
        "ones: the hidden patches' pixels predicted, the classes not read, 0 = off; needs --pool gap "
        "or seq",
        flag="pretrain_epochs",
        range=AT_LEAST_0,
    )
    mask_ratio: float = opt(
        0.5,
        "share of each image's patches hidden in pre-training (--pretrain-epochs)",
        flag="pretrain_mask_ratio",
        range=SHARE_ABOVE_0,
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = opt(10, "training epochs", range=AT_LEAST_1)
    batch_size: int = opt(32, "images per step", range=AT_LEAST_1)
    seed: int = opt(
        42, "random seed: same seed, same run (on the CPU; on a GPU with --deterministic)", range=AT_LEAST_0
    )
    deterministic: bool = opt(
        False,
        "deterministic algorithms only, so that a GPU run (and its resume) repeats exactly; "
        "slower on a GPU, no effect on the CPU's results",
    )
    device: str = opt("auto", "'auto' (CUDA if present), 'cpu', 'cuda', 'cuda:1', 'mps'")
    amp: bool = opt(
        True,
        "bf16 autocast: on CUDA, and for the training steps on a CPU with native bf16 (AVX512-BF16 or AMX); "
        "ignored elsewhere (other CPUs, MPS)",
    )
    compile: bool = opt(False, "torch.compile the model")
    eval_every: int = opt(
        1, "evaluate on the validation and test splits every N epochs (and always at the end)", range=AT_LEAST_1
    )
    pretrained: str = opt("", "start from weights: torchvision:NAME, timm:NAME or a file")
    freeze_backbone: bool = opt(False, "train the head only (feature extractor)")
    tensorboard: bool = opt(
        False, "also write TensorBoard event files into RUN/tensorboard (tensorboard --logdir runs/ compares runs)"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not DEVICE_PATTERN.match(self.device):
            raise ConfigError(f"--device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")


@dataclass(frozen=True)
@generated_fields(((o.name, o.settings, field(default_factory=o.settings)) for o in OBJECTIVES), after="optim")
class RunConfig:
    """Everything a run needs; saved as config.json. Beside the model's settings (vit), the data, the optimiser
    and the training: a section per training objective, after optim (one field each, named after it, generated
    from the objectives' table, objectives.OBJECTIVES), the CNN teacher's and the self-supervised pre-training
    stage's."""

    recipe: str = DEFAULT_RECIPE
    model: str = "ViT-B/16"
    vit: VitSettings = field(default_factory=VitSettings)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    teacher: TeacherSettings = field(default_factory=TeacherSettings)
    pretrain: PretrainSettings = field(default_factory=PretrainSettings)
    train: TrainConfig = field(default_factory=TrainConfig)

    if TYPE_CHECKING:  # the generated sections, as a type checker sees them

        def __getattr__(self, objective: str) -> Any: ...

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ConfigError(f"model must be a paper name such as ViT-Ti/8 or ViT-B/16, got {self.model!r}")
        if not isinstance(self.recipe, str):
            raise ConfigError(f"recipe must be a recipe's name or file, got {self.recipe!r}")
        if not isinstance(self.vit, VitSettings):
            raise ConfigError(
                f"vit: expected the model's settings as VitSettings, got {type(self.vit).__name__}; "
                "give VitSettings(depth=..., ...) or VitSettings.from_dict(settings), or read a whole run's settings "
                "with RunConfig.from_dict"
            )
        if self.pretrain.epochs and self.train.freeze_backbone:
            raise ConfigError(
                "--pretrain-epochs pre-trains the backbone, which --freeze-backbone keeps as it is: drop one of the two"
            )
        if self.vit.distill_token and (self.distill.weight <= 0 or self.train.freeze_backbone):
            raise ConfigError(
                "--distill-token trains its own head on a teacher's classes: add --distill W (e.g. --distill 1) "
                "and train the whole model (no --freeze-backbone)"
            )

    def to_dict(self) -> dict:
        """The settings as config.json holds them: the model's settings given, every other setting."""
        return {**asdict(self), "vit": self.vit.given()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict, where: str = "settings") -> RunConfig:
        """Settings as config.json, a recipe or a study holds them, in this layout or in the one before the
        objectives, the teacher and the pre-training had sections of their own (MOVED)."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object of settings, got {type(d).__name__}")
        d = current_layout(d, where)
        unknown = sorted(set(d) - {"recipe", "model", "vit", *SECTIONS})
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)}; expected recipe, model, vit, {', '.join(SECTIONS)}"
            )
        return cls(
            recipe=d.get("recipe", DEFAULT_RECIPE),
            model=d.get("model", cls.model),
            vit=VitSettings.from_dict(d.get("vit", {})),
            **{name: _build(section, d.get(name, {})) for name, section in SECTIONS.items()},
        )


def settings_sectioned(stored: dict) -> dict:
    """Settings a run or a study stored, as this version writes them: in the sectioned layout, and a setting added
    since is absent from them and counts at its default (a new setting's default keeps the old behaviour, so the
    recipe is the same). Settings this version cannot read (a setting since removed, a wrong type) come back
    as stored, in the sectioned layout where they can be, so that a comparison shows them rather than drops them."""
    try:
        return RunConfig.from_dict(stored).to_dict()
    except (FoodVitError, TypeError):
        try:
            return current_layout(stored) if isinstance(stored, dict) else stored
        except FoodVitError:
            return stored


# The sections of a run's settings beside the model's, by name, in config.json's order (an objective's section
# holds its line's dataclass, objectives.OBJECTIVES).
SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in fields(RunConfig)
    if f.name not in ("recipe", "model", "vit")
}


def _build(cls, values: dict):
    known, section = {f.name: f for f in fields(cls)}, next(n for n, kind in SECTIONS.items() if kind is cls)
    if not isinstance(values, dict):  # e.g. `teacher = "resnet34"` in a recipe
        example = f"[{section}] {fields(cls)[0].name} = {json.dumps(fields(cls)[0].default)}"
        raise ConfigError(f"[{section}] is a section of settings, e.g. {example}, not a {type(values).__name__}")
    if unknown := sorted(set(values) - set(known)):
        raise ConfigError(f"unknown setting(s) [{section}] {', '.join(unknown)}; [{section}] has {', '.join(known)}")
    return cls(  # JSON and TOML give lists where the settings keep tuples
        **{k: tuple(v) if isinstance(known[k].default, tuple) and isinstance(v, list) else v for k, v in values.items()}
    )


def objectives_on(config: RunConfig) -> tuple[ObjectiveSettings, ...]:
    """The training objectives the settings turn on (their weight above 0), in the table's order."""
    return tuple(o for o in OBJECTIVES if getattr(config, o.name).weight > 0)


def reads_teacher(config: RunConfig) -> bool:
    """Whether an objective that is on reads the CNN teacher (the run trains one unless its backbone is frozen)."""
    return any(o.teacher for o in objectives_on(config))
