"""The command line: options generated from the config, and each command's contract."""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import make_photo, make_photo_folder
from PIL import Image

from foodvit.cli.main import main
from foodvit.recipes import list_recipes, load_recipe
from foodvit.settings.run import RunConfig


def test_summary_ends_with_the_total(capsys):
    assert main(["summary", "ViT-B/16", "--num-classes", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "Total params: 85,800,963"
    assert any("patch_embed" in line and line.rstrip().endswith("True") and "[1, 196, 768]" in line for line in out)
    assert any(line.strip().startswith("head (Linear)") and "[1, 3]" in line and "2,307" in line for line in out)
    last_block = next(line for line in out if line.strip().startswith("11 (Block)"))
    assert "[1, 197, 768]" in last_block and "[1, 1, 768]" in last_block  # only the class token leaves the last block
    assert any(line.startswith("Block 11 outputs the class token only") for line in out)
    # the model's own parameters have rows, so the first level adds up to the total, as a reader would check it
    level_1 = [line for line in out if line.startswith("  ") and not line.startswith("   ")]
    assert any(line.strip().startswith("pos_embed (Parameter)") and "[1, 197, 768]" in line for line in level_1)
    assert sum(int(line.split()[-2].replace(",", "")) for line in level_1) == 85_800_963


def test_errors_are_one_line_with_what_to_do(capsys):
    assert main(["summary", "ViT-B/16", "--image-size", "250"]) == 2
    assert "image size 250 is not a multiple of the patch size 16; use 240 or 256" in capsys.readouterr().err
    # shapes past PyTorch's int64 gave a RuntimeError (or a TypeError) traceback of the meta device's
    for option, value in (("--batch-size", 10**14), ("--num-classes", 10**20)):
        with pytest.raises(SystemExit) as stop:
            main(["summary", "ViT-B/16", option, str(value)])
        assert stop.value.code == 2 and f"{option}: must be in [1, 1e+06], got {value}" in capsys.readouterr().err
    assert main(["summary", "ViT-B/1", "--image-size", "1024", "--batch-size", str(10**6)]) == 2
    assert "has a tensor of more than 2^63 elements, which PyTorch cannot shape; give a smaller" in (
        capsys.readouterr().err
    )


def test_recipes_lists_each_recipes_first_sentence_whole(capsys, monkeypatch):
    from foodvit.recipes import recipe_description

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["recipes"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    # the course's first sentence runs over two comment lines of its file: it is listed whole, up to its full stop
    assert (
        "The course's from-scratch run (PyTorch Paper Replicating, chapter 08): ViT-B/16 at 224, no augmentation, "
        "Adam 3e-3, weight decay 0.3 on everything, batch 32, 10 epochs. default " in listing
    )
    assert recipe_description("course").endswith("(per-image test accuracy 25-41%).")


def test_every_recipe_loads_and_builds_its_optimiser():
    from foodvit.training.optim import param_groups

    assert {"course", "paper", "tiny", "default"} <= set(list_recipes())
    for name in list_recipes():
        config = load_recipe(name)
        assert isinstance(config, RunConfig) and config.recipe == name
    # the course decays every parameter (its Adam's weight_decay=0.3 on model.parameters()): one group
    import foodvit

    model = foodvit.create_model("ViT-Ti/8", image_size=16, num_classes=3, depth=1)
    course = load_recipe("course").optim
    groups = param_groups(model, course.weight_decay, course.decay_all)
    assert (
        len(groups) == 1
        and groups[0]["weight_decay"] == 0.3
        and len(groups[0]["params"]) == len(list(model.parameters()))
    )


def test_bad_recipe_files_are_explained(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text("[optim]\nlearning_rate = 1\n")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \[optim\] learning_rate; \[optim\] has optimizer, lr,"):
        load_recipe(str(bad))
    with pytest.raises(ValueError, match=r"unknown recipe 'nope'.*course"):
        load_recipe("nope")


def test_a_recipe_saved_by_notepad_or_nested_deep_or_named_toml_in_capitals(tmp_path, capsys):
    # a byte-order mark was "Invalid statement (at line 1, column 1)", recipe.TOML an unknown recipe, and arrays
    # nested 100,000 deep a RecursionError's traceback
    notepad = tmp_path / "notepad.TOML"
    notepad.write_bytes("\ufeff[optim]\nlr = 0.01\n".encode())
    assert load_recipe(str(notepad)).optim.lr == 0.01
    deep = tmp_path / "deep.toml"
    deep.write_text("[data]\nmean = " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["train", "--recipe", str(deep), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"foodvit train: error: recipe {deep} nests arrays or tables thousands deep") and "\n" not in err
    )
    assert not (tmp_path / "run").exists()


def test_a_recipe_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    latin = tmp_path / "latin.toml"
    latin.write_bytes("# the caf\u00e9's recipe\n[optim]\nlr = 0.01\n".encode("latin-1"))  # it was a traceback
    assert main(["train", "--recipe", str(latin), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"foodvit train: error: recipe {latin} is not UTF-8 text (invalid continuation byte at byte 9); "
        "save it as UTF-8"
    ), err
    assert not (tmp_path / "run").exists()


def test_command_line_overrides_every_section(tmp_path):
    import argparse

    from foodvit.cli.options import add_config_options, build_config

    parser = argparse.ArgumentParser()
    add_config_options(parser)
    args = parser.parse_args(
        [
            "--lr",
            "0.01",
            "--pool",
            "gap",
            "--augment",
            "strong",
            "--epochs",
            "3",
            "--betas",
            "0.9,0.95",
            "--cache",
            "false",
            "--data",
            "x",
        ]
    )
    config = build_config("tiny", args)
    assert config.optim.lr == 0.01 and config.optim.betas == (0.9, 0.95)
    assert config.vit.given() == {"image_size": 64, "depth": 4, "pool": "gap"}
    assert config.data.augment == "strong" and config.data.cache is False and config.data.source == "x"
    assert config.train.epochs == 3 and config.optim.weight_decay == load_recipe("tiny").optim.weight_decay
    with pytest.raises(SystemExit):
        parser.parse_args(["--pool", "max"])


@pytest.fixture(scope="module")
def run(shared_run):
    return shared_run  # the tiny recipe, one epoch, 32 px, one block; 6 train and 3 test photos a class


def test_evaluate_json_contract(run, capsys):
    out, photos = run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0  # the run's own data source by default
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"accuracy", "loss", "n", "per_class", "confusion", "skipped"} and result["skipped"] == []
    assert result["n"] == 9 and set(result["per_class"]) == {"pizza", "steak", "sushi"}
    assert sum(map(sum, result["confusion"])) == 9
    correct = sum(result["confusion"][i][i] for i in range(3))
    assert result["accuracy"] == pytest.approx(correct / 9)


def test_evaluate_prints_the_confusion_matrix(run, capsys):
    out, photos = run
    assert main(["evaluate", str(out), "--json"]) == 0
    confusion = json.loads(capsys.readouterr().out)["confusion"]
    assert main(["evaluate", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("confusion matrix (a row per true class, a column per predicted class)")
    assert lines[at + 1].split() == ["pizza", "steak", "sushi"]
    for name, row, line in zip(["pizza", "steak", "sushi"], confusion, lines[at + 2 : at + 5], strict=True):
        assert line.split() == [name, *map(str, row)]


def test_confusion_lines_point_to_json_past_ten_classes():
    from foodvit.cli.predicting import confusion_lines

    assert confusion_lines([f"c{i}" for i in range(11)], [[0] * 11] * 11) == ["confusion matrix: 11 classes, in --json"]


def test_evaluate_says_to_name_the_photos_when_the_runs_are_gone_or_its_settings_damaged(run, capsys, tmp_path):
    """A run whose photos have moved said "data source ... does not exist" with no word of --data; one whose
    config.json is damaged named the damage alone."""
    import shutil

    out, photos = run
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    settings = json.loads((moved / "config.json").read_text())
    settings["data"]["source"] = str(tmp_path / "gone")
    (moved / "config.json").write_text(json.dumps(settings))
    capsys.readouterr()
    assert main(["evaluate", str(moved)]) == 2
    assert f"the photos moved was trained on ({tmp_path / 'gone'}) are not there any more; name them with --data" in (
        capsys.readouterr().err
    )
    assert main(["evaluate", str(moved), "--data", str(photos), "--json"]) == 0
    (moved / "config.json").write_text("{")
    capsys.readouterr()
    assert main(["evaluate", str(moved)]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and err.rstrip().endswith("or name the photos to evaluate on with --data PATH")


def test_evaluate_accepts_a_folder_of_class_folders(run, capsys):
    out, photos = run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data", str(photos / "test"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 9


def test_predict_json_contract_and_plot(run, capsys, tmp_path):
    out, photos = run
    images = [str(p) for p in sorted((photos / "test" / "pizza").iterdir())[:2]]
    capsys.readouterr()
    assert main(["predict", str(out), *images, "--top-k", "2", "--json", "--plot", str(tmp_path / "p.png")]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in results] == images
    for r in results:
        assert set(r) == {"image", "label", "probability", "probabilities", "top_k", "seconds"}
        assert len(r["top_k"]) == 2 and r["top_k"][0] == [r["label"], r["probability"]]
    with Image.open(tmp_path / "p.png") as picture:
        assert len(np.unique(np.asarray(picture.convert("L")))) > 10  # a real picture, not a blank canvas


def test_predict_takes_its_options_between_the_run_and_the_photos(run, capsys, tmp_path):
    """`predict RUN --top-k 1 photo` (and photos on both sides of an option, and after --) was refused as
    "foodvit: error: unrecognized arguments"; an option a command lacks is refused in the command's name."""
    out, photos = run
    images = [str(p) for p in sorted((photos / "test" / "pizza").iterdir())[:3]]
    capsys.readouterr()
    for argv in (
        [str(out), "--top-k", "1", "--json", *images],
        [str(out), images[0], "--top-k", "1", "--json", *images[1:]],
        [str(out), "--top-k", "1", "--json", "--", *images],
        [str(out), "--top-k", "1", "--json", images[0], "--", *images[1:]],
    ):
        assert main(["predict", *argv]) == 0
        assert [(r["image"], len(r["top_k"])) for r in json.loads(capsys.readouterr().out)] == [(i, 1) for i in images]
    with pytest.raises(SystemExit) as stop:
        main(["compare", "--json", str(out), str(out)])
    assert stop.value.code == 2
    assert "foodvit compare: error: unrecognized arguments: --json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["predict", str(out), "--top-k", "1", images[0], "--no-such-option"])
    assert "foodvit predict: error: unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_predict_reports_each_bad_photo_and_predicts_the_rest(run, capsys, tmp_path):
    out, photos = run
    good = str(sorted((photos / "test" / "pizza").iterdir())[0])
    (tmp_path / "fake.jpg").write_bytes(b"nope")
    bad = [str(tmp_path / "fake.jpg"), str(tmp_path / "missing.jpg"), "https://example.com/pizza.jpg"]
    capsys.readouterr()
    assert main(["predict", str(out), bad[0], good, bad[1], bad[2], "--json"]) == 1  # some photos failed
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert [r["image"] for r in results] == [bad[0], good, bad[1], bad[2]]
    assert "label" in results[1] and all("error" in results[i] for i in (0, 2, 3))
    assert "URLs are not supported; download the photo first" in results[3]["error"]
    assert "missing.jpg does not exist" in results[2]["error"]
    assert captured.err.count("foodvit predict: skipped") == 3 and "Traceback" not in captured.err
    assert main(["evaluate", str(tmp_path), "--json"]) == 2
    assert "no trained model" in capsys.readouterr().err


# ------------------------------------------------------------------ bad input: one line, never a traceback


@pytest.mark.parametrize(
    "options,message",
    [
        (["--patch-size", "0"], "argument --patch-size: must be >= 1, got 0"),
        (["--accum-steps", "0"], "argument --accum-steps: must be >= 1, got 0"),
        (["--eval-every", "0"], "argument --eval-every: must be >= 1, got 0"),
        (["--crop-pct", "0"], "argument --crop-pct: must be in [0.1, 1], got 0"),
        (["--label-smoothing", "2"], "argument --label-smoothing: must be in [0, 1), got 2"),
        (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
        (["--epochs", "-3"], "argument --epochs: must be >= 1, got -3"),
        (["--repeated-aug", "0"], "argument --repeated-aug: must be >= 1, got 0"),
        (["--depth", "0"], "argument --depth: must be >= 1, got 0"),
        (["--lr", "0"], "argument --lr: must be in (0, 10], got 0"),
        (["--epochs", "two"], "argument --epochs: expected a whole number, got 'two'"),
        (["--freeze-backbone", "maybe"], "argument --freeze-backbone: expected true or false, got 'maybe'"),
        # sides that no machine's memory holds (the model's position embedding alone: 120 GB at 100000 px), refused
        # before anything is allocated
        (["--image-size", "100000"], "argument --image-size: must be in [1, 1024], got 100000"),
        (["--teacher-size", "100000"], "argument --teacher-size: must be in [0, 1024], got 100000"),
        (["--teacher-size", "5000"], "argument --teacher-size: must be in [0, 1024], got 5000"),
        (["--test-size", "2048"], "argument --test-size: must be in [0, 1024], got 2048"),
        (["--start-size", "2048"], "argument --start-size: must be in [0, 1024], got 2048"),
        # three numbers, each finite (a range with no ends once failed while writing its own message)
        (["--mean", "nan,0.5,0.5"], "argument --mean: each must be a finite number, got nan,0.5,0.5"),
        (["--std", "1,inf,1"], "argument --std: each must be > 0, got 1,inf,1"),
    ],
)
def test_out_of_range_options_are_refused_where_they_are_parsed(options, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--out", str(tmp_path / "never"), *options])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()  # nothing started, nothing "finished"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--device", "tpu"], "--device must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
        (["predict", "RUN", "x.jpg", "--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
        (["inspect", "RUN", "--images", "0", "--out", "x"], "argument --images: must be >= 1, got 0"),
        # each seed trains every fold: a number no study needs is refused before a folder is made
        (["cv", "--data", "RUN", "--seeds", "100000000", "--out", "RUN/s"], "argument --seeds: must be in [1, 100]"),
    ],
)
def test_other_bad_options_are_one_line(argv, message, capsys, tmp_path):
    try:
        code = main([a.replace("RUN", str(tmp_path)) for a in argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_the_same_ranges_hold_for_recipes_and_python():
    from foodvit.errors import ConfigError
    from foodvit.settings.model import ViTConfig, VitSettings
    from foodvit.settings.run import OptimConfig, TrainConfig

    with pytest.raises(ConfigError, match=r"--epochs must be >= 1, got 0"):
        TrainConfig(epochs=0)
    with pytest.raises(ConfigError, match=r"--label-smoothing must be in \[0, 1\), got 2"):
        OptimConfig(label_smoothing=2)
    with pytest.raises(ConfigError, match=r"--patch-size must be >= 1, got 0"):
        ViTConfig(patch_size=0)
    with pytest.raises(ConfigError, match=r"--depth must be >= 1, got 0"):
        RunConfig(vit=VitSettings(depth=0))


def test_bad_images_and_outputs_are_one_line(run, capsys, tmp_path):
    out, photos = run
    from PIL import Image as PILImage

    bomb = tmp_path / "bomb.png"
    PILImage.new("1", (10_000, 9_000)).save(bomb)
    photo = str(sorted((photos / "test" / "pizza").iterdir())[0])
    for argv in (
        ["explain", str(out), str(bomb), "--out", str(tmp_path / "e.png")],
        ["patches", str(bomb), "--out", str(tmp_path / "p.png")],
        ["predict", str(out), photo, "--plot", str(tmp_path)],
        ["inspect", str(out), "--out", str(tmp_path / "e.png")],
    ):
        if argv[0] == "inspect":
            (tmp_path / "e.png").write_bytes(b"a file")
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"foodvit {argv[0]}: error: ") and "Traceback" not in err, err


def test_internal_bugs_keep_their_traceback_and_debug_shows_every_one(monkeypatch, capsys):
    import foodvit.cli.listings as listings

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(listings, "cmd_models", broken)
    with pytest.raises(ZeroDivisionError):  # not swallowed into a one-line message
        main(["models"])
    with pytest.raises(Exception, match="image size 250 is not a multiple of the patch size 16"):
        main(["--debug", "summary", "ViT-B/16", "--image-size", "250"])


# ------------------------------------------------------------------ conventions


def test_boolean_settings_are_flags_with_a_no_form_and_still_take_true_false():
    import argparse

    from foodvit.cli.options import add_config_options

    parser = argparse.ArgumentParser()
    add_config_options(parser)
    parse = lambda *a: vars(parser.parse_args(list(a)))  # noqa: E731
    assert parse("--freeze-backbone")["train.freeze_backbone"] is True
    assert parse("--no-cache")["data.cache"] is False
    assert parse("--cache", "false")["data.cache"] is False and parse("--cache", "true")["data.cache"] is True
    assert parse("--class-token", "--no-class-token")["vit.class_token"] is False  # the last one wins
    assert parse()["data.cache"] is None  # not given: the recipe decides
    # the help offers the value to the on form alone: `--no-cache true` is refused
    shown = parser.format_help()
    assert "--cache [true|false], --no-cache\n" in shown and "--no-cache [" not in shown
    with pytest.raises(SystemExit):
        parse("--no-cache", "true")


def test_every_option_and_positional_has_help():
    from foodvit.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"foodvit {name}: {action.option_strings or action.dest} has no help"


def test_help_and_listings_import_no_torch():
    # `foodvit --help`, `models` and `recipes` must start fast: PyTorch alone takes seconds to import
    import subprocess
    import sys

    code = (
        "import sys; from foodvit.cli.main import main\n"
        "for argv in (['models'], ['recipes']): main(argv)\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'torchvision', 'matplotlib', 'timm') if m in sys.modules)\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (
        "HEAVY []" in out.stdout
        and "ViT-B/16" in out.stdout
        and "--freeze-backbone [true|false], --no-freeze-backbone" in out.stdout
    )


def test_quiet_still_names_the_run_directory_and_the_result(tmp_path, capsys):
    photos = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    assert (
        main(
            [
                "train",
                "--recipe",
                "tiny",
                "--data",
                str(photos),
                "--out",
                str(tmp_path / "q"),
                "--epochs",
                "1",
                "--image-size",
                "32",
                "--depth",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert f"run directory: {tmp_path / 'q'}" in captured.err
    assert "test accuracy" in captured.out and str(tmp_path / "q" / "report.md") in captured.out
    # the test split is evaluated for the curves too: the report said it was read for the report only
    assert "The test split was read for this report and for its curves" in (tmp_path / "q" / "report.md").read_text()


def test_ctrl_c_names_the_directory_to_resume_even_without_out(tmp_path, capsys, monkeypatch):
    import foodvit.training.trainer as trainer

    photos = make_photo_folder(tmp_path / "p", n_train=2, n_test=1)
    monkeypatch.chdir(tmp_path)
    original = trainer.Trainer._after_epoch

    def interrupt_after_first(self, epoch, row):
        original(self, epoch, row)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "_after_epoch", interrupt_after_first)
    assert (
        main(
            [
                "train",
                "--recipe",
                "tiny",
                "--data",
                str(photos),
                "--epochs",
                "2",
                "--image-size",
                "32",
                "--depth",
                "1",
                "--quiet",
            ]
        )
        == 130
    )
    err = capsys.readouterr().err
    [run] = (tmp_path / "runs").iterdir()
    assert f"continue with `foodvit train --resume runs/{run.name}`" in err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["cv", "--out", "{out}"],
            "interrupted: finished folds are kept in {out}; run the same command again to go on",
        ),
        (["cv", "--compare", "a", "b"], "interrupted"),
        (
            ["predict", "run", "--out", "{out}"],
            "interrupted: every finished batch is kept in {out}; run the same command again to label the rest",
        ),
        (["predict", "run", "photo.jpg"], "interrupted"),
        (["train"], "interrupted before the first epoch finished: nothing was saved"),
        (["models"], "interrupted"),
    ],
)
def test_ctrl_c_says_what_each_command_kept(argv, line, tmp_path, capsys, monkeypatch):
    # the line is the command's own (its parser's on_interrupt), the entry point knows no command by name
    from foodvit.cli import main as entry

    parser = entry.build_parser()

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "build_parser", lambda: parser)
    for command in parser._subparsers._group_actions[0].choices.values():
        command.set_defaults(func=stopped)
    out = str(tmp_path / "out")
    assert main([a.replace("{out}", out) for a in argv]) == 130
    assert capsys.readouterr().err == "\n" + line.replace("{out}", out) + "\n"


def test_the_entry_point_names_no_subcommand():
    # a subcommand is its module and one line in COMMANDS: main.py holds no command's name
    import ast
    import inspect

    from foodvit.cli import main as entry

    sub = entry.build_parser()._subparsers._group_actions[0]
    strings = {n.value for n in ast.walk(ast.parse(inspect.getsource(entry))) if isinstance(n, ast.Constant)}
    assert not strings & set(sub.choices), strings & set(sub.choices)


def test_inspect_says_why_a_picture_is_skipped(run, capsys, tmp_path):
    out, _ = run  # the tiny recipe's model: learned positions; check a sin-cos one
    photos = make_photo_folder(tmp_path / "p", n_train=2, n_test=2)
    assert (
        main(
            [
                "train",
                "--recipe",
                "tiny",
                "--data",
                str(photos),
                "--out",
                str(tmp_path / "s"),
                "--epochs",
                "1",
                "--image-size",
                "32",
                "--depth",
                "1",
                "--pos-embed",
                "sincos2d",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "s"), "--images", "2", "--out", str(tmp_path / "i")]) == 0
    assert (
        "pos_similarity.png: skipped, the model's position embedding is 'sincos2d', not learned"
        in capsys.readouterr().err
    )


def test_inspect_skips_a_photo_it_cannot_read_and_writes_nothing_for_bad_data(run, capsys, tmp_path):
    """One truncated photo stopped inspect with two of its three pictures written; a bad --data or --split left two
    pictures too (the photos were read after them)."""
    out, photos = run
    data = tmp_path / "d"
    shutil.copytree(photos, data)
    first = sorted((data / "test" / "pizza").iterdir())[0]
    make_photo(first, (200, 60, 40), size=(300, 300))
    first.write_bytes(first.read_bytes()[: first.stat().st_size // 2])  # its header whole, its pixels cut short
    capsys.readouterr()
    argv = ["inspect", str(out), "--images", "9", "--data", str(data)]
    assert main([*argv, "--out", str(tmp_path / "i")]) == 0
    assert f"skipped 1 photo(s) that cannot be read, e.g. {first}" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "i").iterdir()) == [
        "attention_distance.png",
        "filters.png",
        "pos_similarity.png",
    ]
    assert main(["inspect", str(out), "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "j")]) == 2
    assert main(["inspect", str(out), "--data", str(data), "--split", "valid", "--out", str(tmp_path / "j")]) == 2
    assert not (tmp_path / "j").exists() or not list((tmp_path / "j").iterdir())


@pytest.mark.slow  # a second Python draws a figure; the fast tier keeps test_architecture's check that training
# leaves the process as it found it
def test_drawing_changes_no_global_matplotlib_state():
    import subprocess
    import sys

    code = (
        "import matplotlib; before = matplotlib.get_backend()\n"
        "from foodvit.training.report import plot_curves\n"
        "import matplotlib.pyplot as plt\n"
        "fig = plot_curves([{'epoch': 1, 'train_loss': 1.0, 'train_acc': 0.5, 'test_loss': 1.1, 'test_acc': 0.4}])\n"
        "print('SAME', matplotlib.get_backend() == before, 'OPEN', len(plt.get_fignums()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "MPLBACKEND": "svg"},
    )
    assert out.returncode == 0, out.stderr
    assert "SAME True OPEN 0" in out.stdout


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--lr", "nan"], "argument --lr: must be in (0, 10], got nan"),
        (["train", "--train-fraction", "nan"], "argument --train-fraction: must be in (0, 1], got nan"),
        (["train", "--lr", "inf"], "argument --lr: must be in (0, 10], got inf"),
        (["train", "--cache-gb", "0"], "must be > 0, got 0; for no cache at all, use --no-cache"),
        (["train", "--lr", "1e300"], "--lr: must be in (0, 10], got 1e300; the paper's are"),  # torch's RuntimeError
        (["serve", "run", "--max-upload-mb", "nan"], "argument --max-upload-mb: must be > 0, got nan"),
        (
            ["train", "--crop-pct", "1e-310"],
            "--crop-pct: must be in [0.1, 1], got 1e-310; timm's models crop",
        ),  # Overflow
    ],
)
def test_nan_infinity_and_numbers_past_a_range_are_refused_in_one_line(argv, message, capsys):
    # NaN passed every range check: --train-fraction nan trained on all photos and wrote NaN into config.json
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_numbers_past_what_a_machine_holds_are_taken_as_all_it_holds(caplog):
    """--cache-gb 1e300 gave an OverflowError traceback, and --workers 100000 started 100000 processes, which took the
    machine's memory (and left some running). Neither changes what a run computes, so neither is refused: an older
    run's config.json that holds a large value still loads."""
    import logging

    from foodvit.data.datasets import MemoryBudget
    from foodvit.data.sampling import make_loader

    assert MemoryBudget(1e300).take(2**50) and not MemoryBudget(1.0).take(2**31)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with caplog.at_level(logging.INFO, logger="foodvit.data.sampling"):
        loader = make_loader(list(range(12)), 4, train=True, workers=100_000)
    assert loader.num_workers == cores and f"--workers 100000: {cores} worker processes are started" in caplog.text
    assert make_loader(list(range(12)), 4, train=True, workers=1).num_workers == 1


def test_nan_in_python_settings_is_refused():
    from foodvit.errors import ConfigError
    from foodvit.settings.run import DataConfig, OptimConfig

    with pytest.raises(ConfigError, match="--train-fraction must be in \\(0, 1\\], got nan"):
        DataConfig(train_fraction=float("nan"))
    with pytest.raises(ConfigError, match=r"--lr must be in \(0, 10\], got inf"):
        OptimConfig(lr=float("inf"))


def test_version_and_the_librarys_log_levels(capsys):
    import logging

    from foodvit import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"foodvit {__version__}"
    logger = logging.getLogger("foodvit")
    main(["models"])
    assert logger.level == logging.INFO
    logging.getLogger("foodvit.tuning.search").info("a library message")
    assert capsys.readouterr().err == "a library message\n"  # plain, on standard error
    main(["--debug", "models"])
    assert logger.level == logging.DEBUG
    from foodvit.cli.main import build_parser, configure_logging

    configure_logging(build_parser().parse_args(["cv", "--out", "x", "--quiet"]))
    assert logger.level == logging.WARNING
    logging.getLogger("foodvit.tuning.cv").info("not shown under --quiet")
    assert "not shown" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, usage, message",
    [
        (
            ["cv", "--folds", "0"],
            "usage: foodvit cv [options]",
            "foodvit cv: error: argument --folds: must be >= 2, got 0",
        ),
        (
            ["predict"],
            "usage: foodvit predict [options] run [IMAGE ...]",
            "foodvit predict: error: the following arguments are required: run",
        ),
        (
            ["bogus"],
            "usage: foodvit [options] COMMAND ...",
            "foodvit: error: argument COMMAND: invalid choice: 'bogus'",
        ),
    ],
)
def test_a_usage_error_is_a_short_usage_line_and_the_error_not_every_option(argv, usage, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines  # it had printed all 50 lines of cv's options above the one that matters
    prog = message.split(": error")[0]
    assert lines[0] == f"{usage}  (see {prog} -h)" and lines[1].startswith(message), lines
