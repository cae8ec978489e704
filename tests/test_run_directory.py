"""The run directory is the user's data: what a new run refuses, the lock, what a failed start
leaves, the data source a run stores and resumes with, edited settings, pre-trained resumes offline,
file permissions."""

import json
import os
import stat
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import library_messages_on_stderr, make_photo_folder, report_figures

import foodvit
from foodvit.cli.main import main
from foodvit.cli.options import build_config
from foodvit.data.datasource import DataSource
from foodvit.data.sources import resolve
from foodvit.errors import ConfigError, DataError, RunError
from foodvit.model.variants import run_model_config, without_recipe_resizing
from foodvit.recipes import load_recipe
from foodvit.rundir.directory import RunLock, training_now
from foodvit.training.run import resume, train

SMALL = {"image_size": 32, "depth": 1}


def small(source, epochs=1, **train_changes):
    config = load_recipe("tiny")
    return replace(
        config,
        vit=replace(config.vit, **SMALL),
        data=replace(config.data, source=str(source) if source else ""),
        train=replace(config.train, epochs=epochs, batch_size=12, **train_changes),
    )


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def interrupted_run(photos, out, epochs=2):
    """A run with one of `epochs` epochs done, as an interruption leaves it: train one epoch, then
    set the config and checkpoint to the longer run (the schedule differs, which resume does not check)."""
    train(small(photos, epochs=1), out, quiet=True)
    config = json.loads((out / "config.json").read_text())
    config["train"]["epochs"] = epochs
    (out / "config.json").write_text(json.dumps(config))
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["config"] = config
    torch.save(state, out / "checkpoint.pt")
    for name in ("model.safetensors", "model.json", "report.md"):
        (out / name).unlink()
    return out


# ------------------------------------------------------------------ a new run's folder


def test_a_folder_with_the_users_files_is_refused_and_left_untouched(photos, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own notes")
    (mine / "curves.png").write_bytes(b"my picture")
    with pytest.raises(
        RunError, match=r"is not empty \(curves\.png, report\.md\) and holds no foodvit run.*choose another --out"
    ):
        train(small(photos), mine, quiet=True)
    assert (mine / "report.md").read_text() == "my own notes" and (mine / "curves.png").read_bytes() == b"my picture"
    assert sorted(p.name for p in mine.iterdir()) == ["curves.png", "report.md"]
    # an empty folder is fine
    (tmp_path / "empty").mkdir()
    assert train(small(photos), tmp_path / "empty", quiet=True).test["n"] == 6


def test_out_naming_a_file_or_an_unwritable_place_is_one_line(photos, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert (
        main(["train", "--recipe", "tiny", "--data", str(photos), "--out", str(tmp_path / "file"), "--epochs", "1"])
        == 2
    )
    assert "is a file; a run directory is a folder" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        assert (
            main(["train", "--recipe", "tiny", "--data", str(photos), "--out", str(locked / "run"), "--epochs", "1"])
            == 2
        )
        assert "choose a writable --out" in capsys.readouterr().err


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_free(photos, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # another process holds the run's lock (an OS lock: the kernel frees it when that process dies)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from foodvit.rundir.directory import RunLock; lock = RunLock({str(out)!r}).acquire(); "
            "print('held', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert training_now(out).startswith(f"pid {holder.pid} on ")
        with pytest.raises(RunError, match=rf"in use by another foodvit process \(pid {holder.pid} on "):
            train(small(photos), out, quiet=True)
        assert sorted(p.name for p in out.iterdir()) == [RunLock.NAME, RunLock.OWNER]  # nothing written beside the lock
    finally:
        holder.kill()  # kill -9: no clean-up of its own
        holder.wait()
    # its process is gone, so is its lock: the run goes ahead, and releases the lock when done
    assert training_now(out) is None
    train(small(photos), out, quiet=True)
    assert training_now(out) is None and not (out / RunLock.OWNER).exists() and (out / "model.safetensors").is_file()


def test_a_failed_start_leaves_nothing_behind(tmp_path):
    empty = tmp_path / "nodata"
    empty.mkdir()
    out = tmp_path / "runs" / "demo"
    with pytest.raises(DataError):
        train(small(empty), out, quiet=True)
    assert not out.exists()  # not even config.json
    (tmp_path / "keep").mkdir()
    with pytest.raises(DataError):
        train(small(empty), tmp_path / "keep", quiet=True)
    assert (tmp_path / "keep").is_dir() and not any((tmp_path / "keep").iterdir())  # the user's folder stays


def test_run_files_respect_the_umask(photos, tmp_path):
    old = os.umask(0o022)
    try:
        with report_figures():  # curves.png is among the files
            train(small(photos), tmp_path / "run", quiet=True)
    finally:
        os.umask(old)
    for name in (
        "config.json",
        "metrics.csv",
        "checkpoint.pt",
        "model.safetensors",
        "model.json",
        "report.md",
        "curves.png",
    ):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == 0o644, name
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")] == [
        RunLock.NAME
    ]  # no temporary file left


def test_unpacked_zips_respect_the_umask_and_bad_zips_leave_nothing(photos, tmp_path, monkeypatch):
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as archive:
        for path in photos.rglob("*.jpg"):
            archive.write(path, path.relative_to(photos.parent))
    old = os.umask(0o022)
    try:
        root = resolve(good)
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.parent.stat().st_mode) == 0o755
    flat = tmp_path / "flat.zip"
    with zipfile.ZipFile(flat, "w") as archive:
        archive.writestr("pizza/1.jpg", b"x")
    with pytest.raises(DataError, match="holds no train/ and test/ folders"):
        DataSource.parse(str(flat)).listed()
    corrupt = tmp_path / "corrupt.zip"
    data = bytearray(good.read_bytes())
    member = data.find(b"\xff\xd8")  # the first JPEG's bytes, stored inside the zip
    data[member + 200 : member + 260] = bytes(60)
    corrupt.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"corrupt\.zip is a damaged zip .*download it again"):
        resolve(corrupt)
    unpacked = sorted(p.name for p in (tmp_path / "cache" / "data").iterdir())
    assert [name.split("-")[0] for name in unpacked] == ["flat", "good"]  # nothing of the damaged one stays


