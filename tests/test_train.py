"""`foodvit train` end to end on generated photos (and, briefly, on the real FoodVision Mini)."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import assert_drawn_png, library_messages_on_stderr, make_photo_folder, report_figures

import foodvit
from foodvit.data.datasource import DataSource
from foodvit.data.folders import Split
from foodvit.deploy.inference import evaluate_split, predict
from foodvit.errors import RunError
from foodvit.recipes import load_recipe
from foodvit.training.engine import TrainingDiverged
from foodvit.training.run import resume, train
from foodvit.training.trainer import Trainer

SMALL = {"image_size": 32, "depth": 2}  # ViT-Ti/8 at 32 px, 2 blocks: an epoch in well under a second


def small_config(source, **changes):
    from dataclasses import replace

    config = load_recipe("tiny")
    config = replace(config, vit=replace(config.vit, **SMALL), data=replace(config.data, source=str(source)))
    train_changes = {k: v for k, v in changes.items() if k in ("epochs", "batch_size", "seed")}
    optim_changes = {k: v for k, v in changes.items() if k in ("lr", "ema", "accum_steps")}
    data_changes = {k: v for k, v in changes.items() if k in ("workers", "mixup", "cache")}
    return replace(
        config,
        train=replace(config.train, **train_changes),
        optim=replace(config.optim, **optim_changes),
        data=replace(config.data, **data_changes),
    )


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=16, n_test=6)


@pytest.fixture(scope="module")
def trained(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    with report_figures():
        result = train(small_config(photos, epochs=3, batch_size=10), out, quiet=True)
    return out, result


def untimed(history: list[dict]) -> list[dict]:
    """A run's history without its timings (seconds, images a second, the model's share), which vary run to run."""
    return [{k: v for k, v in row.items() if k not in ("seconds", "images_per_s", "model_share")} for row in history]


def test_run_directory_holds_everything(trained):
    out, result = trained
    for name in (
        "config.json",
        "metrics.csv",
        "curves.png",
        "confusion.png",
        "model.safetensors",
        "model.json",
        "checkpoint.pt",
        "report.md",
    ):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert set(rows[0]) == {
        "epoch",
        "train_loss",
        "train_objective",
        "train_acc",
        "val_loss",
        "val_acc",
        "test_loss",
        "test_acc",
        "lr",
        "seconds",
        "images_per_s",
        "model_share",
    }
    config = json.loads((out / "config.json").read_text())
    assert config["recipe"] == "tiny" and config["vit"]["image_size"] == 32
    report = (out / "report.md").read_text()
    correct = round(result.test["acc"] * result.test["n"])
    assert f"**Test accuracy: {result.test['acc']:.3f}** ({correct}/18 photos, per image)" in report
    assert "![loss and accuracy](curves.png)" in report
    assert float(rows[-1]["test_acc"]) == pytest.approx(result.test["acc"])
    # the report's three figures are real pictures
    for name in ("curves.png", "confusion.png", "most_wrong.png"):
        assert_drawn_png(out / name)


def test_trained_model_loads_evaluates_and_predicts(trained, photos):
    out, result = trained
    predictor = foodvit.load_predictor(out)
    assert predictor.classes == ["pizza", "steak", "sushi"]
    assert predictor.preprocess.image_size == 32 and not predictor.model.training
    assert not hasattr(foodvit.load_model(out), "class_names")  # the bare module: nothing attached to it
    # evaluating the saved model gives exactly the number the run reported
    evaluation = evaluate_split(predictor, DataSource.parse(photos).open_split("test"))
    assert evaluation["accuracy"] == result.test["acc"] and evaluation["n"] == 18
    assert sum(map(sum, evaluation["confusion"])) == 18
    photo = sorted((photos / "test" / "sushi").iterdir())[0]
    [p] = predict(predictor, [photo], top_k=2)
    assert p["label"] in predictor.classes and len(p["top_k"]) == 2
    assert list(p["probabilities"]) == predictor.classes and sum(p["probabilities"].values()) == pytest.approx(1.0)
    assert p["top_k"][0] == [p["label"], p["probability"]] and p["top_k"][0][1] >= p["top_k"][1][1]


def test_learns_the_generated_classes(photos, tmp_path):
    # colours differ by class: a working loop gets well past chance (1/3) in a few epochs
    result = train(small_config(photos, epochs=8, batch_size=8, lr=2e-3), tmp_path / "r", quiet=True)
    assert result.test["acc"] >= 0.8
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]


def test_same_seed_same_run_and_new_run_refuses_an_old_directory(photos, tmp_path):
    a = train(small_config(photos, epochs=2), tmp_path / "a", quiet=True)
    b = train(small_config(photos, epochs=2), tmp_path / "b", quiet=True)
    assert untimed(a.history) == untimed(b.history)
    with pytest.raises(RunError, match=r"already holds a run; continue it with `foodvit train --resume"):
        train(small_config(photos, epochs=2), tmp_path / "a", quiet=True)


@pytest.mark.slow  # loader processes; the fast tier keeps no workers against two
def test_one_or_two_loader_workers_train_the_same_run(photos, tmp_path):
    # each photo is augmented from its own seed when workers load the data, and the workers stay up
    # between epochs: how many there are changes nothing, mixup (drawn in the workers) included
    runs = [
        train(small_config(photos, epochs=2, batch_size=8, workers=w, mixup=0.8), tmp_path / f"w{w}", quiet=True)
        for w in (1, 2)
    ]  # two epochs: the second is the one the kept-up workers load
    assert untimed(runs[0].history) == untimed(runs[1].history)
    a, b = foodvit.load_model(tmp_path / "w1"), foodvit.load_model(tmp_path / "w2")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("cache", [True, False])
def test_training_workers_stay_up_and_cached_evaluation_needs_none(photos, tmp_path, cache):
    from foodvit.training.trainer import Trainer

    trainer = Trainer(small_config(photos, workers=2, cache=cache), tmp_path / "run", quiet=True)
    assert trainer.train_loader.num_workers == 2 and trainer.train_loader.persistent_workers
    # cached evaluation photos are finished tensors; otherwise evaluation decodes and needs the workers
    assert {loader.num_workers for loader in trainer.eval_loaders.values()} == {0 if cache else 2}


def _metrics(path):
    return [
        {k: v for k, v in row.items() if k not in ("seconds", "images_per_s", "model_share")}
        for row in csv.DictReader(path.open())
    ]


@pytest.mark.slow  # two Pythons; test_distill resumes interrupted runs in-process to the uninterrupted one
def test_kill_9_then_resume_equals_an_uninterrupted_run(photos, tmp_path):
    from foodvit.cli.main import main

    # --deterministic: on a GPU, bf16 attention and gather backward add with atomics, and without it
    # two uninterrupted runs already differ by rounding (seen on an H100); the resumed run reads it
    # back from the run's config. On the CPU it changes nothing.
    options = [
        "train",
        "--recipe",
        "tiny",
        "--data",
        str(photos),
        "--epochs",
        "6",
        "--image-size",
        "32",
        "--depth",
        "2",
        "--batch-size",
        "6",
        "--ema",
        "0.9",
        "--drloc",
        "0.1",
        "--deterministic",
        "true",
        "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core each, the same threads for all three runs
    victim = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "foodvit", *options, "--out", str(victim)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (victim / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = torch.load(victim / "checkpoint.pt", weights_only=True)["epoch"]
    assert 1 <= done < 6  # killed mid-run, with at least one finished epoch on disk
    assert not (victim / "model.safetensors").exists()

    # the resumed run goes on beside the uninterrupted one, which this process trains on one thread as the other
    # two did; should an assertion below fail first, the resumed run still ends by itself after its epochs. Only
    # metrics.csv and the weights are compared, so this run needs no report figures (helpers.report_figures)
    resumed = subprocess.Popen(
        [sys.executable, "-m", "foodvit", "train", "--resume", str(victim), "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*options, "--out", str(tmp_path / "full")]) == 0
    finally:
        torch.set_num_threads(threads)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert _metrics(victim / "metrics.csv") == _metrics(tmp_path / "full" / "metrics.csv")
    a, b = foodvit.load_model(victim), foodvit.load_model(tmp_path / "full")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_sigterm_stops_a_run_as_ctrl_c_does_saying_what_is_kept(photos, tmp_path):
    """kill (SIGTERM) ended `foodvit train` at once: exit status -15, no word of what was kept, and a metrics file's
    temporary copy left in the run folder for each kill that came mid-write."""
    run = tmp_path / "run"
    argv = ["train", "--recipe", "tiny", "--data", str(photos), "--epochs", "40", "--image-size", "32"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "foodvit", *argv, "--depth", "1", "--quiet", "--out", str(run)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (
        f"interrupted: every finished epoch (and stage) is saved in {run}; continue with `foodvit train --resume {run}`"
    )
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_resume_refuses_changes_and_missing_runs(tmp_path, capsys):
    from foodvit.cli.main import main

    assert main(["train", "--resume", str(tmp_path), "--lr", "0.1"]) == 2
    with pytest.raises(RunError, match="holds no foodvit run"):
        resume(tmp_path)
    # an empty --out or --resume (a shell variable not set) was read as not given: a new run in runs/<date>-<time>
    # tune made the working folder its study
    for command, flag in (("train", "--out"), ("train", "--resume"), ("tune", "--out"), ("cv", "--out")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main([command, flag, "", "--data", str(tmp_path)])
        assert stop.value.code == 2 and f"argument {flag}: is empty; give a folder's path" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--data", ""],
        ["train", "--resume", "run", "--data", ""],
        ["cv", "--data", ""],
        ["evaluate", "run", "--data", ""],
        ["inspect", "run", "--data", ""],
        ["data", ""],
        ["data", "--data", ""],
    ],
)
def test_an_empty_data_source_is_refused_not_taken_for_the_default(argv, tmp_path, capsys, monkeypatch):
    # --data "$PHOTOS" with the variable unset trained on the default source (or downloaded it) in place of the
    # user's photos, without a word
    from foodvit.cli.main import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "is empty; give a folder, a zip or a URL, or leave --data out" in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_of_an_older_version_resumes_without_the_settings_added_since(photos, tmp_path):
    # runs started before --train-fraction, --cache-gb and --tensorboard existed stored no such keys;
    # they count at their defaults, not as edits of config.json
    out = tmp_path / "old"
    train(small_config(photos, epochs=2, batch_size=16), out, quiet=True)
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    state["epoch"], state["history"] = 1, state["history"][:1]
    for section, key in (("data", "train_fraction"), ("data", "cache_gb"), ("train", "tensorboard")):
        del state["config"][section][key]
    torch.save(state, out / "checkpoint.pt")
    config = json.loads((out / "config.json").read_text())
    del config["data"]["train_fraction"], config["data"]["cache_gb"], config["train"]["tensorboard"]
    (out / "config.json").write_text(json.dumps(config))
    result = resume(out, quiet=True)
    assert [row["epoch"] for row in result.history] == [1, 2]


def test_a_resume_on_moved_photos_that_is_interrupted_resumes_again(photos, tmp_path, monkeypatch):
    # resume --data wrote the new source into config.json before any checkpoint held it: once interrupted, every
    # later resume was refused as an edit of config.json, after the interruption had said to resume
    out = tmp_path / "run"
    train(small_config(photos, epochs=2, batch_size=16), out, quiet=True)
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    state["epoch"], state["history"] = 1, state["history"][:1]
    torch.save(state, out / "checkpoint.pt")
    (out / "model.safetensors").unlink()
    moved = shutil.copytree(photos, tmp_path / "moved")

    def interrupted(self):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "fit", interrupted)
        with pytest.raises(KeyboardInterrupt):
            resume(out, data=str(moved), quiet=True)
    assert json.loads((out / "config.json").read_text())["data"]["source"] == str(moved)
    result = resume(out, quiet=True)
    assert [row["epoch"] for row in result.history] == [1, 2]


@pytest.mark.parametrize(
    "foreign",
    [{"epoch": 0, "model": {}, "optimizer": {}}, [1, 2, 3], torch.zeros(3), {"format": "foodvit-teacher"}],
    ids=["another-projects", "list", "tensor", "a-teachers"],
)
def test_a_checkpoint_of_another_kind_is_refused_in_one_line(trained, tmp_path, foreign, capsys):
    # another project's checkpoint was a KeyError in check_same_data, a list or a tensor an AttributeError
    from foodvit.cli.main import main

    out = shutil.copytree(trained[0], tmp_path / "run")
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    state["epoch"] = 1
    torch.save(state, out / "checkpoint.pt")
    (out / "report.md").unlink()
    torch.save(foreign, out / "checkpoint.pt")
    assert main(["train", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"foodvit train: error: {out / 'checkpoint.pt'} is not a foodvit")
    assert "Traceback" not in err


def test_a_run_interrupted_while_it_writes_its_results_resumes_to_them(photos, tmp_path, monkeypatch):
    # model.safetensors was taken for a finished run: interrupted after it and before report.md, the run was
    # refused as finished, its report and model.json never written
    from foodvit.training import report

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(report, "write_report", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            train(small_config(photos, epochs=1, batch_size=16), out, quiet=True)
    assert (out / "model.safetensors").is_file() and not (out / "report.md").exists()
    # stopped on another kind of machine: its epochs trained there alone, whatever writes its results
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    state["arithmetic"], state["processor"] = "bf16 on cuda", "NVIDIA H100"
    torch.save(state, out / "checkpoint.pt")
    result = resume(out, quiet=True)
    assert [row["epoch"] for row in result.history] == [1]
    metrics = json.loads((out / "model.json").read_text())["metrics"]
    assert (out / "report.md").is_file() and metrics["epochs"] == 1
    assert (metrics["arithmetic"], metrics["processor"]) == ("bf16 on cuda", "NVIDIA H100")
    with pytest.raises(RunError, match="is finished"):
        resume(out, quiet=True)


def test_nan_loss_keeps_the_last_good_checkpoint(photos, tmp_path, monkeypatch):
    from foodvit.model.vit import VisionTransformer

    calls = {"n": 0}
    original = VisionTransformer.forward_features  # what training and evaluation both call once a batch

    def poisoned(self, images, **options):
        calls["n"] += 1
        out = original(self, images, **options)
        return out * float("nan") if self.training and calls["n"] > 8 else out

    monkeypatch.setattr(VisionTransformer, "forward_features", poisoned)
    with pytest.raises(
        TrainingDiverged, match=r"(?s)the loss became nan.*in epoch 2.*last good checkpoint \(epoch 1\)"
    ):
        train(small_config(photos, epochs=3, batch_size=8), tmp_path / "nan", quiet=True)
    assert torch.load(tmp_path / "nan" / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert len(_metrics(tmp_path / "nan" / "metrics.csv")) == 1


@pytest.mark.slow  # ViT-B/16 at 224 and a 1 GB checkpoint; the other recipes train at 32 px throughout this file
def test_course_recipe_runs_one_epoch(tmp_path, capsys):
    # The course's settings unchanged (ViT-B/16 at 224, Adam 3e-3, wd 0.3 on everything), on 3 + 3 photos.
    from dataclasses import replace

    photos = make_photo_folder(
        tmp_path / "p", n_train=1, n_test=1, size=(60, 80)
    )  # one step of 3 photos: ViT-B/16's forward and backward cost seconds a photo here
    config = load_recipe("course")
    config = replace(
        config, data=replace(config.data, source=str(photos)), train=replace(config.train, epochs=1, batch_size=4)
    )
    library_messages_on_stderr()  # the size note is a warning of the library's logger
    result = train(config, tmp_path / "course", quiet=True)
    predictor = foodvit.load_predictor(tmp_path / "course")
    model = predictor.model
    assert model.config.embed_dim == 768 and model.config.image_size == 224 and predictor.preprocess.mode == "square"
    assert predictor.preprocess.mean == (0.0, 0.0, 0.0) and predictor.preprocess.std == (1.0, 1.0, 1.0)
    assert len(result.history) == 1 and result.test["n"] == 3
    # said before it starts: what the course's model costs on a CPU, and its checkpoint's size
    err = capsys.readouterr().err
    assert (
        "ViT-B/16 has 85.8 M parameters; checkpoint.pt will hold about 1.0 GB" in err
        and "about 3.5 minutes an epoch" in err
    )
    assert (tmp_path / "course" / "checkpoint.pt").stat().st_size > 0.95e9


@pytest.mark.realdata
@pytest.mark.slow  # 300 real photos decoded; the fast tier trains the same code on generated photos
def test_tiny_recipe_trains_one_epoch_on_foodvision_mini(real_data, tmp_path):
    from dataclasses import replace

    config = load_recipe("tiny")
    config = replace(config, data=replace(config.data, source=str(real_data)), train=replace(config.train, epochs=1))
    result = train(config, tmp_path / "fvm", quiet=True)
    assert result.test["n"] == 75 and len(result.history) == 1
    assert sum(result.test["confusion"].flatten().tolist()) == 75


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 3600000000 bytes. Error code 12 (Cannot allocate memory)"
        ),
        MemoryError(),
    ],
)
def test_memory_running_out_in_training_is_one_line_naming_the_size_to_lower(
    photos, tmp_path, capsys, monkeypatch, error
):
    from foodvit.cli.main import main
    from foodvit.training.trainer import Trainer

    def fit(self):
        raise error  # what PyTorch's allocator raises where a --teacher-size 5000 batch does not fit

    monkeypatch.setattr(Trainer, "fit", fit)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(photos),
                "--out",
                str(out),
                "--recipe",
                "tiny",
                "--image-size",
                "32",
                "--depth",
                "1",
                "--distill",
                "0.5",
                "--teacher-size",
                "512",
                "--quiet",
            ]
        )
        == 2
    )
    whole = capsys.readouterr().err.strip()  # it was the allocator's traceback
    err = whole.splitlines()[-1]  # after the run directory's name, which --quiet keeps
    assert "Traceback" not in whole and err.startswith("foodvit train: error: ran out of memory"), whole
    assert "--teacher-size 512" in err and "lower --teacher-size" in err and "--batch-size 32" in err, err
    assert ("3.6 GB" in err) == isinstance(error, RuntimeError), err
    assert not out.exists()  # nothing to resume: the folder left as it was found
    assert (
        main(["train", "--data", str(photos), "--out", str(out), "--recipe", "tiny", "--image-size", "32", "--quiet"])
        == 2
    )
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "at --image-size 32 with --batch-size 32: lower --image-size "
            "(or raise --patch-size: fewer, larger patches), or "
            "--batch-size"
        )
    )  # no teacher: the model's own side
    other = RuntimeError("mat1 and mat2 shapes cannot be multiplied")  # not the memory's: a bug, kept as it is
    monkeypatch.setattr(Trainer, "fit", lambda self: (_ for _ in ()).throw(other))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        main(["train", "--data", str(photos), "--out", str(out), "--recipe", "tiny", "--image-size", "32", "--quiet"])


def test_deterministic_mode_is_scoped_to_the_block(monkeypatch):
    from foodvit.training.engine import deterministic_algorithms

    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        with deterministic_algorithms(True):
            assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark is False
        # the process's own settings come back: a library must not leave global switches behind
        assert torch.are_deterministic_algorithms_enabled() == before[0] and torch.backends.cudnn.benchmark is True
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark = before[1]


def test_deterministic_run_configures_cublas_before_its_first_product(monkeypatch, photos, tmp_path):
    import foodvit.training.trainer as trainer

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen, real_fit = [], trainer.fit

    def fit(*args, **kwargs):  # what the training loop runs under
        seen.append((os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.are_deterministic_algorithms_enabled()))
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(trainer, "fit", fit)
    config = small_config(photos, epochs=1, batch_size=16)
    from dataclasses import replace

    train(replace(config, train=replace(config.train, deterministic=True)), tmp_path / "det", quiet=True)
    assert seen == [(":4096:8", True)]  # cuBLAS refuses deterministic mode without it
    # and the process is given back as it was: no variable left set, deterministic mode off
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow  # two trainings; the fast tier keeps the cache's own tests (test_data, the workers' test)
def test_cache_on_or_off_is_the_same_experiment(photos, tmp_path):
    # before, the cached path resized every photo once more than the uncached one: another experiment
    runs = [
        train(small_config(photos, epochs=2, batch_size=8, cache=cache), tmp_path / f"c{cache}", quiet=True)
        for cache in (True, False)
    ]
    assert untimed(runs[0].history) == untimed(runs[1].history)
    a, b = foodvit.load_model(tmp_path / "cTrue"), foodvit.load_model(tmp_path / "cFalse")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_no_workers_and_two_workers_train_the_same_run(photos, tmp_path):
    # augmentation draws from each photo's own seed in the training process too
    runs = [
        train(small_config(photos, epochs=2, batch_size=8, workers=w), tmp_path / f"w{w}", quiet=True) for w in (0, 2)
    ]
    assert untimed(runs[0].history) == untimed(runs[1].history)


def test_evaluating_less_often_trains_the_same_model(photos, tmp_path):
    # the default evaluates every 5th epoch for speed: an evaluation draws from PyTorch's random stream (the
    # loader's base seed), and every epoch reseeds the stream that the masks and drloc's pairs draw from
    from foodvit.settings.overrides import with_settings

    runs = []
    for every in (1, 2):
        config = with_settings(
            small_config(photos, epochs=3, batch_size=8),
            {"vit.pool": "gap", "masked.weight": 1.0, "drloc.weight": 0.5, "train.eval_every": every},
        )
        runs.append(train(config, tmp_path / f"every{every}", quiet=True))
    each, fewer = (
        [{k: v for k, v in row.items() if k not in ("seconds", "images_per_s", "model_share")} for row in run.history]
        for run in runs
    )
    assert [row.get("test_acc") is not None for row in fewer] == [False, True, True]
    assert [{k: v for k, v in row.items() if k in fewer[i]} for i, row in enumerate(each)] == fewer
    a, b = foodvit.load_model(tmp_path / "every1"), foodvit.load_model(tmp_path / "every2")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_run_started_up_to_its_first_epoch_is_prepared_as_train_prepares_it(photos, tmp_path):
    # pre-trained weights dictate the model (pretrained.adapt_config) in both; with no stage to train, the run is
    # still left resumable from its first epoch
    import timm
    from safetensors.torch import save_file

    from foodvit.model.pretrained import adapt_config
    from foodvit.rundir.directory import with_source
    from foodvit.settings.overrides import with_settings
    from foodvit.settings.run import RunConfig
    from foodvit.training.run import train_stages

    weights = tmp_path / "vit_ti.safetensors"
    save_file(
        {k: v.contiguous() for k, v in timm.create_model("vit_tiny_patch16_224").state_dict().items()}, str(weights)
    )
    config = with_settings(small_config(photos, epochs=1, batch_size=8), {"train.pretrained": str(weights)})
    train_stages(config, tmp_path / "staged")
    stored = RunConfig.from_dict(json.loads((tmp_path / "staged" / "config.json").read_text()))
    assert stored == adapt_config(with_source(config)) and (stored.model, config.model) == ("ViT-Ti/16", "ViT-Ti/8")
    assert (tmp_path / "staged" / "checkpoint.pt").is_file()
    assert resume(tmp_path / "staged", quiet=True).history[-1]["epoch"] == 1


def test_every_purpose_draws_from_its_own_seed():
    from foodvit.seeds import PURPOSES, derive_seed

    seeds = {derive_seed(42, purpose, epoch) for purpose in PURPOSES for epoch in range(200)}
    assert len(seeds) == len(PURPOSES) * 200  # no two streams start alike
    assert derive_seed(42, "order", 3) == derive_seed(42, "order", 3) and 0 <= derive_seed(7, "init") < 2**63
    # the validation split is not drawn from the stream that initialises the model or orders the photos
    from foodvit.data.folders import split_validation
    from foodvit.data.sampling import EpochSampler

    g = torch.Generator().manual_seed(42)
    assert torch.randperm(20, generator=g).tolist() != list(EpochSampler(20, 42))
    split = Split(Path("."), ("a",), tuple((Path(f"{i}.jpg"), 0) for i in range(20)))
    _, val = split_validation(split, 0.25, 42)
    g = torch.Generator().manual_seed(42)
    naive = sorted(str(Path(f"{i}.jpg")) for i in torch.randperm(20, generator=g).tolist()[:5])
    assert sorted(str(p) for p, _ in val.samples) != naive


def test_test_size_tests_and_saves_the_model_at_a_higher_resolution(photos, tmp_path):
    """FixRes (--test-size): after training at 32 px the model is rebuilt for 48 px (fixed sin-cos
    positions recomputed for the 6 x 6 grid), tested there, and saved that way; the report says both."""
    from dataclasses import replace

    config = small_config(photos, epochs=2, batch_size=8)
    config = replace(
        config, vit=replace(config.vit, pos_embed="sincos2d", pool="gap"), data=replace(config.data, test_size=48)
    )
    out = tmp_path / "r"
    result = train(config, out, quiet=True)
    predictor = foodvit.load_predictor(out)
    assert predictor.model.config.image_size == 48 and predictor.preprocess.image_size == 48
    assert predictor.preprocess.resize_size == round(48 * 36 / 32)  # the training preprocessing's crop share (32 of 36)
    evaluation = evaluate_split(predictor, DataSource.parse(photos).open_split("test"))
    assert evaluation["accuracy"] == pytest.approx(result.test["acc"]) and evaluation["loss"] == pytest.approx(
        result.test["loss"], rel=1e-4
    )
    # the per-epoch rows were measured at the training size: the 32 px model, not the saved one
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
    assert checkpoint["model_config"]["image_size"] == 32
    assert "32 px, tested at 48" in (out / "report.md").read_text()


def test_test_size_off_the_patch_grid_is_refused_before_training(photos, tmp_path):
    from dataclasses import replace

    from foodvit.errors import ConfigError

    config = small_config(photos, epochs=1)
    with pytest.raises(ConfigError, match=r"--test-size 44 is not a multiple of the patch size 8; use 40 or 48"):
        train(replace(config, data=replace(config.data, test_size=44)), tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


def test_progressive_resizing_trains_small_first_and_evaluates_at_the_model_size(photos, tmp_path, monkeypatch):
    """--start-size 16 --start-share 0.5 over 4 epochs: epochs 1-2 train on 16 px batches (resized
    from the loader's 32 px), epochs 3-4 on 32 px; every evaluation, and the saved model, at 32 px."""
    from dataclasses import replace

    from foodvit.model.vit import PatchEmbed

    seen = []
    original = PatchEmbed.forward
    monkeypatch.setattr(
        PatchEmbed, "forward", lambda self, x: (seen.append((self.training, x.shape[-1])), original(self, x))[1]
    )
    config = small_config(photos, epochs=4, batch_size=16)
    config = replace(
        config,
        vit=replace(config.vit, pos_embed="sincos2d", pool="gap"),
        data=replace(config.data, start_size=16, start_share=0.5),
        drloc=replace(config.drloc, weight=0.5),
    )
    result = train(config, tmp_path / "r", quiet=True)
    training = [size for is_training, size in seen if is_training]
    assert training == [16] * 6 + [32] * 6  # 48 training photos: 3 batches an epoch
    assert {size for is_training, size in seen if not is_training} == {32}
    assert foodvit.load_predictor(tmp_path / "r").model.config.image_size == 32
    assert len(result.history) == 4


def test_progressive_resizing_needs_fixed_positions_and_a_size_on_the_patch_grid(photos, tmp_path):
    from dataclasses import replace

    from foodvit.errors import ConfigError

    config = small_config(photos, epochs=1)
    with pytest.raises(ConfigError, match=r"--start-size \(progressive resizing\) needs fixed position embeddings"):
        train(replace(config, data=replace(config.data, start_size=16)), tmp_path / "a", quiet=True)
    config = replace(config, vit=replace(config.vit, pos_embed="sincos2d"))
    with pytest.raises(ConfigError, match=r"--start-size 20 is not a multiple of the patch size 8; use 16 or 24"):
        train(replace(config, data=replace(config.data, start_size=20)), tmp_path / "b", quiet=True)
    size = config.vit.image_size or 64
    with pytest.raises(
        ConfigError, match=rf"--start-size {size + 8} is above the image size {size}: .* or 0 to turn it off"
    ):
        train(replace(config, data=replace(config.data, start_size=size + 8)), tmp_path / "c", quiet=True)


def test_the_report_shows_class_and_folder_names_as_text_never_as_markup(tmp_path):
    from helpers import HOSTILE_CLASSES, rendered_markdown

    from foodvit.training.report import write_report

    run = tmp_path / "<img src=https:evil.example>"  # the run's folder is named by its user too
    run.mkdir()
    confusion = torch.tensor([[2, 0, 0], [1, 1, 0], [0, 0, 2]])
    counts = {split: dict.fromkeys(HOSTILE_CLASSES, n) for split, n in (("train", 4), ("test", 2))}
    info = {
        "image_size": 32,
        "patch_size": 8,
        "params": 1000,
        "trainable": 1000,
        "device": "CPU",
        "data_root": str(tmp_path / "`<img src=x>` | data"),
    }
    write_report(
        run,
        config=load_recipe("tiny"),
        classes=HOSTILE_CLASSES,
        counts=counts,
        history=[{"epoch": 1, "seconds": 1.0}],
        final={"acc": 5 / 6, "n": 6, "loss": 0.5, "confusion": confusion},
        model_info=info,
    )
    report = rendered_markdown((run / "report.md").read_text())
    # the figures alone are pictures; a class name had been a live <img> in the photos row and the per-class table
    assert report.pictures == ["curves.png", "confusion.png"] and report.links == [] and "em" not in report.tags
    assert f"foodvit run: {run.name}" in report.text and info["data_root"] in report.text
    for name in HOSTILE_CLASSES:
        assert f"{name} 4" in report.text and f"\n{name}\n" in report.text  # the photos row, the per-class table
    assert report.tags.count("table") == 2 and report.tags.count("td") == 2 * 7 + 3 * 3  # no cell split by a `|`


def test_a_run_resumed_in_other_arithmetic_says_so_and_its_model_names_both(photos, tmp_path, monkeypatch, capsys):
    # one epoch on a CPU of one kind (native bf16 or not), the second resumed on the other: the run's model.json
    # names both ("X, then Y"), which a study reads as an arithmetic of its own, and the resume says so in one line
    from dataclasses import replace

    import foodvit.training.trainer as T
    from foodvit.training import engine

    config = small_config(photos, epochs=2, batch_size=8)
    config = replace(config, train=replace(config.train, amp=True, device="cpu"))
    out = tmp_path / "run"
    real = T.fit
    with monkeypatch.context() as patched:
        patched.setattr(engine, "cpu_computes_bf16", lambda: True)
        patched.setattr(T, "processor", lambda device: "Chip A")
        patched.setattr(T, "fit", lambda *a, **k: real(*a, **{**k, "epochs": 1}))
        train(config, out, quiet=True)
    metrics = json.loads((out / "model.json").read_text())["metrics"]
    assert metrics["arithmetic"] == "bf16 on cpu" and metrics["processor"] == "Chip A"
    capsys.readouterr()
    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: False)
    monkeypatch.setattr(T, "processor", lambda device: "Chip B")  # the chip too, recorded the same way
    resume(out)
    said = [line for line in capsys.readouterr().out.splitlines() if "trained in" in line]
    assert said == [
        f"{out}: trained in bf16 on cpu up to epoch 1, and the rest trains in float32 on cpu here, so the run is "
        "not the one either machine alone would give (its model.json names both)"
    ]
    metrics = json.loads((out / "model.json").read_text())["metrics"]
    assert metrics["arithmetic"] == "bf16 on cpu, then float32 on cpu" and metrics["processor"] == "Chip A, then Chip B"
    assert T.resumed("Chip A, then Chip B", "Chip B") == "Chip A, then Chip B" and T.resumed(None, "Chip B") == "Chip B"


@pytest.mark.parametrize("amp", [True, False])
def test_bf16_training_is_reported_and_the_saved_model_scores_what_it_says(photos, tmp_path, monkeypatch, amp):
    # on a CPU that multiplies bf16 natively, --amp trains under bf16 autocast and the report says so; evaluation is
    # float32, so the saved model, loaded and evaluated, scores exactly the test accuracy the run reported
    from dataclasses import replace

    from foodvit.training import engine

    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: True)
    config = small_config(photos, epochs=1, batch_size=8)
    config = replace(config, train=replace(config.train, amp=amp, device="cpu"))  # on CUDA evaluation is bf16 too
    out = tmp_path / "run"
    result = train(config, out, quiet=True)
    assert ("training in bf16 autocast" in (out / "report.md").read_text()) is amp
    evaluation = evaluate_split(foodvit.load_predictor(out), DataSource.parse(photos).open_split("test"))
    assert evaluation["accuracy"] == result.test["acc"]
    assert evaluation["confusion"] == result.test["confusion"].tolist()
