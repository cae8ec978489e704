"""The search space of `foodvit tune`: which settings a trial samples and in which range, a
default one around a recipe's values (the settings that mattered in our ablations) or a TOML file
the user writes, every range checked as the command line checks the setting."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from foodvit.errors import ConfigError
from foodvit.model.variants import without_recipe_resizing
from foodvit.settings.layout import setting_key
from foodvit.settings.model import check_on_patch_grid
from foodvit.settings.objectives import OBJECTIVES
from foodvit.settings.overrides import check_setting, setting_field, with_settings
from foodvit.settings.run import AUGMENT_PRESETS, SECTIONS, RunConfig

# The initialisations a default space tries: impulse needs sin-cos positions, which many recipes lack (a
# space file may add it)
SEARCHED_INITS = ("jax", "mimetic")


@dataclass(frozen=True)
class Param:
    """One searched setting: a range (low, high; log scale; step for whole numbers) or choices."""

    key: str  # "optim.lr"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | None = None
    choices: tuple | None = None

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a range; a ValueError for a setting searched among choices."""
        if self.low is None or self.high is None:
            raise ValueError(f"{self.key} is searched among its choices, not over a range")
        return self.low, self.high

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if isinstance(self.low, int) and isinstance(self.high, int):
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1, log=self.log)
        low, high = self.bounds
        return trial.suggest_float(self.key, float(low), float(high), log=self.log)

    def contains(self, value) -> bool:
        if self.choices is not None:
            return value in self.choices
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        return {
            k: v
            for k, v in (
                ("low", self.low),
                ("high", self.high),
                ("log", self.log or None),
                ("step", self.step),
                ("choices", list(self.choices) if self.choices is not None else None),
            )
            if v is not None
        }


def base_values(config: RunConfig) -> dict:
    """Every setting's value in a config, by "section.name", the model's from its variant and overrides."""
    from dataclasses import asdict

    from foodvit.model.variants import run_model_config

    vit = asdict(run_model_config(config))
    values = {f"vit.{k}": v for k, v in vit.items()}
    for name in SECTIONS:
        values.update({f"{name}.{k}": v for k, v in asdict(getattr(config, name)).items()})
    return values


def with_starting_values(space: dict[str, Param], config: RunConfig) -> tuple[dict[str, Param], dict[str, Any]]:
    """The space with the starting recipe's value added to the choices of each setting whose choices
    lack it, and those settings' starting values by key. The first trial is the starting recipe, and Optuna tries a
    setting searched among choices only as one of them (a starting number outside a range is tried
    as it is); so a recipe of `augment = "flip"` and a space of ["light", "medium"] searches all three."""
    start = base_values(config)
    searched, widened = dict(space), {}
    for key, p in space.items():
        if p.choices is not None and start[key] not in p.choices:
            searched[key] = replace(p, choices=(start[key], *p.choices))
            widened[key] = start[key]
    return searched, widened


