"""The training objectives' settings, as data, and the one registry of the objectives: each objective beside the
classes has a section of a run's settings named after it (its weight, 0 = off, and its own settings), and a line
in OBJECTIVES that says whether it reads the CNN teacher and which settings mean something only with it on.
Everything else follows from the table: RunConfig's sections (foodvit.settings.run), their command-line options,
the objectives a run builds (training/objectives finds each in the module named after its section), the order
the trainer adds their terms in, and which settings shape the ViT alone (the CNN teacher's settings) and which a
search space may not draw with their objective off (tuning/space.py). Adding an objective: its section here, one
line in OBJECTIVES, and its module in training/objectives. No PyTorch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from foodvit.errors import ConfigError
from foodvit.settings.fields import AT_LEAST_0, AT_LEAST_1, POSITIVE, SHARE_ABOVE_0, Range, check_fields, flag_of, opt

CONTRAST_TEMPERATURE = 0.2  # --contrast-temperature's default: the option counts as given when it differs
GUIDANCE_SCHEDULES = ("constant", "linear")  # the weight of locality guidance over the epochs (objectives/guidance.py)


def _check_section(section) -> None:
    """A section's fields in their ranges, and its dependent settings at their off values while its weight is 0:
    else a one-line ConfigError naming the options (the same as the command line's)."""
    check_fields(section)
    objective = next(o for o in OBJECTIVES if o.settings is type(section))
    if section.weight > 0:
        return
    by_name = {f.name: f for f in fields(section)}
    for dep in objective.dependents:
        where, _, name = dep.key.partition(".")
        if where == objective.name and getattr(section, name) != dep.off:
            option, weight = flag_of(by_name[name]), flag_of(by_name["weight"])
            raise ConfigError(
                f"{option} {dep.does}: add {weight} W (e.g. {weight} {objective.example}), or leave {option} out"
            )


@dataclass(frozen=True)
class DrlocSettings:
    """Dense relative localization (training/objectives/drloc.py)."""

    weight: float = opt(
        0.0,
        "weight of the dense relative localization loss: an auxiliary head predicts the grid offset "
        "of two output tokens (Liu et al. 2021), 0 = off; none with a frozen backbone",
        flag="drloc",
        range=AT_LEAST_0,
    )
    pairs: int = opt(64, "token pairs per image for --drloc", flag="drloc_pairs", range=AT_LEAST_1)

    def __post_init__(self) -> None:
        _check_section(self)


@dataclass(frozen=True)
class MaskedSettings:
    """Masked-patch reconstruction (training/objectives/masked.py)."""

    weight: float = opt(
        0.0,
        "weight of masked-patch reconstruction: --mask-ratio of each training image's patches shown as "
        "a learned mask token, a linear decoder predicts their pixels, 0 = off; needs --pool gap or seq",
        flag="masked",
        range=AT_LEAST_0,
    )
    ratio: float = opt(
        0.25, "share of each training image's patches hidden with --masked", flag="mask_ratio", range=SHARE_ABOVE_0
    )
    pixels: bool = opt(
        False,
        "with --masked: also set the hidden patches' pixels to 0 before the tokeniser, so that "
        "a conv or spt stem cannot show them to their neighbours' tokens",
        flag="mask_pixels",
    )

    def __post_init__(self) -> None:
        _check_section(self)


@dataclass(frozen=True)
class GuidanceSettings:
    """Locality guidance from the CNN teacher (training/objectives/guidance.py)."""

    weight: float = opt(
        0.0,
        "weight of locality guidance: a few blocks' patch tokens predict, through 1x1 adapters, the "
        "feature maps of a CNN teacher trained first on the same photos (Li et al. 2022), 0 = off; none "
        "with a frozen backbone",
        flag="guidance",
        range=AT_LEAST_0,
    )
    schedule: str = opt(
        "constant",
        "the weight of --guidance over the epochs: constant, or linear from --guidance "
        "down towards 0 (epoch e of E weighs W x (1 - e/E))",
        flag="guidance_schedule",
        choices=GUIDANCE_SCHEDULES,
    )
    stages: int = opt(
        3,
        "the teacher's first stages that guide with --guidance: 3 (blocks before the last) or 4 "
        "(the last block too; needs --pool gap or seq)",
        flag="guidance_stages",
        range=Range(3, 4),
    )

    def __post_init__(self) -> None:
        _check_section(self)


@dataclass(frozen=True)
class DistillSettings:
    """Distillation from the CNN teacher (training/objectives/distill.py)."""

    weight: float = opt(
        0.0,
        "weight of distillation from a CNN teacher trained first on the same photos (DeiT): its "
        "predicted classes, or with --distill-temperature its probabilities, 0 = off; none with a frozen "
        "backbone",
        flag="distill",
        range=AT_LEAST_0,
    )
    temperature: float = opt(
        0.0,
        "with --distill: match the teacher's class probabilities softened at this "
        "temperature, --distill x T^2 x KL(teacher || student); 0 = its predicted classes",
        flag="distill_temperature",
        range=AT_LEAST_0,
    )

    def __post_init__(self) -> None:
        _check_section(self)


@dataclass(frozen=True)
class ContrastSettings:
    """Instance discrimination (training/objectives/contrast.py)."""

    weight: float = opt(
        0.0,
        "weight of instance discrimination: a second view of each image (cropped, flipped and "
        "recoloured at random) goes through the ViT, and each pooled state learns to find its photo's "
        "other view in the batch (SimCLR's NT-Xent), 0 = off; none with a frozen backbone",
        flag="contrast",
        range=AT_LEAST_0,
    )
    temperature: float = opt(
        CONTRAST_TEMPERATURE,
        "temperature of --contrast's cosine similarities",
        flag="contrast_temperature",
        range=POSITIVE,
    )

    def __post_init__(self) -> None:
        _check_section(self)


@dataclass(frozen=True)
class Dependent:
    """A setting that means something only with its objective on: its key in the settings, its value
    when unused (off), what any other value asks for, and what the setting does (for the error)."""

    key: str  # "masked.pixels", or "vit.distill_token" (checked by RunConfig, beside the model's settings)
    off: object
    what: str
    does: str


@dataclass(frozen=True)
class ObjectiveSettings:
    """A training objective's line in the registry: its name (its section of the settings, and its module in
    training/objectives), its section's dataclass (the weight, 0 = off,
    and every setting of its own; they shape the ViT's training alone, never the CNN teacher's), whether it
    reads the CNN teacher, and the settings that need it on."""

    name: str
    title: str
    settings: type
    teacher: bool = False
    dependents: tuple[Dependent, ...] = ()
    example: str = "1"  # a weight to suggest in an error

    @property
    def weight_key(self) -> str:
        return f"{self.name}.weight"


# The training objectives beside the classes, in config.json's order and the order the trainer builds them and adds
# their terms in (training/objectives).
OBJECTIVES = (
    ObjectiveSettings("drloc", "dense relative localization", DrlocSettings),
    ObjectiveSettings(
        "masked",
        "masked-patch reconstruction",
        MaskedSettings,
        dependents=(
            Dependent(
                "masked.pixels", False, "hidden pixels", "hides the pixels of the patches that --masked reconstructs"
            ),
        ),
    ),
    ObjectiveSettings(
        "guidance",
        "locality guidance",
        GuidanceSettings,
        teacher=True,
        dependents=(
            Dependent(
                "guidance.schedule",
                "constant",
                "a schedule other than constant",
                "sets how the weight of --guidance changes over the epochs",
            ),
            Dependent(
                "guidance.stages",
                3,
                "the teacher's fourth stage",
                "sets which of the teacher's stages --guidance reads",
            ),
        ),
    ),
    ObjectiveSettings(
        "distill",
        "distillation",
        DistillSettings,
        teacher=True,
        dependents=(
            Dependent(
                "distill.temperature",
                0.0,
                "a temperature above 0",
                "softens the classes of a teacher that --distill reads",
            ),
            Dependent(
                "vit.distill_token", False, "the distillation token", "trains its own head on a teacher's classes"
            ),
        ),
    ),
    ObjectiveSettings(
        "contrast",
        "instance discrimination",
        ContrastSettings,
        example="0.5",
        dependents=(
            Dependent(
                "contrast.temperature",
                CONTRAST_TEMPERATURE,
                f"a temperature other than {CONTRAST_TEMPERATURE:g}",
                "sets how sharply --contrast compares the two views",
            ),
        ),
    ),
)
OBJECTIVE_SETTINGS = {o.name: o for o in OBJECTIVES}
# The settings that shape the ViT's training alone, never the CNN teacher's, as whole sections or "section.name":
# the objectives' sections, the self-supervised stage's, the average of the weights and sharpness-aware minimisation.
STUDENT_SETTINGS = (*(o.name for o in OBJECTIVES), "pretrain", "optim.ema", "optim.sam")
