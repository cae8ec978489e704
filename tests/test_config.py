"""Settings: a run directory's config.json as foodvit writes it, and as it wrote it before the objectives,
the CNN teacher and the pre-training had sections of their own, load to the same settings; one resolve() turns a
recipe and overrides into them; the sections come from the objectives' registry (settings.objectives.OBJECTIVES);
and the objectives' dependent settings are refused while their objective is off."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

import foodvit
from foodvit.errors import ConfigError
from foodvit.model.resolve import resolve
from foodvit.settings.fields import flag_of
from foodvit.settings.layout import MOVED
from foodvit.settings.model import VIT_OPTIONS, VitSettings
from foodvit.settings.objectives import OBJECTIVES
from foodvit.settings.overrides import setting_field
from foodvit.settings.run import SECTIONS, OptimConfig, RunConfig, objectives_on

DATA = Path(__file__).parent / "data"
# `foodvit train --epochs 3 --seed 0`'s config.json in the layout before the sections (optim held the objectives'
# settings, vit was a plain table), and the same run's settings as this version writes them
STORED = DATA / "config-default-run.json"
STORED_SECTIONS = DATA / "config-default-run-sections.json"
# (the default recipe of then trained its CNN teacher on the run's epochs and side: teacher.epochs and .size 0)
GIVEN = {"train.epochs": 3, "train.seed": 0, "data.source": "photos", "teacher.epochs": 0, "teacher.size": 0}


def test_a_stored_default_run_config_loads_to_the_settings_it_was_written_from():
    stored = json.loads(STORED.read_text())
    config = RunConfig.from_dict(stored, where=str(STORED))
    assert config == resolve("default", GIVEN) == foodvit.resolve("default", GIVEN)
    for section in ("data", "optim", "train"):  # every stored setting is where the table moved it, with its value
        for name, value in stored[section].items():
            where, _, field = MOVED.get(f"{section}.{name}", f"{section}.{name}").partition(".")
            assert json.loads(json.dumps(getattr(getattr(config, where), field))) == value, f"{section}.{name}"
    assert config.vit.given() == stored["vit"]
    assert foodvit.load_recipe("default") == resolve("default")


def test_a_config_in_sections_is_read_and_written_back_unchanged():
    text = STORED_SECTIONS.read_text()
    config = RunConfig.from_dict(json.loads(text), where=str(STORED_SECTIONS))
    assert config == RunConfig.from_dict(json.loads(STORED.read_text()))  # the two layouts: one run's settings
    assert config.to_json() + "\n" == text
    written = json.loads(text)
    assert set(written) == {"recipe", "model", "vit", *SECTIONS} and set(written["optim"]) == {
        f.name for f in fields(OptimConfig)
    }
    assert written["drloc"] == {"weight": 0.5, "pairs": 64} and written["teacher"]["architecture"] == "resnet18"


def test_each_moved_setting_keeps_its_option_and_reads_under_both_names():
    for old, new in MOVED.items():
        field = setting_field(new)
        assert flag_of(field) == "--" + old.split(".")[1].replace("_", "-")  # the command line does not change
        assert setting_field(old) is field
        assert old.split(".")[1] not in {f.name for f in fields(OptimConfig)}
    old = resolve("default", {"optim.drloc": 0.25, "optim.mask_pixels": True, "optim.teacher_epochs": 2})
    new = resolve("default", {"drloc.weight": 0.25, "masked.pixels": True, "teacher.epochs": 2})
    assert old == new and (new.drloc.weight, new.masked.pixels, new.teacher.epochs) == (0.25, True, 2)


def test_a_recipe_in_the_old_layout_is_the_same_recipe(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text(
        'model = "ViT-Ti/8"\n[vit]\nimage_size = 64\ndepth = 4\n'
        '[optim]\nlr = 2e-3\ndrloc = 0.5\nguidance = 1.0\nguidance_schedule = "linear"\nteacher = "resnet34"\n'
        "masked = 1.0\nmask_ratio = 0.5\npretrain_epochs = 2\n"
    )
    new = tmp_path / "new.toml"
    new.write_text(
        'model = "ViT-Ti/8"\n[vit]\nimage_size = 64\ndepth = 4\n[optim]\nlr = 2e-3\n[drloc]\nweight = 0.5\n'
        '[guidance]\nweight = 1.0\nschedule = "linear"\n[teacher]\narchitecture = "resnet34"\n'
        "[masked]\nweight = 1.0\nratio = 0.5\n[pretrain]\nepochs = 2\n"
    )
    a, b = foodvit.load_recipe(str(old)), foodvit.load_recipe(str(new))
    assert a.to_dict() | {"recipe": ""} == b.to_dict() | {"recipe": ""}
    assert (b.guidance.schedule, b.teacher.architecture, b.masked.ratio, b.pretrain.epochs) == (
        "linear",
        "resnet34",
        0.5,
        2,
    )
    both = tmp_path / "both.toml"
    both.write_text("[optim]\ndrloc = 0.5\n[drloc]\nweight = 1.0\n")
    with pytest.raises(ConfigError) as refused:
        foodvit.load_recipe(str(both))
    assert str(refused.value) == (
        f"recipe {both}: optim.drloc = 0.5 and drloc.weight = 1.0 are one setting; remove optim.drloc"
    )


def test_a_search_space_and_a_study_of_the_old_layout_name_the_settings_sectioned(tmp_path):
    from foodvit.tuning.space import read_space
    from foodvit.tuning.study import read_identity

    space = tmp_path / "space.toml"
    space.write_text("[optim]\ndrloc = {low = 0.0, high = 1.0}\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    assert set(read_space(space, resolve("tiny"))) == {"drloc.weight", "optim.lr"}
    study = tmp_path / "study.json"
    old = json.loads(STORED.read_text())
    study.write_text(json.dumps({"settings": old, "space": {"optim.drloc": {"low": 0.0, "high": 1.0}}}))
    identity = read_identity(study)
    assert identity["space"] == {"drloc.weight": {"low": 0.0, "high": 1.0}}
    assert (
        identity["settings"]["drloc"] == {"weight": 0.5, "pairs": 64} and "drloc" not in identity["settings"]["optim"]
    )


def test_settings_this_version_cannot_read_are_compared_in_the_sectioned_layout():
    from foodvit.settings.run import settings_sectioned

    stored = json.loads(STORED.read_text())
    stored["optim"]["retired_option"] = 1
    sectioned = settings_sectioned(stored)
    assert sectioned["optim"]["retired_option"] == 1 and "drloc" not in sectioned["optim"]  # shown, and only it differs
    assert sectioned["drloc"] == {"weight": 0.5, "pairs": 64}


def test_compare_finds_one_runs_settings_in_the_two_layouts_the_same(tmp_path, capsys):
    from foodvit.cli.main import main

    for name, path in (("old", STORED), ("new", STORED_SECTIONS)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(path.read_text())
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    assert "same settings in every run" in capsys.readouterr().out


def test_a_lenders_config_of_the_old_layout_lends_the_same_teacher():
    from foodvit.training.teacher import teacher_changes, teacher_settings

    lender = RunConfig.from_dict(json.loads(STORED.read_text()))
    config = resolve("default", GIVEN)
    assert teacher_changes(lender, config) == "" and teacher_settings(lender) == teacher_settings(config)
    assert "architecture" in teacher_changes(lender, resolve("default", {**GIVEN, "optim.teacher": "resnet34"}))


def test_the_sections_come_from_the_objectives_registry():
    for objective in OBJECTIVES:
        assert SECTIONS[objective.name] is objective.settings
        assert fields(objective.settings)[0].name == "weight" and objective.settings().weight == 0  # off by default
    assert objectives_on(RunConfig()) == ()
    assert [f.name for f in fields(VitSettings)] == [f.name for f in VIT_OPTIONS]  # the model's settings: ViTConfig's


def test_the_model_settings_are_typed_and_checked_by_their_fields():
    assert RunConfig().vit == VitSettings() and VitSettings().given() == {}
    with pytest.raises(ConfigError, match=r"--depth must be >= 1, got 0"):
        RunConfig.from_dict({"vit": {"depth": 0}})
    with pytest.raises(ConfigError, match=r"--pool must be one of cls, gap, seq, got 'avg'"):
        VitSettings(pool="avg")
    with pytest.raises(ConfigError, match=r"unknown model setting\(s\) deep"):
        RunConfig.from_dict({"vit": {"deep": 3}})


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.name)
def test_each_dependent_setting_needs_its_objective_on(objective):
    for dep in objective.dependents:
        section, _, field = dep.key.partition(".")
        if section != objective.name:
            continue
        option = flag_of(setting_field(dep.key))
        value = {bool: True, int: 4, float: 0.5, str: "linear"}[type(dep.off)]
        with pytest.raises(ConfigError, match=f"add --{objective.name} W .*or leave {option} out"):
            objective.settings(**{field: value})
        assert getattr(objective.settings(weight=1.0, **{field: value}), field) == value


def test_an_objective_turned_off_from_the_command_line_takes_the_recipes_dependent_settings_off_with_it(capsys):
    """`--guidance 0` on the default recipe (whose guidance schedule is linear) had been refused, asking to add a
    guidance weight: the user turning guidance off could not. A dependent given too still counts as asked."""
    from foodvit.cli.main import main
    from foodvit.model.resolve import resolve

    config = resolve("default", {"guidance.weight": 0.0})
    assert config.guidance.weight == 0 and config.guidance.schedule == "constant" and config.guidance.stages == 3
    assert resolve("default", {"masked.weight": 0.0}).masked.weight == 0
    with pytest.raises(ConfigError, match=r"--guidance-schedule sets how the weight"):
        resolve("default", {"guidance.weight": 0.0, "guidance.schedule": "linear"})
    assert main(["train", "--guidance", "0", "--guidance-schedule", "linear", "--out", "x"]) == 2
    assert "--guidance-schedule sets how the weight" in capsys.readouterr().err


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
    assert stored.vit.depth == 1 and stored.recipe == "tiny"


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


def test_run_config_takes_the_model_settings_as_vit_settings_and_refuses_anything_else():
    """The model's settings are one type, VitSettings (a frozen RunConfig is never rewritten after it is made);
    a dict is read through VitSettings.from_dict or RunConfig.from_dict, each with its own checks."""
    config = RunConfig.from_dict({"vit": {"depth": 2, "image_size": 64}})
    assert config.vit == VitSettings(depth=2, image_size=64) and config == RunConfig(
        vit=VitSettings(depth=2, image_size=64)
    )
    assert RunConfig(vit=VitSettings.from_dict({"depth": 3}, "vit")).vit == VitSettings(depth=3)
    with pytest.raises(ConfigError, match="unknown model setting"):
        RunConfig.from_dict({"vit": {"depht": 2}})
    for wrong in ({"depth": 2}, [("depth", 2)]):
        with pytest.raises(
            ConfigError, match=r"vit: expected the model's settings as VitSettings, got (dict|list); give VitSettings"
        ):
            RunConfig(vit=wrong)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'teacher = "resnet34"\n',
            '[teacher] is a section of settings, e.g. [teacher] architecture = "resnet18", not a str',
        ),
        (
            '[teacher]\nname = "resnet34"\n',
            "unknown setting(s) [teacher] name; [teacher] has architecture, epochs, size",
        ),
        # values of the wrong type, refused by the setting's type before they fail deep in training
        ("model = 5\n", "model must be a paper name such as ViT-Ti/8 or ViT-B/16, got 5"),
        ("[train]\nepochs = 1.5\n", "--epochs must be a whole number, got 1.5"),
        ("[vit]\nimage_size = 32.5\n", "--image-size must be a whole number, got 32.5"),
        ('[train]\namp = "yes"\n', "--amp must be true or false, got 'yes'"),
        ("[teacher]\narchitecture = 18\n", "--teacher must be text, got 18"),
        ("[data]\nmean = [0.5, inf, 0.5]\n", "--mean must be a finite number, got inf"),
        ('[data]\nmean = "abc"\n', "--mean must be a list of numbers ([a, b, ...]), got 'abc'"),
        ("[optim]\nbetas = 0.9\n", "--betas must be a list of numbers ([a, b, ...]), got 0.9"),
        ("[data]\nstd = 2\n", "--std must be a list of numbers ([a, b, ...]), got 2"),
    ],
)
def test_a_section_written_wrong_in_a_recipe_is_named_as_the_recipe_writes_it(tmp_path, text, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    with pytest.raises(ConfigError) as refused:
        foodvit.load_recipe(str(recipe))
    assert str(refused.value) == f"recipe {recipe}: {message}"


def test_overrides_under_both_names_of_one_setting_are_refused_as_a_file_is():
    with pytest.raises(
        ConfigError, match=r"^optim.drloc = 0.5 and drloc.weight = 1 are one setting; remove optim.drloc$"
    ):
        resolve("tiny", {"optim.drloc": 0.5, "drloc.weight": 1})
    assert resolve("tiny", {"optim.drloc": 0.5, "drloc.weight": 0.5}).drloc.weight == 0.5  # the same value: one setting
    assert resolve("tiny", {"optim.drloc": None, "drloc.weight": 1.0}).drloc.weight == 1.0  # None: not given