def default_space(config: RunConfig) -> dict[str, Param]:
    """Ranges around the starting recipe's values (each contains them): lr, weight decay,
    augmentation, depth, width (multiples of the heads: every head keeps D/h channels; the MLP
    follows at the recipe's ratio), image size (on the patch grid), drloc weight, init,
    drop_path, epochs."""
    v = base_values(config)
    patch, heads, width, grid = (
        v["vit.patch_size"],
        v["vit.num_heads"],
        v["vit.embed_dim"],
        v["vit.image_size"] // v["vit.patch_size"],
    )
    depth, epochs, lr = v["vit.depth"], v["train.epochs"], v["optim.lr"]
    widths = sorted({w for w in (width // 2, width, width + width // 2, 2 * width) if w >= heads and w % heads == 0})
    return {
        p.key: p
        for p in (
            Param("optim.lr", lr / 5, lr * 5, log=True),
            # on a log scale unless the recipe starts at 0, which a log scale cannot hold
            Param(
                "optim.weight_decay",
                min(1e-3, v["optim.weight_decay"]),
                max(0.3, v["optim.weight_decay"]),
                log=v["optim.weight_decay"] > 0,
            ),
            Param("data.augment", choices=AUGMENT_PRESETS),
            Param("vit.depth", max(1, depth // 2), depth + max(1, depth // 2)),
            Param("vit.embed_dim", choices=tuple(widths)),
            Param("vit.image_size", patch * max(1, grid // 2), patch * (grid + max(1, grid // 2)), step=patch),
            Param("drloc.weight", 0.0, max(1.0, v["drloc.weight"])),
            Param("vit.init", choices=SEARCHED_INITS),
            Param("vit.drop_path", 0.0, max(0.3, v["vit.drop_path"])),
            Param("train.epochs", max(1, epochs // 2), epochs + max(1, epochs // 2)),
        )
    }


SPACE_KEYS = {"low", "high", "log", "step", "choices"}


def read_space(path: str | Path, config: RunConfig) -> dict[str, Param]:
    """A TOML space file: a table per section, each setting a table of low/high (log, step) or
    choices, e.g. `[optim] lr = {low = 1e-4, high = 1e-2, log = true}` (a setting of the flat layout under
    its flat name too, settings.layout.MOVED). Unknown settings and values the command line would refuse are refused
    here, in one line naming the file."""
    from foodvit.recipes import read_toml

    path = Path(path)
    tables = read_toml(path, "space file")
    try:
        space: dict[str, Param] = {}
        for section, settings in tables.items():
            if not isinstance(settings, dict):
                raise ConfigError(
                    f"{section} is not a table; write tables of settings named after their sections: "
                    f"{', '.join(('vit', *SECTIONS))}"
                )
            for name, spec in settings.items():
                space[f"{section}.{name}"] = _param(setting_key(f"{section}.{name}"), spec, config)
        space = sectioned_space(space)
        if not space:
            raise ConfigError("no settings to search; e.g. [optim] lr = {low = 1e-4, high = 1e-2, log = true}")
        _check_needs(space, config)
        _check_heads(space, config)
        return space
    except ConfigError as err:
        raise ConfigError(f"space file {path}: {err}") from None


def sectioned_space(space: dict[str, Param]) -> dict[str, Param]:
    """A space whose settings may be named in the flat layout (settings.layout.MOVED), each under its section's
    name; one setting given under both names is refused in one line."""
    named: dict[str, Param] = {}
    given: dict[str, str] = {}  # the name each setting was given under
    for name, param in space.items():
        key = setting_key(name)
        if key in named:
            old = given[key] if given[key] != key else name
            raise ConfigError(f"{key} is given twice, also under its flat-layout name {old}: remove {old}")
        named[key], given[key] = replace(param, key=key), name
    return named


def _param(key: str, spec, config: RunConfig) -> Param:
    f = setting_field(key)  # unknown settings refused here
    if key == "train.seed":
        raise ConfigError("train.seed cannot be searched: the seed picks the folds, which every trial shares")
    if key == "data.source":
        raise ConfigError("data.source cannot be searched: a study is about one data set")
    if key in ("train.amp", "train.device"):
        raise ConfigError(
            f"{key} cannot be searched: it says where and in which arithmetic the trials train, one for all of them "
            f"(a search compares its trials in one); give it as an option of foodvit tune"
        )
    if not isinstance(spec, dict) or not spec or set(spec) - SPACE_KEYS:
        raise ConfigError(
            f"{key} must be a table of low and high (and log, step) or of choices, e.g. {{low = 1, high = 4}}"
        )
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise ConfigError(f"{key}: choices must be a non-empty list, alone")
        if any(isinstance(c, (list, dict)) for c in choices):
            raise ConfigError(
                f"{key}: choices must be single values (numbers, text, true or false); a setting of several numbers "
                "cannot be searched"
            )
        for c in choices:
            check_setting(key, c)
            if key == "vit.image_size":
                check_on_patch_grid(f"{key} choice", c, base_values(config)["vit.patch_size"])
        param = Param(key, choices=tuple(choices))
    else:
        if not {"low", "high"} <= set(spec):
            raise ConfigError(f"{key} needs both low and high (or choices)")
        low, high = spec["low"], spec["high"]
        whole = isinstance(f.default, int) and not isinstance(f.default, bool)
        if isinstance(f.default, (bool, str, tuple)):
            raise ConfigError(f"{key} is not a number: give its choices, e.g. {{choices = [...]}}")
        for bound in (low, high):
            if whole and not isinstance(bound, int):
                raise ConfigError(f"{key} is a whole number: low and high must be whole numbers, got {bound!r}")
            check_setting(key, bound)
        if not low < high:
            raise ConfigError(f"{key}: low must be below high, got {low} and {high}")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ConfigError(f"{key}: log must be true or false, got {log!r}")
        if log and low <= 0:
            raise ConfigError(f"{key}: a log scale needs low > 0, got {low}")
        step = spec.get("step")
        if step is not None and (not whole or not isinstance(step, int) or step < 1):
            raise ConfigError(f"{key}: step is for whole-number settings and must be a whole number >= 1, got {step!r}")
        if key == "vit.image_size":
            patch = base_values(config)["vit.patch_size"]
            check_on_patch_grid(f"{key} low", low, patch)
            check_on_patch_grid(f"{key} high", high, patch)
            step = step or patch
            check_on_patch_grid(f"{key} step", step, patch)
        if step is not None and step > 1:
            if log and key == "vit.image_size":
                raise ConfigError(
                    f"{key} moves in steps of the patch size ({step}), which a log scale cannot take: drop log"
                )
            if log:
                raise ConfigError(f"{key}: a log scale takes no step (Optuna draws it in steps of 1): drop log or step")
            if (high - low) % step:
                fits = low + max(1, (high - low) // step) * step
                raise ConfigError(
                    f"{key}: high - low ({high - low}) must be a multiple of step {step}, e.g. high = {fits}"
                )
        param = Param(key, low if whole else float(low), high if whole else float(high), log, step)
    return param


def _values(param: Param) -> list:
    """Every value a whole-number setting's Param may draw."""
    if param.choices is not None:
        return list(param.choices)
    low, high = param.bounds
    return list(range(int(low), int(high) + 1, param.step or 1))


def _check_heads(space: dict[str, Param], config: RunConfig) -> None:
    """Refuse a space in which some trial would draw a width that its heads do not divide (each head gets D / h
    channels): the widths and heads it searches, or the recipe's where it searches only one of the two."""
    if "vit.num_heads" not in space and "vit.embed_dim" not in space:
        return
    base = base_values(config)
    widths = _values(space["vit.embed_dim"]) if "vit.embed_dim" in space else [base["vit.embed_dim"]]
    heads = _values(space["vit.num_heads"]) if "vit.num_heads" in space else [base["vit.num_heads"]]
    for w in widths:
        for h in heads:
            if h and w % h:
                if "vit.num_heads" not in space:
                    raise ConfigError(
                        f"vit.embed_dim: width {w} is not a multiple of the {h} heads (each head gets D / h channels); "
                        f"give choices that are, e.g. {{choices = [{h * 32}, {h * 64}]}}"
                    )
                raise ConfigError(
                    f"vit.num_heads: {h} heads do not divide the width {w} a trial may draw (each head gets D / h "
                    "channels); give heads and widths of which every pair divides"
                )


# A setting that needs an objective on -> (the objective's weight, what a value other than the off one asks
# for, the off value, the objective's title): from the objectives' registry (settings.objectives.OBJECTIVES).
NEEDS = {dep.key: (o.weight_key, dep.what, dep.off, o.title) for o in OBJECTIVES for dep in o.dependents}


def _check_needs(space: dict[str, Param], config: RunConfig) -> None:
    """Refuse a space in which some trial would draw a setting that needs another on (distillation,
    guidance, instance discrimination) with that one off, before any trial runs (each would be refused on its own),
    and one that varies the CNN teacher where no trial has an objective on that reads it (nothing would change)."""
    base = base_values(config)

    def possible(key: str) -> tuple:  # the values a trial may draw (a range's two ends stand for it here)
        param = space.get(key)
        return (base[key],) if param is None else param.choices or (param.low, param.high)

    for key, (needed, what, off, name) in NEEDS.items():
        if (key in space or needed in space) and any(v != off for v in possible(key)) and min(possible(needed)) <= 0:
            raise ConfigError(
                f"{key} may draw {what} where {needed} may be 0, and it needs {name} on: "
                f"search {needed} above 0 (e.g. {{low = 0.5, high = 2}}) or leave {key} out"
            )
    readers = [o.weight_key for o in OBJECTIVES if o.teacher]
    varied = sorted(key for key in space if key.startswith("teacher."))
    if varied and all(max(possible(weight)) <= 0 for weight in readers):
        raise ConfigError(
            f"{varied[0]} varies the CNN teacher, which no trial reads: {' and '.join(readers)} are 0 in the recipe "
            f"and the space; search one above 0 (e.g. [{readers[0].split('.')[0]}] weight = {{low = 0.5, high = 2}}) "
            f"or leave {', '.join(varied)} out"
        )


def space_table(space: dict[str, Param]) -> dict:
    return {key: p.to_dict() for key, p in sorted(space.items())}


def trial_overrides(params: dict, base: RunConfig) -> dict:
    """A trial's settings as build_config overrides; a searched width takes the MLP along at the
    recipe's ratio (Table 1: M = 4 D) unless the MLP width is searched itself."""
    overrides = dict(params)
    if "vit.embed_dim" in params and "vit.mlp_dim" not in params:
        v = base_values(base)
        overrides["vit.mlp_dim"] = round(params["vit.embed_dim"] * v["vit.mlp_dim"] / v["vit.embed_dim"])
    return overrides


def trial_config(params: dict, base: RunConfig) -> RunConfig:
    """The settings a trial trains with: the base (the recipe and the command line) with the trial's
    settings over it; its progressive resizing stays where the trial's model can take it."""
    overrides = trial_overrides(params, base)
    return without_recipe_resizing(base, with_settings(base, overrides), overrides)