# ------------------------------------------------------------------ the data a run stores and resumes with


def test_the_actual_source_is_stored_and_resume_uses_it_whatever_foodvit_data_says(
    photos, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FOODVIT_DATA", str(photos))
    train(small(None), tmp_path / "first", quiet=True)
    assert json.loads((tmp_path / "first" / "config.json").read_text())["data"]["source"] == str(photos)
    out = interrupted_run(photos, tmp_path / "run")
    other = make_photo_folder(tmp_path / "other", n_train=2, n_test=1, classes=("a", "b"))
    monkeypatch.setenv("FOODVIT_DATA", str(other))  # another data set now: the run must not notice
    library_messages_on_stderr()
    result = resume(out)
    assert f"data: {photos} (stored with the run)" in capsys.readouterr().err
    assert result.test["n"] == 6 and len(result.history) == 2


def test_a_run_given_its_photos_by_a_relative_path_finds_them_from_any_folder(photos, tmp_path, monkeypatch, capsys):
    # the path was stored as typed: evaluate, inspect and export-web run from another folder said the photos had gone
    from foodvit.rundir.directory import with_source

    monkeypatch.chdir(photos.parent)
    options = ["--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet", "--out", str(tmp_path / "run")]
    assert main(["train", "--recipe", "tiny", "--data", photos.name, *options]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["source"] == str(photos)
    assert json.loads((tmp_path / "run" / "model.json").read_text())["metrics"]["data"] == str(photos)
    config = small(f"{photos.name}:a,b")
    stored = with_source(replace(config, data=replace(config.data, validate_on="pool"))).data
    assert (stored.source, stored.validate_on) == (f"{photos}:a,b", str(photos.parent / "pool"))
    assert with_source(small("food101")).data.source == "food101"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "run", "--json"]) == 0 and json.loads(capsys.readouterr().out)["n"] == 6


def test_a_run_with_the_objectives_settings_inside_optim_resumes(photos, tmp_path):
    from foodvit.settings.layout import MOVED

    out = interrupted_run(photos, tmp_path / "run")
    config = json.loads((out / "config.json").read_text())
    for old, new in MOVED.items():  # config.json and checkpoint.pt as the layout before the sections wrote them
        section, name = new.split(".")
        config["optim"][old.split(".")[1]] = config[section].pop(name)
    config = {key: value for key, value in config.items() if value != {}}
    assert "drloc" in config["optim"] and "teacher" not in config
    (out / "config.json").write_text(json.dumps(config))
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["config"] = config
    torch.save(state, out / "checkpoint.pt")
    result = resume(out, quiet=True)
    assert len(result.history) == 2 and result.test["n"] == 6


