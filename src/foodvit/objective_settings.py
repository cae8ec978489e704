"""The training objectives' settings, as data: for each objective beside the classes, the OptimConfig field of
its weight (0 = off), every setting of its own, whether it reads the CNN teacher, and the settings that mean
something only with it on. config.py checks settings with it, training/objectives builds the objectives it
names, training/teacher.py and tuning/space.py derive from it which settings shape the teacher alone and
which a search space may not draw with their objective off. No PyTorch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from foodvit.errors import ConfigError

OptimConfig = Any  # config.OptimConfig, which imports this module

CONTRAST_TEMPERATURE = 0.2  # --contrast-temperature's default: the option counts as given when it differs


@dataclass(frozen=True)
class Dependent:
    """A setting that means something only with its objective on: its key in the settings, its value
    when unused (off), what any other value asks for, and what the setting does (for the error)."""

    key: str  # "optim.mask_pixels", or "vit.distill_token" (checked by RunConfig, beside the model's settings)
    off: object
    what: str
    does: str


@dataclass(frozen=True)
class ObjectiveSettings:
    """A training objective's settings in OptimConfig (training/objectives/ holds the objective): its
    weight (0 = off), every setting of its own (they shape the ViT's training alone, never the CNN
    teacher's), whether it reads the CNN teacher, and the settings that need it on."""

    name: str  # the OptimConfig field of its weight, and the objective's name in training/objectives
    title: str
    settings: tuple[str, ...]
    teacher: bool = False
    dependents: tuple[Dependent, ...] = ()
    example: str = "1"  # a weight to suggest in an error

    def on(self, optim: OptimConfig) -> bool:
        return getattr(optim, self.name) > 0

    def check(self, optim: OptimConfig) -> None:
        """A one-line ConfigError for a dependent optimiser setting given while the objective is off."""
        if self.on(optim):
            return
        for dep in self.dependents:
            section, _, field = dep.key.partition(".")
            if section == "optim" and getattr(optim, field) != dep.off:
                option, weight = "--" + field.replace("_", "-"), "--" + self.name.replace("_", "-")
                raise ConfigError(
                    f"{option} {dep.does}: add {weight} W (e.g. {weight} {self.example}), or leave {option} out"
                )


# The training objectives beside the classes, in the order the trainer adds their terms (training/objectives).
OBJECTIVES = (
    ObjectiveSettings("drloc", "dense relative localization", ("drloc", "drloc_pairs")),
    ObjectiveSettings(
        "masked",
        "masked-patch reconstruction",
        ("masked", "mask_ratio", "mask_pixels"),
        dependents=(
            Dependent(
                "optim.mask_pixels",
                False,
                "hidden pixels",
                "hides the pixels of the patches that --masked reconstructs",
            ),
        ),
    ),
    ObjectiveSettings(
        "guidance",
        "locality guidance",
        ("guidance", "guidance_schedule", "guidance_stages"),
        teacher=True,
        dependents=(
            Dependent(
                "optim.guidance_schedule",
                "constant",
                "a schedule other than constant",
                "sets how the weight of --guidance changes over the epochs",
            ),
            Dependent(
                "optim.guidance_stages",
                3,
                "the teacher's fourth stage",
                "sets which of the teacher's stages --guidance reads",
            ),
        ),
    ),
    ObjectiveSettings(
        "distill",
        "distillation",
        ("distill", "distill_temperature"),
        teacher=True,
        dependents=(
            Dependent(
                "optim.distill_temperature",
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
        ("contrast", "contrast_temperature"),
        example="0.5",
        dependents=(
            Dependent(
                "optim.contrast_temperature",
                CONTRAST_TEMPERATURE,
                f"a temperature other than {CONTRAST_TEMPERATURE:g}",
                "sets how sharply --contrast compares the two views",
            ),
        ),
    ),
)
OBJECTIVE_SETTINGS = {o.name: o for o in OBJECTIVES}
# The optimiser's settings that shape the ViT's training alone, never the CNN teacher's: the objectives' own, the
# self-supervised stage's, the average of the weights and sharpness-aware minimisation.
STUDENT_SETTINGS = (
    *(s for o in OBJECTIVES for s in o.settings),
    "pretrain_epochs",
    "pretrain_mask_ratio",
    "ema",
    "sam",
)


def reads_teacher(optim: OptimConfig) -> bool:
    """Whether an objective that is on reads the CNN teacher (the run trains one unless its backbone is frozen)."""
    return any(o.teacher and o.on(optim) for o in OBJECTIVES)
