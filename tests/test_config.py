"""Settings: a run directory's config.json as foodvit writes it today still loads to the same settings,
one resolve() turns a recipe and overrides into them, and the objectives' dependent settings are refused
while their objective is off, from one table (objective_settings.OBJECTIVES)."""

import json
from pathlib import Path

import pytest

import foodvit
from foodvit.config import OptimConfig, RunConfig
from foodvit.objective_settings import OBJECTIVES
from foodvit.errors import ConfigError
from foodvit.model.resolve import resolve

STORED = Path(__file__).parent / "data" / "config-default-run.json"  # `foodvit train --epochs 3 --seed 0`'s config.json


def test_a_stored_default_run_config_loads_to_the_settings_it_was_written_from():
    stored = json.loads(STORED.read_text())
    config = RunConfig.from_dict(stored, where=str(STORED))
    written, default = json.loads(config.to_json()), RunConfig().to_dict()
    for section, values in stored.items():  # read and written back unchanged; a setting added since at its default
        if isinstance(values, dict) and section != "vit":
            added = {k: v for k, v in written[section].items() if k not in values}
            assert added == {k: default[section][k] for k in added}
            assert {k: written[section][k] for k in values} == values
        else:
            assert written[section] == values
    assert config == resolve("default", {"train.epochs": 3, "train.seed": 0, "data.source": "photos"})
    assert config == foodvit.resolve("default", {"train.epochs": 3, "train.seed": 0, "data.source": "photos"})
    assert foodvit.load_recipe("default") == resolve("default")


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.name)
def test_each_dependent_setting_needs_its_objective_on(objective):
    for dep in objective.dependents:
        section, _, field = dep.key.partition(".")
        if section != "optim":
            continue
        value = {bool: True, int: 4, float: 0.5, str: "linear"}[type(dep.off)]
        with pytest.raises(ConfigError, match=f"add --{objective.name} W .*or leave --{field.replace('_', '-')} out"):
            OptimConfig(**{field: value})
        assert getattr(OptimConfig(**{objective.name: 1.0, field: value}), field) == value


def test_train_takes_a_recipe_and_overrides(tmp_path):
    from helpers import make_photo_folder

    photos = make_photo_folder(tmp_path / "photos", n_train=2, n_test=1)
    settings = {
        "data.source": str(photos),
        "train.epochs": 1,
        "vit.image_size": 32,
        "vit.depth": 1,
        "train.batch_size": 4,
    }
    result = foodvit.train("tiny", tmp_path / "run", overrides=settings, quiet=True, log=lambda *a, **k: None)
    assert len(result.history) == 1 and (tmp_path / "run" / "model.safetensors").is_file()
    stored = RunConfig.from_dict(json.loads((tmp_path / "run" / "config.json").read_text()))
    assert stored.vit["depth"] == 1 and stored.recipe == "tiny"


def test_recipe_comments_are_one_short_line_a_setting_and_speak_of_the_product_as_it_is():
    import re

    for recipe in (Path(foodvit.__file__).parent / "recipes").glob("*.toml"):
        for number, line in enumerate(recipe.read_text().splitlines(), 1):
            assert len(line) <= 100, f"{recipe.name}:{number} is over 100 characters"
            assert not re.search(r"\bsession\b|\bissue\s*\d|\bround\b", line, re.I), (
                f"{recipe.name}:{number} tells history"
            )


@pytest.mark.parametrize("key", ["epochs", "trian.epochs"])
def test_an_override_that_names_no_section_is_refused_not_ignored(key):
    from foodvit.model.resolve import resolve

    with pytest.raises(ConfigError, match="unknown setting"):
        resolve("tiny", {key: 2})
    assert resolve("tiny", {"train.epochs": 2}).train.epochs == 2