def test_resume_with_the_data_moved_checks_classes_and_counts(photos, tmp_path, capsys, monkeypatch):
    import shutil

    out = interrupted_run(photos, tmp_path / "run")
    moved = tmp_path / "moved"
    shutil.copytree(photos, moved)
    fewer = tmp_path / "fewer"
    shutil.copytree(photos, fewer)
    next((fewer / "train" / "pizza").iterdir()).unlink()
    with pytest.raises(RunError, match=r"trained on 12 train / 6 test photos, the data in .*fewer has 11 / 6"):
        resume(out, data=str(fewer), quiet=True)
    swapped = tmp_path / "swapped"  # the same totals, one photo moved to another class: it resumed without a word
    shutil.copytree(photos, swapped)
    first = next((swapped / "train" / "pizza").iterdir())
    first.rename(swapped / "train" / "steak" / f"moved-{first.name}")
    with pytest.raises(RunError, match=r"other train photos a class than the data in .*swapped holds \(pizza 4 -> 3, "):
        resume(out, data=str(swapped), quiet=True)
    monkeypatch.chdir(tmp_path)  # the moved photos named from here, stored as a path from anywhere
    assert main(["train", "--resume", str(out), "--data", "moved", "--quiet"]) == 0
    assert json.loads((out / "config.json").read_text())["data"]["source"] == str(moved)
    assert main(["train", "--resume", str(out), "--lr", "0.1", "--teacher-epochs", "2"]) == 2
    assert "drop --lr, --teacher-epochs" in capsys.readouterr().err  # each option by its own name


def test_an_edited_config_is_refused_with_the_keys_that_differ(photos, tmp_path):
    out = interrupted_run(photos, tmp_path / "run")
    config = json.loads((out / "config.json").read_text())
    config["optim"]["lr"] = 0.5
    config["vit"]["depth"] = 3
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        RunError,
        match=r"differs from the settings the run started with \(optim\.lr: 0\.001 -> 0\.5; vit\.depth: 1 -> 3\)",
    ):
        resume(out, quiet=True)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "expected a JSON object of settings, got list"),
        ('{"train": {"epochs": 0}}', "--epochs must be >= 1, got 0"),
    ],
)
def test_a_broken_config_json_is_named(photos, tmp_path, capsys, text, message):
    out = interrupted_run(photos, tmp_path / "run")
    (out / "config.json").write_text(text)
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("config.json") == 1 and message in err and "Traceback" not in err  # the file named once


def test_a_checkpoint_from_another_model_size_is_explained(photos, tmp_path, capsys):
    out = interrupted_run(photos, tmp_path / "run")
    other = tmp_path / "other"
    config = small(photos)
    train(replace(config, vit=replace(config.vit, depth=2)), other, quiet=True)
    state = torch.load(other / "checkpoint.pt", weights_only=True)
    state["config"] = json.loads((out / "config.json").read_text())  # the settings match; the tensors do not
    state.pop("model_config")
    torch.save(state, out / "checkpoint.pt")
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not fit the model its config.json describes" in err and "Traceback" not in err


# ------------------------------------------------------------------ pre-trained runs


def test_resume_of_a_pretrained_run_needs_only_the_checkpoint(photos, tmp_path):
    weights = tmp_path / "weights.safetensors"
    source = foodvit.create_model("ViT-Ti/8", num_classes=5, image_size=32, depth=1)
    foodvit.save_weights(source, weights)
    config = build_config(
        "tiny",
        {
            "train.pretrained": str(weights),
            "data.source": str(photos),
            "train.epochs": 1,
            "train.batch_size": 12,
            "vit.depth": 1,
        },
    )
    out = tmp_path / "run"
    train(config, out, quiet=True)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    full = json.loads((out / "config.json").read_text())
    full["train"]["epochs"] = 2
    state["config"] = full
    (out / "config.json").write_text(json.dumps(full))
    torch.save(state, out / "checkpoint.pt")
    weights.unlink()  # the weights are gone (offline, moved): the checkpoint holds everything
    result = resume(out, quiet=True)
    assert len(result.history) == 2


def test_python_train_adapts_a_pretrained_config_as_the_command_line_does(tmp_path):
    weights = tmp_path / "w.safetensors"
    foodvit.save_weights(foodvit.create_model("ViT-Ti/16", num_classes=3, image_size=48), weights)
    # the default recipe's from-scratch model settings (96 px, 6 blocks, sequence pooling, sin-cos) give way to the
    # weights'
    config = build_config("default", {"train.pretrained": str(weights)})
    assert config.model == "ViT-Ti/16" and config.vit.image_size is None and config.vit.depth is None
    given = build_config("default", {"train.pretrained": str(weights), "vit.image_size": 64})
    assert given.vit.image_size == 64  # a size the user asks for is kept (positions are resampled)
    # the recipe's progressive resizing (64 px up to its 96) is the from-scratch model's, not the weights':
    # kept, it would start a ViT-Ti/16 with learned positions at 64 px, which the trainer refuses
    assert build_config("default").data.start_size == 64 and config.data.start_size == 0
    assert build_config("default", {"train.pretrained": str(weights), "data.start_size": 32}).data.start_size == 32


def test_the_default_recipe_trains_from_pretrained_weights_without_its_masked_patches(photos, tmp_path):
    # regression: the default's masked-patch loss reads every output token, which the weights' class-token
    # model does not compute, so `foodvit train --pretrained W` with the default recipe was refused
    weights = tmp_path / "w.safetensors"
    foodvit.save_weights(foodvit.create_model("ViT-Ti/16", num_classes=3, image_size=32, depth=1), weights)
    assert build_config("default").masked.weight == 1.0
    settings = {
        "train.pretrained": str(weights),
        "data.source": str(photos),
        "train.epochs": 1,
        "train.batch_size": 12,
        "guidance.weight": 0.0,
        "guidance.schedule": "constant",
        "drloc.weight": 0.0,
    }
    config = build_config("default", settings)
    assert config.masked.weight == 0.0 and config.vit.pool in (None, "cls")
    result = train(config, tmp_path / "run", quiet=True)
    assert (
        len(result.history) == 1
        and json.loads((tmp_path / "run" / "config.json").read_text())["masked"]["weight"] == 0.0
    )
    # a recipe that hides the masked patches' pixels too loses that with them (it was refused: --mask-pixels without
    # --masked)
    hiding = tmp_path / "hiding.toml"
    hiding.write_text(
        (Path(foodvit.__file__).parent / "recipes" / "default.toml")
        .read_text()
        .replace("[masked]", "[masked]\npixels = true")
    )
    assert build_config(str(hiding)).masked.pixels is True
    assert (build_config(str(hiding), settings).masked.weight, build_config(str(hiding), settings).masked.pixels) == (
        0.0,
        False,
    )
    # asked for, it stays, and a class-token model is refused with the option's own message
    with pytest.raises(ConfigError, match="--masked reconstructs each hidden patch"):
        train(build_config("default", {**settings, "masked.weight": 1.0}), tmp_path / "asked", quiet=True)


def test_the_recipes_progressive_resizing_stays_while_the_model_can_take_it():
    # the default trains at 64 px before its 96: it keeps doing so for any model that can take a 64 px
    # start (below its size, on its patch grid, fixed positions, from scratch), however the model is
    # named; a model that cannot trains without it unless the user asks for a start (it would upsample,
    # miss the patch grid, or meet learned positions the trainer refuses)
    kept = (
        {"vit.image_size": 96},
        {"vit.image_size": 128},
        {"vit.image_size": 72},
        {"vit.patch_size": 8},
        {"vit.patch_size": 16},
        {"vit.depth": 4},
    )
    for given in kept:
        assert build_config("default", given).data.start_size == 64, given
    for model in ("vit-ti/8", "ViT-S/16"):
        assert build_config("default", model=model).data.start_size == 64, model
    dropped = (
        {"vit.image_size": 64},
        {"vit.image_size": 48},
        {"vit.stem": "patch", "vit.patch_size": 12},
        {"vit.pos_embed": "learned"},
    )
    for given in dropped:
        assert build_config("default", given).data.start_size == 0, given
    assert (
        build_config("default", {"vit.stem": "patch"}, model="ViT-S/12").data.start_size == 0
    )  # 64 is not on a 12 px grid
    no_model = build_config(
        "default", {"vit.patch_size": 12}
    )  # a conv tokeniser needs a power of 2: left to the model's own error
    assert no_model.data.start_size == 64
    with pytest.raises(ConfigError, match="power of 2"):
        run_model_config(no_model)
    assert (
        build_config("default", {"vit.image_size": 48, "data.start_size": 32}).data.start_size == 32
    )  # asked for: kept
    # a recipe's own start its own model cannot take is the recipe's choice: kept, for the trainer to refuse
    for settings in ({"image_size": 48}, {"pos_embed": "learned"}):
        recipe = replace(load_recipe("default"), vit=replace(load_recipe("default").vit, **settings))
        assert without_recipe_resizing(recipe, recipe, {}).data.start_size == 64, settings


def test_a_tensorboard_run_that_fails_before_its_first_checkpoint_leaves_nothing(photos, tmp_path, monkeypatch, capsys):
    # seam bug: RUN/tensorboard/ stayed behind and the next `train --out RUN` was refused
    pytest.importorskip("tensorboard")
    import foodvit.training.trainer as trainer

    def diverge(*args, **kwargs):
        raise trainer.TrainingDiverged("the loss is NaN")

    out = tmp_path / "runs" / "tb"
    monkeypatch.setattr(trainer, "fit", diverge)
    with pytest.raises(trainer.TrainingDiverged):
        train(small(photos, tensorboard=True), out, quiet=True)
    assert not out.exists()
    monkeypatch.undo()
    train(small(photos, tensorboard=True), out, quiet=True)
    assert (out / "model.safetensors").is_file() and any((out / "tensorboard").iterdir())


def test_resuming_a_finished_run_changes_nothing(photos, tmp_path, capsys):
    out = tmp_path / "done"
    with report_figures():  # the figures are among the files that must not be written again
        train(small(photos), out, quiet=True)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(["train", "--resume", str(out)]) == 2
    assert (
        "is finished (1 of 1 epochs, model saved); nothing to resume and nothing was changed" in capsys.readouterr().err
    )
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_compare_refuses_a_broken_model_json(photos, tmp_path, capsys):
    # it used to leave the run's test metrics out without a word
    out = tmp_path / "cmp"
    train(small(photos), out, quiet=True)
    (out / "model.json").write_text("{not json")
    assert main(["compare", str(out)]) == 2
    assert f"{out / 'model.json'} is not readable JSON" in capsys.readouterr().err


def test_serving_a_run_being_trained_says_so(photos, tmp_path):
    from foodvit.deploy.predictor import Predictor
    from foodvit.rundir.directory import RunLock

    out = tmp_path / "busy"
    out.mkdir()
    with RunLock(out):
        with pytest.raises(RunError, match=rf"is being trained right now \(pid {os.getpid()} on "):
            Predictor.from_run(out)
    with pytest.raises(RunError, match="resume an unfinished run"):
        Predictor.from_run(out)


def test_a_lock_whose_owner_is_not_yet_written_is_still_respected(photos, tmp_path):
    # the old lock read its file for the owner's pid: created but not yet written, it looked stale and
    # was taken over (two writers). The OS lock does not depend on what the file says.
    out = tmp_path / "race"
    out.mkdir()
    code = (
        "from pathlib import Path; from foodvit.rundir.directory import RunLock; "
        f"lock = RunLock({str(out)!r}).acquire(); "
        f"(Path({str(out)!r}) / RunLock.OWNER).unlink(); (Path({str(out)!r}) / RunLock.NAME).write_text(''); "
        "print('held', flush=True); import time; time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunError, match=r"in use by another foodvit process \(owner unknown\)"):
            train(small(photos), out, quiet=True)
    finally:
        holder.kill()
        holder.wait()


def test_every_file_a_run_writes_is_listed_with_what_it_holds(shared_run):
    # the run directory's reference page is generated from these lists: a file missing there is missing here too
    from foodvit.rundir.directory import LOCKS, RUN_FILES, RUN_FOLDERS

    out, _ = shared_run
    written = {p.name for p in out.iterdir()}
    assert {"config.json", "checkpoint.pt", "model.safetensors", "report.md"} <= written
    assert written <= set(RUN_FILES) | set(RUN_FOLDERS) | set(LOCKS), written - set(RUN_FILES) - set(LOCKS)
