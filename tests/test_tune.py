"""foodvit cv and foodvit tune (tuning/cv.py, folds.py, fold.py, study.py, compare.py, search.py): k-fold CV over the
training photos alone, resumed fold by fold; an Optuna study with pruning by fold, failed trials, SQLite shared by
processes; the bad inputs refused in one line. Tiny runs: the tiny recipe at 32 px, depth 1, 1
epoch, on 4 generated photos a class, 2 folds."""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import make_photo_folder

optuna = pytest.importorskip("optuna")

from foodvit import markup  # noqa: E402
from foodvit.cli.main import main  # noqa: E402
from foodvit.cli.options import build_config  # noqa: E402
from foodvit.errors import ConfigError, StudyError  # noqa: E402
from foodvit.recipes import load_recipe  # noqa: E402
from foodvit.settings.overrides import with_settings  # noqa: E402
from foodvit.settings.run import RunConfig  # noqa: E402
from foodvit.tuning import compare, cv  # noqa: E402
from foodvit.tuning.folds import fold_folder, fold_folders, training_photos  # noqa: E402
from foodvit.tuning.search import parse_budget, tune  # noqa: E402
from foodvit.tuning.space import Param, trial_config  # noqa: E402
from foodvit.tuning.study import one_arithmetic, open_study, study_settings  # noqa: E402
from foodvit.tuning.summary import costs, write_report  # noqa: E402

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1"]
TINY_OVERRIDES = {"train.epochs": 1, "vit.image_size": 32, "vit.depth": 1}


def poisoned_copy(photos: Path, where: Path) -> Path:
    """The same training photos; a test split of non-images and a class the training split lacks:
    anything that read it would fail or change its results."""
    shutil.copytree(photos / "train", where / "train")
    for name in ("pizza", "steak", "sushi", "burger"):
        (where / "test" / name).mkdir(parents=True)
        (where / "test" / name / "000.jpg").write_bytes(b"poison: not a photo")
    return where


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


@pytest.fixture(scope="module")
def cv_study(tmp_path_factory, photos):
    """A 2-fold study interrupted (Ctrl-C) while its second fold starts, then run again: the runs
    each attempt started."""
    import foodvit.training.run as trainer

    study = tmp_path_factory.mktemp("studies") / "a"
    real_train, started = trainer.train, []

    def train(config, out, **kwargs):
        started.append(Path(out).name)
        if len(started) == 2 and interrupt:
            raise KeyboardInterrupt
        return real_train(config, out, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer, "train", train)
        interrupt = True
        first = main(["cv", "--data", str(photos), "--folds", "2", "--out", str(study), "--quiet", *TINY])
        fold0 = (study / "fold-0" / "model.safetensors").stat().st_mtime_ns
        after_interrupt = list(started)
        interrupt = False
        second = main(["cv", "--data", str(photos), "--folds", "2", "--out", str(study), "--quiet", *TINY])
    return {
        "study": study,
        "first": first,
        "second": second,
        "after_interrupt": after_interrupt,
        "started": started,
        "fold0_mtime": fold0,
    }


def test_cv_writes_per_fold_results_and_resumes_without_retraining_a_finished_fold(cv_study, photos, capsys):
    study = cv_study["study"]
    assert cv_study["first"] == 130 and cv_study["after_interrupt"] == ["fold-0", "fold-1"]
    assert cv_study["second"] == 0
    assert cv_study["started"] == ["fold-0", "fold-1", "fold-1"]  # the rerun trained fold 1 alone
    assert (study / "fold-0" / "model.safetensors").stat().st_mtime_ns == cv_study["fold0_mtime"]
    result = json.loads((study / "cv.json").read_text())
    assert [f["fold"] for f in result["folds"]] == [0, 1]
    assert all(set(f["per_class"]) == {"pizza", "steak", "sushi"} for f in result["folds"])
    # every training photo held out exactly once, no test photo anywhere
    predictions = [json.loads(line) for line in (study / "predictions.jsonl").read_text().splitlines()]
    train_photos = sorted(f"{p.parent.name}/{p.name}" for p in (photos / "train").rglob("*.jpg"))
    assert sorted(p["photo"] for p in predictions) == train_photos
    assert result["accuracy"] == pytest.approx(sum(p["right"] for p in predictions) / len(predictions))
    for p in (
        predictions
    ):  # every class's probability kept (studies on the same folds can be averaged), the guess its largest
        assert set(p["probabilities"]) == {"pizza", "steak", "sushi"} and sum(
            p["probabilities"].values()
        ) == pytest.approx(1, abs=1e-5)
        assert (
            max(p["probabilities"], key=p["probabilities"].get) == p["predicted"]
            and p["probabilities"][p["predicted"]] == p["probability"]
        )
    assert sum(f["n"] for f in result["folds"]) == 12 and "+-" in (study / "cv.md").read_text()
    # each fold is a normal run evaluated on its held-out photos alone
    fold_config = json.loads((study / "fold-1" / "config.json").read_text())
    assert Path(fold_config["data"]["source"]) == study / "folds" / "seed-42" / "fold-1"


def test_cv_never_reads_the_test_split_and_compare_pairs_two_studies(cv_study, photos, tmp_path, capsys):
    poisoned = poisoned_copy(photos, tmp_path / "poisoned")
    study_b = tmp_path / "b"
    assert main(["cv", "--data", str(poisoned), "--folds", "2", "--out", str(study_b), "--quiet", *TINY]) == 0
    a, b = (json.loads((s / "cv.json").read_text()) for s in (cv_study["study"], study_b))
    assert a["photos"] == b["photos"] and a["accuracy"] == b["accuracy"]
    capsys.readouterr()
    assert main(["cv", "--compare", str(cv_study["study"]), str(study_b)]) == 0
    line = capsys.readouterr().out
    assert "+0.000" in line and "0 right only in" in line
    # a made-up disagreement shows as the photos only one study got right
    result = compare.paired({"x/1": True, "x/2": False, "x/3": True}, {"x/1": True, "x/2": True, "x/3": False})
    assert result["only_a"] == ["x/3"] and result["only_b"] == ["x/2"] and result["difference"] == 0
    with pytest.raises(StudyError, match="hold no photos to pair"):  # statistics' own error on an empty mean
        compare.paired({}, {})


def test_a_study_split_by_fold_over_machines_of_two_arithmetics_is_refused_before_it_trains(
    photos, tmp_path, monkeypatch, capsys
):
    """--fold K on machines of two kinds: the first claims the study's arithmetic (arithmetic.json), and a machine that
    would train in another is refused before it trains, by the claim or, where none was written (a study begun before
    foodvit claimed one, or its claim removed), by the results of every fold already run, not only its own --fold's."""
    import torch

    from foodvit.training import engine

    ours = engine.arithmetic(torch.device("cpu"), True)
    other = {"bf16 on cpu": "float32 on cpu", "float32 on cpu": "bf16 on cpu"}[ours]
    study = tmp_path / "s"
    args = ["cv", "--data", str(photos), "--folds", "2", "--seeds", "2", "--device", "cpu", "--quiet", *TINY]
    assert main([*args, "--out", str(study), "--fold", "0"]) == 0
    capsys.readouterr()
    assert json.loads((study / "arithmetic.json").read_text()) == {"arithmetic": ours}
    assert [json.loads((study / f"seed-{s}" / "fold-0.json").read_text())["arithmetic"] for s in (42, 43)] == [ours] * 2
    fresh = tmp_path / "fresh"  # another machine started it at the same moment: the claim alone, no result yet
    fresh.mkdir()
    shutil.copy(study / "study.json", fresh)
    (fresh / "arithmetic.json").write_text(json.dumps({"arithmetic": other}))
    assert main([*args, "--out", str(fresh), "--fold", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"trains in {other} (arithmetic.json" in err
    assert f"this machine would train in {ours}" in err and not (fresh / "seed-42").exists()
    (fresh / "arithmetic.json").write_text("{")
    assert main([*args, "--out", str(fresh), "--fold", "1"]) == 2
    assert "arithmetic.json is damaged" in capsys.readouterr().err and not (fresh / "seed-42").exists()

    (study / "arithmetic.json").unlink()  # the results of fold 0 still say
    with monkeypatch.context() as patched:
        patched.setattr(engine, "cpu_computes_bf16", lambda: other == "bf16 on cpu")
        assert main([*args, "--out", str(study), "--fold", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"seed-42/fold-0, seed-43/fold-0 trained in {ours} and this machine would train the rest in {other}" in err
    assert len(err.splitlines()) == 1 and not (study / "seed-42" / "fold-1").exists()


def test_folds_of_two_arithmetics_that_trained_at_once_are_not_summarised(photos, tmp_path, monkeypatch, capsys):
    """Results of two arithmetics (written where no claim stopped them: a study begun before foodvit claimed one, or
    its claim removed) are refused together, never summarised; the message names every run to remove."""

    def trained_elsewhere(config, run, folder, *, seed, fold, **_):
        prediction = {"photo": f"pizza/{fold}.jpg", "label": "pizza", "predicted": "pizza", "right": True}
        kind = ("bf16 on cpu", "float32 on cpu")[fold]
        return {"seed": seed, "fold": fold, "n": 1, "accuracy": 1.0, "predictions": [prediction], "arithmetic": kind}

    from foodvit.training import engine

    monkeypatch.setattr(cv, "run_fold", trained_elsewhere)
    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: True)  # this process claims bf16, on any CPU
    study = tmp_path / "s"
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--device", "cpu", "--out", str(study), "--quiet", *TINY])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "mixes arithmetic: fold-0 trained in bf16 on cpu, fold-1 in float32 on cpu" in err
    )
    assert not (study / "cv.json").exists()
    three = {"fold-0": "bf16 on cpu", "fold-1": "float32 on cpu", "fold-2": "bf16 on cpu"}
    (study / "arithmetic.json").unlink()  # this machine's claim
    with pytest.raises(StudyError, match=r"remove \S+fold-1 with \S+fold-1.json and run the study again on a CPU with"):
        one_arithmetic(study, three, None)  # the arithmetic of the most runs is kept
    three_kinds = {**three, "fold-3": "bf16 on cuda"}
    with pytest.raises(
        StudyError, match=r"fold-1 in float32 on cpu; fold-3 in bf16 on cuda; a study .*fold-3\.json and"
    ):
        one_arithmetic(study, three_kinds, None)
    (study / "arithmetic.json").write_text(json.dumps({"arithmetic": "float32 on cpu"}))
    with pytest.raises(
        StudyError, match=r"fold-1 trained in float32 on cpu, fold-0, fold-2 in bf16 on cpu; .*fold-2\.json and run"
    ):
        one_arithmetic(study, three, None)  # unless the study claimed the other


def test_cv_fold_runs_one_fold_and_the_study_is_written_once_every_fold_has_run(cv_study, photos, tmp_path, capsys):
    study = tmp_path / "d"
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--fold", "1", "--out", str(study), "--quiet", *TINY]) == 0
    )
    out = capsys.readouterr()
    assert (study / "fold-1.json").is_file() and not (study / "fold-0").exists() and not (study / "cv.json").exists()
    assert "fold 1 of 2: accuracy" in out.out and "fold 0 still to run" in out.out
    assert "seed 42 fold 0" not in out.err and "seed 42 fold 1" in out.err
    # unfinished, it already pairs with the finished study over the fold both have: itself, photo by photo
    result, line = compare.compare_studies(cv_study["study"], study)
    half = json.loads((study / "fold-1.json").read_text())["predictions"]
    assert result["n"] == len(half) and result["difference"] == 0 and "of the folds both have finished, fold 1;" in line
    assert main(["cv", "--compare", str(cv_study["study"]), str(study)]) == 0 and "fold 1;" in capsys.readouterr().out
    empty, fresh = tmp_path / "empty", tmp_path / "fresh"
    empty.mkdir()
    fresh.mkdir()
    shutil.copy(study / "study.json", fresh)  # a study opened, no fold run yet
    for other, message in (
        (empty, "is no cross-validation study"),
        (cv_study["study"] / "folds", "is no cross-validation study"),
        (fresh, "have no finished fold in common yet"),
    ):
        assert main(["cv", "--compare", str(study), str(other)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    trained = (study / "fold-1" / "model.safetensors").stat().st_mtime_ns
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--fold", "0", "--out", str(study), "--quiet", *TINY]) == 0
    )
    assert (study / "fold-1" / "model.safetensors").stat().st_mtime_ns == trained  # read, not trained again
    whole, alone = (json.loads((s / "cv.json").read_text()) for s in (cv_study["study"], study))
    assert alone["photos"] == whole["photos"] and alone["accuracy"] == whole["accuracy"]  # the same study, fold by fold
    assert "2-fold CV accuracy" in capsys.readouterr().out
    for argv, message in (
        (["--fold", "2", "--fold", "3", "--fold", "1"], "--fold 2, 3: a 2-fold study has folds 0 to 1"),
        (
            ["--compare", str(study), str(study), "--fold", "0", "--teachers", str(study)],
            "--teachers and --fold are for a study being run",
        ),
    ):
        assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(tmp_path / "e"), *TINY, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "e").exists()  # refused before anything was made
    with pytest.raises(SystemExit):  # argparse's own refusal, its usage above it
        main(["cv", "--folds", "2", "--fold", "-1", "--out", str(tmp_path / "e")])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("argument --fold: must be >= 0, got -1")


@pytest.mark.slow  # two seeds' folds; the fast tier runs --fold on one seed (the test above)
def test_cv_fold_with_two_seeds_runs_that_fold_of_each_and_names_the_ones_left(cv_study, photos, tmp_path, capsys):
    study = tmp_path / "s"
    two = ["cv", "--data", str(photos), "--folds", "2", "--seeds", "2", "--out", str(study), "--quiet", *TINY]
    assert main([*two, "--fold", "1"]) == 0
    assert sorted(p.name for p in study.glob("seed-*/fold-*.json")) == ["fold-1.json", "fold-1.json"]
    out = capsys.readouterr().out
    assert "fold 1 of 2 (of each seed)" in out and "fold 0 still to run" in out and not (study / "cv.json").exists()
    assert main([*two, "--fold", "0"]) == 0
    result = json.loads((study / "cv.json").read_text())
    assert sorted((f["seed"], f["fold"]) for f in result["folds"]) == [(42, 0), (42, 1), (43, 0), (43, 1)]
    assert {k: v for k, v in result["photos"].items() if k.startswith("s42/")} == json.loads(
        (cv_study["study"] / "cv.json").read_text()
    )["photos"]


def test_a_study_grows_by_seeds_keeping_the_runs_of_those_it_holds(cv_study, photos, tmp_path, monkeypatch, capsys):
    """`foodvit cv` with a larger --seeds on a finished one-seed study trains the new seed's folds alone: the first
    seed's runs move to seed-42/ untouched, the summary covers both, fewer seeds than it holds are refused, and a
    comparison with the one-seed study pairs the seed both hold."""
    from filelock import FileLock

    import foodvit.training.run as trainer
    from foodvit.tuning.fold import result_path

    one, grown = cv_study["study"], tmp_path / "grown"
    shutil.copytree(one, grown)
    kept = {k: (grown / f"fold-{k}.json").read_bytes() for k in range(2)}
    weights = {k: (grown / f"fold-{k}" / "model.safetensors").read_bytes() for k in range(2)}
    args = ["cv", "--data", str(photos), "--folds", "2", "--out", str(grown), "--quiet", *TINY]

    with FileLock(grown / ".fold-1.lock"):  # fold 1 taken by another process: nothing moves, nothing trains
        assert main([*args, "--seeds", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{grown / 'fold-1'} is being run by another process" in err
    assert (grown / "fold-0.json").is_file() and not (grown / "seed-42").exists() and (grown / "cv.json").is_file()

    real_train, started = trainer.train, []
    monkeypatch.setattr(
        trainer, "train", lambda config, out, **kw: started.append(str(out)) or real_train(config, out, **kw)
    )
    assert main([*args, "--seeds", "2"]) == 0
    assert "grown from seeds 42 to 42, 43" in capsys.readouterr().err
    assert sorted(Path(s).relative_to(grown).as_posix() for s in started) == ["seed-43/fold-0", "seed-43/fold-1"]
    for k in range(2):
        assert result_path(grown / "seed-42" / f"fold-{k}").read_bytes() == kept[k]
        assert (grown / "seed-42" / f"fold-{k}" / "model.safetensors").read_bytes() == weights[k]
        assert not (grown / f"fold-{k}").exists()
    result = json.loads((grown / "cv.json").read_text())
    assert result["study"]["seeds"] == [42, 43] and json.loads((grown / "study.json").read_text())["seeds"] == [42, 43]
    assert sorted((f["seed"], f["fold"]) for f in result["folds"]) == [(42, 0), (42, 1), (43, 0), (43, 1)]
    assert {k: v for k, v in result["photos"].items() if k.startswith("s42/")} == json.loads(
        (one / "cv.json").read_text()
    )["photos"]

    assert main([*args, "--seeds", "2"]) == 0 and len(started) == 2  # resumed as grown: nothing trains
    assert "grown" not in capsys.readouterr().err
    assert main(args) == 2  # fewer seeds than it holds
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seed 42 --seeds 2 resumes it, a larger --seeds grows it" in err
    # a path to a fold's run written down before the growth leads to where the run is now
    assert main(["train", "--resume", str(grown / "fold-1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"foodvit train --resume {grown / 'seed-42' / 'fold-1'}" in err, err
    assert main(["train", "--resume", str(grown / "fold-7")]) == 2  # no such fold: the usual refusal
    assert "does not exist; --resume takes a run directory" in capsys.readouterr().err

    assert main(["cv", "--compare", str(one), str(grown)]) == 0
    line = capsys.readouterr().out
    assert "+0.000" in line and "over 12 photos of seeds 42, which both studies hold" in line, line
    other = tmp_path / "other-seed"
    shutil.copytree(one, other)
    stored = json.loads((other / "study.json").read_text())
    (other / "study.json").write_text(json.dumps({**stored, "seeds": [7]}))
    assert main(["cv", "--compare", str(grown), str(other)]) == 2  # no seed in common: nothing pairs
    assert "seeds [42, 43] and" in capsys.readouterr().err


def test_a_growth_cut_short_is_finished_by_the_next_process_and_never_trains_a_fold_again(
    cv_study, photos, tmp_path, monkeypatch, capsys
):
    """Killed after the grown study.json is written and before the first seed's runs have moved: the one-seed command
    is refused (the study holds two seeds) after finishing the moves, and the grown command trains only the new seed."""
    import foodvit.training.run as trainer
    from foodvit.tuning import study as study_module

    out = tmp_path / "cut"
    shutil.copytree(cv_study["study"], out)
    args = ["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", *TINY]

    def killed(*a, **k):
        raise KeyboardInterrupt  # kill -9 here

    with monkeypatch.context() as patched:
        patched.setattr(study_module, "_move_first_seed", killed)
        assert main([*args, "--seeds", "2"]) == 130
    assert json.loads((out / "study.json").read_text())["seeds"] == [42, 43] and (out / "fold-0.json").is_file()
    real_train, started = trainer.train, []
    monkeypatch.setattr(
        trainer, "train", lambda config, run, **kw: started.append(str(run)) or real_train(config, run, **kw)
    )
    capsys.readouterr()
    assert main(args) == 2  # the one-seed command: the moves finished, then refused, nothing trained
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seed 42 --seeds 2 resumes it" in err and started == []
    assert (out / "seed-42" / "fold-0.json").is_file() and not (out / "fold-0.json").exists()
    assert not (out / ".growing.json").exists()
    assert main([*args, "--seeds", "2"]) == 0
    assert sorted(Path(s).relative_to(out).as_posix() for s in started) == ["seed-43/fold-0", "seed-43/fold-1"]


def test_a_one_seed_process_stops_before_a_fold_once_another_has_grown_the_study(photos, tmp_path, monkeypatch, capsys):
    """Between a one-seed process's folds another process grows the study (its runs move to seed-42/): the first stops
    in one line before it trains fold 1 under the old name, where the grown study would never look."""
    from foodvit.tuning.study import grow_study, training_arithmetic

    out = tmp_path / "study"
    real, done = cv.run_fold, []

    def run_fold(*a, **k):
        found = real(*a, **k)
        done.append(found)
        if len(done) == 1:  # another process grows the study now
            identity = json.loads((out / "study.json").read_text())
            grow_study(out, {**identity, "seeds": [42, 43]}, training_arithmetic(build_config("tiny", {})))
        return found

    monkeypatch.setattr(cv, "run_fold", run_fold)
    assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has grown to seeds 42, 43 while this process ran on seed 42" in err
    assert "--seeds 2 to go on" in err and not (out / "fold-1").exists() and len(done) == 1
    assert (out / "seed-42" / "fold-0.json").is_file() and not (out / "cv.json").exists()


def test_a_growth_on_a_machine_of_another_arithmetic_is_refused_with_the_study_untouched(
    photos, tmp_path, monkeypatch, capsys
):
    from foodvit.training import engine

    out = tmp_path / "other"
    args = ["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", "--device", "cpu", *TINY]
    assert main(args) == 0  # on the CPU, on a CUDA machine too: the test changes the CPU's arithmetic
    capsys.readouterr()
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "folds" not in p.parts)
    ours = engine.cpu_computes_bf16()
    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: not ours)  # a machine of the other kind
    assert main([*args, "--seeds", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "would train its new seeds in" in err and "one arithmetic" in err
    assert json.loads((out / "study.json").read_text())["seeds"] == [42] and (out / "cv.json").is_file()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "folds" not in p.parts) == before


def test_a_second_grower_finishes_a_growth_cut_short_before_it_trains(cv_study, photos, tmp_path, monkeypatch):
    """Two processes grow a study at once; the first is killed after moving fold 0 alone. The second, which looked
    before the first's note was there, finishes the move under the study's lock and trains only the new seed."""
    import foodvit.training.run as trainer
    from foodvit.tuning import study as study_module

    out = tmp_path / "s"
    shutil.copytree(cv_study["study"], out)
    identity = {**json.loads((out / "study.json").read_text()), "seeds": [42, 43]}
    here = json.loads((out / "fold-0.json").read_text())["arithmetic"]
    real_move = study_module._move_first_seed

    def killed_after_fold_0(folder, seed, folds):
        real_move(folder, seed, 1)  # fold 0 moved (and the note dropped by it: put back), then kill -9
        (folder / ".growing.json").write_text(json.dumps({"seed": seed, "folds": folds}))
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(study_module, "_move_first_seed", killed_after_fold_0)
        with pytest.raises(KeyboardInterrupt):
            study_module.grow_study(out, identity, here)
    assert (out / "seed-42" / "fold-0.json").is_file() and (out / "fold-1.json").is_file()
    # the second read study.json before the first wrote its note, and waited on the study's lock
    assert study_module.grow_study(out, identity, here) == [42, 43]
    assert (out / "seed-42" / "fold-1.json").is_file() and not (out / ".growing.json").exists()
    real_train, started = trainer.train, []
    monkeypatch.setattr(
        trainer, "train", lambda config, run, **kw: started.append(str(run)) or real_train(config, run, **kw)
    )
    assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", "--seeds", "2", *TINY]) == 0
    assert sorted(Path(s).relative_to(out).as_posix() for s in started) == ["seed-43/fold-0", "seed-43/fold-1"]
    assert not (out / ".growing.json").exists() and not (out / "fold-1.json").exists()


def test_a_study_kept_without_its_runs_is_not_grown(cv_study, photos, tmp_path, capsys):
    """A study kept for its answers (study.json, cv.json, cv.md, as results/cv keeps one): growing it would train its
    seeds again, so it is refused with the summary kept."""
    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("study.json", "cv.json", "cv.md"):
        shutil.copy(cv_study["study"] / name, kept / name)
    args = ["cv", "--data", str(photos), "--folds", "2", "--out", str(kept), "--quiet", "--seeds", "2", *TINY]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "but not their runs' results (fold-0, fold-1.json)" in err
    assert sorted(p.name for p in kept.iterdir()) == [".study.lock", "cv.json", "cv.md", "study.json"]


def test_a_fold_run_alone_in_a_study_grown_meanwhile_names_no_finished_fold_as_left(
    cv_study, photos, tmp_path, monkeypatch, capsys
):
    from foodvit.tuning.study import grow_study, training_arithmetic

    out = tmp_path / "f"
    shutil.copytree(cv_study["study"], out)
    for name in ("fold-1.json", "cv.json", "cv.md", "predictions.jsonl"):
        (out / name).unlink()
    shutil.rmtree(out / "fold-1")
    real = cv.run_fold

    def run_fold(*a, **k):  # another process grows the study as fold 1's result is written
        found = real(*a, **k)
        identity = json.loads((out / "study.json").read_text())
        grow_study(out, {**identity, "seeds": [42, 43]}, training_arithmetic(build_config("tiny", {})))
        return found

    monkeypatch.setattr(cv, "run_fold", run_fold)
    capsys.readouterr()
    assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", "--fold", "1", *TINY]) == 0
    said = capsys.readouterr().out
    assert "still to run" not in said and "the study grew meanwhile" in said, said
    assert (out / "seed-42" / "fold-1.json").is_file()


def test_a_fold_checks_its_study_under_its_lock_before_it_trains(cv_study, tmp_path):
    """run_fold and start_fold (a --jobs teacher task) call `check` with the fold's lock held, before training; the
    check a one-seed study's tasks get survives the trip to a worker process."""
    import functools
    import pickle

    from foodvit.tuning.fold import run_fold, start_fold

    def check():
        raise StudyError("grown")

    folder = cv_study["study"] / "folds" / "seed-42" / "fold-0"
    for starts in (start_fold, functools.partial(run_fold, fold=0)):
        with pytest.raises(StudyError, match="grown"):
            starts(build_config("tiny", {}), tmp_path / "fold-0", folder, seed=42, check=check)
        assert not (tmp_path / "fold-0").exists()
    sent = pickle.loads(pickle.dumps(cv.same_seeds_check(tmp_path, [42], None)))
    assert sent.func is cv._same_seeds and sent.args == (tmp_path, [42])
    assert cv.same_seeds_check(tmp_path, [42, 43], None) is None and cv.same_seeds_check(tmp_path, [42], ("p",)) is None


def test_a_studys_summary_is_written_under_its_lock(cv_study, photos, tmp_path, monkeypatch):
    """The check of the study's seeds and the write of its summary hold the study's lock, the lock a growth holds."""
    from filelock import FileLock, Timeout

    out = tmp_path / "l"
    shutil.copytree(cv_study["study"], out)
    (out / "cv.json").unlink()
    real, held = cv.write_study, []

    def write_study(study, *a):
        try:
            FileLock(study / ".study.lock", timeout=0).acquire()
        except Timeout:
            held.append(True)
        return real(study, *a)

    monkeypatch.setattr(cv, "write_study", write_study)
    assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(out), "--quiet", *TINY]) == 0
    assert held == [True] and (out / "cv.json").is_file()


def test_a_lender_lends_the_teachers_of_the_seeds_it_holds(tmp_path):
    """A study lends a unit the teacher of its run of the unit's seed and fold, wherever it keeps that run (a
    one-seed CV study: fold-K), and none for a seed it does not hold."""
    from foodvit.tuning.folds import Unit
    from foodvit.tuning.study import lender_run

    one, pool = tmp_path / "one", tmp_path / "pool"
    for study, seeds, run, kind in ((one, [3], "fold-1", "cv"), (pool, [3, 4], "seed-4", "pool")):
        (study / run).mkdir(parents=True)
        (study / run / "teacher.pt").write_bytes(b"")
        (study / "study.json").write_text(json.dumps({"kind": kind, "seeds": seeds, "folds": 2}))
    assert lender_run(one, Unit(3, 1, tmp_path, "seed-3/fold-1")) == one / "fold-1"
    assert lender_run(one, Unit(3, 0, tmp_path, "seed-3/fold-0")) is None  # no teacher trained there yet
    assert lender_run(one, Unit(5, 1, tmp_path, "seed-5/fold-1")) is None  # a seed it does not hold
    assert lender_run(pool, Unit(4, 0, tmp_path, "seed-4")) == pool / "seed-4"
    assert lender_run(None, Unit(4, 0, tmp_path, "seed-4")) is None


def test_cv_refuses_fewer_photos_per_class_than_folds_and_another_study(cv_study, photos, capsys):
    assert main(["cv", "--data", str(photos), "--folds", "5", "--out", str(cv_study["study"].parent / "c"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has 4 training photo(s), fewer than the 5 folds" in err
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--out", str(cv_study["study"]), *TINY, "--lr", "0.01"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "holds a study of something else" in err and "optim.lr" in err


def test_a_study_resumes_whatever_its_recipe_says_of_evaluating(cv_study, photos, capsys):
    """A fold evaluates once, at its end, whatever --eval-every says: a study started under a recipe that evaluated
    every epoch is the same study under one that evaluates every 5th (it was refused as another study)."""
    stored = json.loads((cv_study["study"] / "study.json").read_text())
    assert "eval_every" not in stored["settings"]["train"] and "source" not in stored["settings"]["data"]

    def again(study):
        return main(["cv", "--data", str(photos), "--folds", "2", "--out", str(study), *TINY, "--eval-every", "5"])

    assert again(cv_study["study"]) == 0
    assert "something else" not in capsys.readouterr().err
    written = cv_study["study"].parent / "with-eval-every"
    shutil.copytree(cv_study["study"], written)
    stored["settings"]["train"]["eval_every"] = 1  # as a study that kept the setting wrote it
    (written / "study.json").write_text(json.dumps(stored))
    assert again(written) == 0


GUIDED = [*TINY[:-1], "2", "--guidance", "1"]  # guidance needs a block before the last


@pytest.fixture(scope="module")
def guided_study(tmp_path_factory, photos):
    """(study, teachers trained): a 2-fold guided study, each fold's CNN teacher trained by it; read, never changed,
    by the tests that borrow or score its teachers (one that changes a teacher changes a copy)."""
    import foodvit.training.stages as stages

    trained = []
    real = stages.build_optimizer  # each stage a run trains before its epochs (here: its teacher) builds one
    study = tmp_path_factory.mktemp("guided") / "a"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stages, "build_optimizer", lambda *a, **k: trained.append(1) or real(*a, **k))
        assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(study), "--quiet", *GUIDED]) == 0
    return study, len(trained)


@pytest.mark.slow  # a guided study and a second one; the fast tier keeps a fold's teacher task (test_jobs)
def test_a_study_borrows_a_studys_teachers_and_ends_as_if_it_trained_them(
    photos, cv_study, guided_study, tmp_path, monkeypatch, capsys
):
    """`foodvit cv --teachers A`: the folds load A's fold teachers instead of training them, and end
    exactly as A's (which trained them with these settings); a ViT-only change may borrow them too,
    a change the teacher depends on may not, nor a recipe without a teacher, nor a folder of no study."""
    import torch

    import foodvit.training.stages as stages
    from foodvit.rundir.directory import load_checkpoint

    a, teachers = guided_study
    assert teachers == 2  # a teacher a fold
    trained = [1] * teachers
    real = stages.build_optimizer  # each stage a run trains before its epochs (here: its teacher) builds one
    monkeypatch.setattr(stages, "build_optimizer", lambda *a, **k: trained.append(1) or real(*a, **k))
    b, c = tmp_path / "b", tmp_path / "c"
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--out", str(b), "--quiet", *GUIDED, "--teachers", str(a)])
        == 0
    )
    assert len(trained) == 2  # none trained again
    first, second = (json.loads((s / "cv.json").read_text()) for s in (a, b))
    assert second["photos"] == first["photos"] and second["accuracy"] == first["accuracy"]
    for k in range(2):
        assert (
            f"in {markup.text(a / f'fold-{k}')}, which lent it to this run"
            in (b / f"fold-{k}" / "report.md").read_text()
        )
        mine, theirs = (load_checkpoint(s / f"fold-{k}" / "teacher.pt") for s in (b, a))
        assert (
            mine["history"] == theirs["history"]
            and mine["model"].keys() == theirs["model"].keys()
            and "lent_by" not in theirs
        )
        assert all(torch.equal(mine["model"][key], theirs["model"][key]) for key in mine["model"])
        mine, theirs = (json.loads((s / f"fold-{k}.json").read_text())["predictions"] for s in (b, a))
        assert [p["probability"] for p in mine] == [p["probability"] for p in theirs]
    # the ViT's own architecture and losses are no teacher setting
    assert (
        main(
            [
                "cv",
                "--data",
                str(photos),
                "--folds",
                "2",
                "--out",
                str(c),
                "--quiet",
                *GUIDED,
                "--drop-path",
                "0.1",
                "--drloc",
                "0.5",
                "--ema",
                "0.9",
                "--teachers",
                str(a),
            ]
        )
        == 0
    )
    assert len(trained) == 2
    capsys.readouterr()
    refused = {
        "--lr": (["--lr", "0.01"], "trained its CNN teachers with other settings (optim.lr: 0.001 there, 0.01 here)"),
        "no teacher": (["--guidance", "0"], "this recipe trains none"),
        "no study": (["--teachers", str(photos)], "holds no readable study"),
        "lends none": (["--teachers", str(cv_study["study"])], "a recipe that trains no CNN teacher"),
        "other folds": (["--folds", "3"], "folds: 2 there, 3 here"),
        "no seed in common": (["--seed", "7"], "seeds: [42] there, [7] here"),
        # the teacher's own epochs named as such, not as the run's epochs (1 in both)
        "--teacher-epochs": (["--teacher-epochs", "3"], "with other settings (teacher.epochs: 1 there, 3 here)"),
        "itself": (["--teachers", str(tmp_path / "itself")], "is the study itself"),
    }
    for name, (extra, message) in refused.items():
        args = [
            "cv",
            "--data",
            str(photos),
            "--folds",
            "2",
            "--out",
            str(tmp_path / name),
            *GUIDED,
            "--teachers",
            str(a),
            *extra,
        ]
        assert main(args) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (name, err)
        assert not (tmp_path / name).exists()  # refused before the study folder is made
    assert main(["cv", "--compare", str(a), str(b), "--teachers", str(a)]) == 2
    assert "--compare only reads two studies" in capsys.readouterr().err
    # teachers trained on another kind of machine, or with another number of CPU threads or memory layout (the sums
    # round otherwise: other teachers), or recorded before foodvit kept its threads, are not the ones this run would
    # train: refused before the study folder is made
    shutil.copytree(a, tmp_path / "lender")
    teacher = load_checkpoint(tmp_path / "lender" / "fold-0" / "teacher.pt")
    fold_1 = load_checkpoint(tmp_path / "lender" / "fold-1" / "teacher.pt")
    threads = torch.get_num_threads()
    place = teacher["trained_on"]
    elsewhere = {
        "gpu": (
            {**place, "device": "cuda", "bf16": not place["bf16"]},  # bf16 here: on a CPU that computes it natively
            f"bf16: {not place['bf16']} there, {place['bf16']} here; device: 'cuda' there, 'cpu' here",
        ),
        "threads": ({**place, "threads": threads + 1}, f"threads: {threads + 1} there, {threads} here"),
        "layout": ({**place, "layout": "rows"}, "layout: 'rows' there, 'channels-last' here"),
        "old": (
            {k: v for k, v in place.items() if k != "threads"},
            "its file records no threads",
        ),
    }
    for name, (recorded, message) in elsewhere.items():
        for k, saved in enumerate((teacher, fold_1)):
            torch.save({**saved, "trained_on": recorded}, tmp_path / "lender" / f"fold-{k}" / "teacher.pt")
        assert (
            main(
                [
                    "cv",
                    "--data",
                    str(photos),
                    "--folds",
                    "2",
                    "--out",
                    str(tmp_path / name),
                    "--quiet",
                    *GUIDED,
                    "--teachers",
                    str(tmp_path / "lender"),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "trained its CNN teachers elsewhere" in err and message in err, (
            name,
            err,
        )
        assert not (tmp_path / name).exists()
    # a study whose folds trained at different thread counts (one-thread workers beside a two-thread one) lends
    # each teacher to a process like its own: here fold 0's came from elsewhere and is already used, fold 1's
    # serves this process, so the study resumes and fold 1 ends as in the study that trained it
    torch.save(
        {**teacher, "trained_on": {**place, "threads": threads + 1}}, tmp_path / "lender" / "fold-0" / "teacher.pt"
    )
    torch.save(fold_1, tmp_path / "lender" / "fold-1" / "teacher.pt")
    shutil.copytree(b, tmp_path / "mixed")
    shutil.rmtree(tmp_path / "mixed" / "fold-1")
    (tmp_path / "mixed" / "fold-1.json").unlink()
    assert (
        main(
            [
                "cv",
                "--data",
                str(photos),
                "--folds",
                "2",
                "--out",
                str(tmp_path / "mixed"),
                "--quiet",
                *GUIDED,
                "--teachers",
                str(tmp_path / "lender"),
            ]
        )
        == 0
    ), capsys.readouterr().err
    assert json.loads((tmp_path / "mixed" / "cv.json").read_text())["photos"] == first["photos"]
    assert len(trained) == 2  # no teacher trained
    capsys.readouterr()
    # a fold's teacher trained elsewhere, in a study whose other teachers serve here, is refused when that fold starts
    torch.save(teacher, tmp_path / "lender" / "fold-0" / "teacher.pt")
    torch.save(
        {**fold_1, "trained_on": {**fold_1["trained_on"], "threads": threads + 1}},
        tmp_path / "lender" / "fold-1" / "teacher.pt",
    )
    assert (
        main(
            [
                "cv",
                "--data",
                str(photos),
                "--folds",
                "2",
                "--out",
                str(tmp_path / "late"),
                "--quiet",
                *GUIDED,
                "--teachers",
                str(tmp_path / "lender"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and f"was trained elsewhere (threads: {threads + 1} there, {threads} here)" in err
    ), err


@pytest.mark.slow  # a second guided study; the fast tier keeps lender_run's naming (the test above)
def test_a_one_seed_lender_lends_its_seed_and_the_other_seeds_train_their_own(
    photos, guided_study, tmp_path, monkeypatch
):
    """A study of two seeds borrowing from a one-seed study (its runs fold-K): seed 42's folds load that study's
    teachers, seed 43's train their own."""
    import foodvit.training.stages as stages

    a, _ = guided_study
    trained = []
    real = stages.build_optimizer  # each stage a run trains before its epochs (here: its teacher) builds one
    monkeypatch.setattr(stages, "build_optimizer", lambda *x, **k: trained.append(1) or real(*x, **k))
    b = tmp_path / "b"
    args = ["cv", "--data", str(photos), "--folds", "2", "--seeds", "2", "--out", str(b), "--quiet", *GUIDED]
    assert main([*args, "--teachers", str(a)]) == 0
    assert len(trained) == 2  # seed 43's two teachers, none of seed 42's
    for k in range(2):
        lent = f"in {markup.text(a / f'fold-{k}')}, which lent it to this run"
        assert lent in (b / "seed-42" / f"fold-{k}" / "report.md").read_text()
        assert "which lent it" not in (b / "seed-43" / f"fold-{k}" / "report.md").read_text()


def test_a_teachers_settings_leave_out_what_never_reaches_its_training():
    from dataclasses import replace

    from foodvit.training.teacher import teacher_settings

    own = load_recipe("default")  # its teacher trains on a schedule and side of its own
    config = replace(own, teacher=replace(own.teacher, epochs=0, size=0))  # the teacher on the run's schedule and side
    same = [
        replace(config, vit=replace(config.vit, depth=8, drop_path=0.1)),
        replace(
            config, data=replace(config.data, start_size=0, start_share=0.5, test_size=112, cache=False, workers=2)
        ),
        replace(
            with_settings(
                config, {"drloc.weight": 1.0, "guidance.weight": 2.0, "guidance.schedule": "linear", "optim.ema": 0.99}
            ),
            train=replace(config.train, compile=True),
        ),
        with_settings(
            config,
            {
                "pretrain.epochs": 50,
                "pretrain.mask_ratio": 0.75,
                "optim.sam": 0.05,
                "distill.weight": 1.0,
                "distill.temperature": 3.0,
            },
        ),
        with_settings(config, {"masked.weight": 2.0, "masked.ratio": 0.5, "masked.pixels": True}),
        with_settings(config, {"contrast.weight": 0.5, "contrast.temperature": 0.1}),
    ]
    other = [
        replace(config, vit=replace(config.vit, image_size=64)),
        replace(config, optim=replace(config.optim, lr=2e-3)),
        replace(config, teacher=replace(config.teacher, architecture="resnet34")),
        replace(config, data=replace(config.data, mixup=0.8, workers=2)),
        replace(config, train=replace(config.train, epochs=50)),
    ]
    assert all(teacher_settings(c) == teacher_settings(config) for c in same)
    assert all(teacher_settings(c) != teacher_settings(config) for c in other)
    # a teacher with epochs of its own does not read the run's (the model's side still sets the photos it is given)
    assert teacher_settings(replace(own, vit=replace(own.vit, image_size=64))) != teacher_settings(own)
    assert teacher_settings(replace(own, train=replace(own.train, epochs=50))) == teacher_settings(own)
    assert teacher_settings(replace(own, teacher=replace(own.teacher, size=96))) != teacher_settings(own)
    mixed = replace(config, data=replace(config.data, mixup=0.8))  # mixing in a worker or in the process: other draws
    assert teacher_settings(replace(mixed, data=replace(mixed.data, workers=1))) != teacher_settings(mixed)
    assert teacher_settings(replace(mixed, data=replace(mixed.data, workers=3))) == teacher_settings(
        replace(mixed, data=replace(mixed.data, workers=1))
    )


BENCH = {
    "accuracy": "bench.accuracy.recipe",
    "teachers": "bench.accuracy.teachers",
    "curve": "bench.accuracy.curve",
    "ensembles": "bench.analysis.ensembles",
    "shared_photos": "bench.analysis.shared_photos",
    "offsets": "bench.analysis.offsets",
}


def bench_module(monkeypatch, name: str):
    """A benchmark script as the module it is in the bench package (the repository root is on pytest's pythonpath)."""
    import importlib

    return importlib.import_module(BENCH[name])


def bench_teachers(monkeypatch):
    return bench_module(monkeypatch, "teachers")


def test_bench_accuracys_paired_results_use_the_studies_arithmetic(monkeypatch, capsys):
    """bench/accuracy/recipe.py --paired: each test size both results scored, B - A as `foodvit cv --compare` gives it;
    results of other photos stop with that one line."""
    accuracy = bench_module(monkeypatch, "accuracy")
    a = {"photos": {"0": {"x/1": True, "x/2": False, "x/3": True, "x/4": True}, "112": {"x/1": True}}}
    b = {"photos": {"0": {"x/1": True, "x/2": True, "x/3": True, "x/4": True}}}
    accuracy.print_paired(a, b, ["A", "B"])
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["own size: " + compare.compare_line(compare.paired(a["photos"]["0"], b["photos"]["0"]), "A", "B")]
    assert out[0].startswith("own size: B - A = +0.250 +- 0.250") and "1 right only in B, 0 only in A" in out[0]
    with pytest.raises(SystemExit, match="do not hold the same photos"):
        accuracy.print_paired(a, {"photos": {"0": {"x/1": True}}}, ["A", "B"])


def test_bench_accuracy_scores_each_fold_model_with_other_centre_crops(cv_study, monkeypatch, capsys):
    """bench/accuracy/recipe.py --crop-pcts: the fold's model with the photo's shorter side resized to size / share
    before the centre crop; at the run's own share (0.875) exactly its own predictions, as cv.json holds them."""
    import foodvit.deploy.inference as inference

    accuracy = bench_module(monkeypatch, "accuracy")
    study = cv_study["study"]
    fold = json.loads((study / "cv.json").read_text())["folds"][0]
    held = fold_folder(study / "folds", fold["seed"], fold["fold"])
    seen, real_predict = [], inference.predict
    monkeypatch.setattr(
        inference,
        "predict",
        lambda predictor, paths: seen.append(predictor.preprocess) or real_predict(predictor, paths),
    )
    got = accuracy.fold_predictions(study / fold["run"], held, [], [1.0, 0.875, 0.5])
    assert list(got) == ["0", "crop 1", "crop 0.875", "crop 0.5"]
    kept = json.loads((study / "cv.json").read_text())["photos"]
    assert got["0"] == {name: kept[f"s{fold['seed']}/{name}"] for name in got["0"]} and len(got["0"]) == fold["n"]
    assert got["crop 0.875"] == got["0"]
    size = seen[
        0
    ].image_size  # the shorter side before the crop: size / share, the rest of the preprocessing the run's own
    assert [(p.image_size, p.resize_size) for p in seen] == [
        (size, int(size / 0.875)),
        (size, size),
        (size, int(size / 0.875)),
        (size, 2 * size),
    ]
    assert seen[3] == seen[0].__class__(size, 2 * size, seen[0].mode, seen[0].mean, seen[0].std, seen[0].interpolation)
    # a share under 0.5 would change the training photos' decode size too: refused before anything trains
    with pytest.raises(SystemExit, match=r"centre-crop shares from 0.5 to 1 .*got 0.8,0.4"):
        accuracy.main(["--cv", "2", "--crop-pcts", "0.8,0.4", "--out", str(study.parent / "never")])
    assert not (study.parent / "never").exists()
    # --paired prints the run's own preprocessing, then test sizes, then crop shares, each in order
    result = {"photos": {key: got["0"] for key in ("crop 0.8", "112", "0", "crop 0.5", "96")}}
    accuracy.print_paired(result, result, ["A", "B"])
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "own size",
        "test size 96",
        "test size 112",
        "crop 0.5",
        "crop 0.8",
    ]


def fake_study(where: Path, probabilities: dict[str, dict[str, float]], seeds: tuple[int, ...] = (0,)) -> Path:
    """A finished one-fold study whose held-out photos ('label/name.jpg') have these probabilities, on each seed."""
    rows = [
        {
            "seed": seed,
            "fold": 0,
            "photo": photo,
            "label": photo.split("/")[0],
            "predicted": max(p, key=p.get),
            "right": max(p, key=p.get) == photo.split("/")[0],
            "probabilities": p,
        }
        for seed in seeds
        for photo, p in probabilities.items()
    ]
    where.mkdir()
    (where / "cv.json").write_text(
        json.dumps(
            {
                "folds": [{"seed": seed, "fold": 0, "run": "fold-0"} for seed in seeds],
                "photos": {f"s{r['seed']}/{r['photo']}": r["right"] for r in rows},
            }
        )
    )
    (where / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return where


def test_bench_ensembles_averages_the_studies_probabilities_photo_by_photo(tmp_path, monkeypatch, capsys):
    ensembles = bench_module(monkeypatch, "ensembles")
    # a is right on photo 1 alone, b on photo 2 alone, c on none; photo 3 is wrong everywhere and stays so;
    # photo 4 is wrong in each study (each picks another wrong class) and right in the average of all three
    a = fake_study(
        tmp_path / "a",
        {
            "a/1.jpg": {"a": 0.95, "b": 0.05, "c": 0.0},
            "b/2.jpg": {"a": 0.55, "b": 0.45, "c": 0.0},
            "a/3.jpg": {"a": 0.2, "b": 0.8, "c": 0.0},
            "a/4.jpg": {"a": 0.4, "b": 0.45, "c": 0.15},
        },
        seeds=(0, 1),
    )
    b = fake_study(
        tmp_path / "b",
        {
            "a/1.jpg": {"a": 0.4, "b": 0.6, "c": 0.0},
            "b/2.jpg": {"a": 0.2, "b": 0.8, "c": 0.0},
            "a/3.jpg": {"a": 0.3, "b": 0.7, "c": 0.0},
            "a/4.jpg": {"a": 0.4, "b": 0.15, "c": 0.45},
        },
        seeds=(0, 1),
    )
    c = fake_study(
        tmp_path / "c",
        {
            "a/1.jpg": {"a": 0.2, "b": 0.8, "c": 0.0},
            "b/2.jpg": {"a": 0.9, "b": 0.1, "c": 0.0},
            "a/3.jpg": {"a": 0.1, "b": 0.9, "c": 0.0},
            "a/4.jpg": {"a": 0.4, "b": 0.5, "c": 0.1},
        },
        seeds=(0, 1),
    )
    assert (
        ensembles.main(
            [str(a), str(b), str(c), "--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "figs" / "e.png")]
        )
        == 0
    )
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["alone"] == [pytest.approx(2 / 8), pytest.approx(2 / 8), 0]
    ab, ac = report["with_first"]
    assert (ab["accuracy"], ab["difference"], ab["difference_to_it"]) == (
        pytest.approx(6 / 8),
        pytest.approx(4 / 8),
        pytest.approx(4 / 8),
    )
    assert (ac["accuracy"], ac["difference"], ac["difference_to_it"]) == (pytest.approx(2 / 8), 0, pytest.approx(2 / 8))
    assert report["all"]["accuracy"] == pytest.approx(4 / 8) and report["all"]["difference"] == pytest.approx(2 / 8)
    assert report["wrong_in_all"] == ["s0/a/3.jpg", "s0/a/4.jpg", "s1/a/3.jpg", "s1/a/4.jpg"]
    assert report["wrong_in_all_mended"] == ["s0/a/4.jpg", "s1/a/4.jpg"]
    out = capsys.readouterr().out
    assert (
        "4 of 8 held-out predictions wrong in every study: s0/a/3.jpg, s0/a/4.jpg" in out
        and "gets 2 of them right" in out
    )
    assert (tmp_path / "figs" / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_ensembles_refuses_studies_that_cannot_be_averaged_in_one_line(tmp_path, monkeypatch, capsys):
    ensembles = bench_module(monkeypatch, "ensembles")
    a = fake_study(tmp_path / "a", {"a/1.jpg": {"a": 0.9, "b": 0.1}, "b/2.jpg": {"a": 0.4, "b": 0.6}})
    with pytest.raises(SystemExit):
        ensembles.main([str(a)])
    assert "give at least two studies to average" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"holds no finished cross-validation \(no cv.json\)"):
        ensembles.main([str(a), str(tmp_path)])
    other = fake_study(tmp_path / "other", {"a/1.jpg": {"a": 0.9, "b": 0.1}, "b/3.jpg": {"a": 0.4, "b": 0.6}})
    with pytest.raises(
        SystemExit,
        match=r"does not hold .*a's held-out photos \(2 differ\): average studies of the same data, folds and seeds",
    ):
        ensembles.main([str(a), str(other)])
    three = fake_study(
        tmp_path / "three", {"a/1.jpg": {"a": 0.9, "b": 0.1, "c": 0}, "b/2.jpg": {"a": 0.4, "b": 0.6, "c": 0}}
    )
    with pytest.raises(SystemExit, match=r"does not predict .*a's classes \(a, b\)"):
        ensembles.main([str(a), str(three)])
    old = fake_study(tmp_path / "old", {"a/1.jpg": {"a": 0.9, "b": 0.1}, "b/2.jpg": {"a": 0.4, "b": 0.6}})
    (old / "predictions.jsonl").write_text(
        "".join(
            line.split(', "probabilities"')[0] + "}\n" for line in (old / "predictions.jsonl").read_text().splitlines()
        )
    )
    with pytest.raises(SystemExit, match=r"keep no class probabilities and .*fold-0 holds no model to score again"):
        ensembles.main([str(a), str(old)])


def test_bench_ensembles_scores_a_study_without_probabilities_from_its_fold_models(cv_study, tmp_path, monkeypatch):
    ensembles = bench_module(monkeypatch, "ensembles")
    kept = ensembles.probabilities(cv_study["study"])
    old = tmp_path / "old"  # as a study written before predictions kept every class's probability
    shutil.copytree(cv_study["study"], old, symlinks=True)
    rows = [json.loads(line) for line in (old / "predictions.jsonl").read_text().splitlines()]
    (old / "predictions.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "probabilities"}) + "\n" for r in rows)
    )
    rescored = ensembles.probabilities(old)
    assert set(rescored) == set(kept) and len(kept) == 12
    for key, (p, label) in kept.items():
        assert rescored[key][1] == label and rescored[key][0] == pytest.approx(p, abs=1e-6)


def test_bench_ensembles_members_averages_a_studys_seeds_k_at_a_time(tmp_path, monkeypatch, capsys):
    """--members K: seeds 0..K-1, K..2K-1, ... averaged, each group's answer standing for its seeds' predictions,
    paired with the seeds alone; a study kept without predictions.jsonl is read from its runs' results."""
    ensembles = bench_module(monkeypatch, "ensembles")
    study = fake_study(
        tmp_path / "s", {"a/1.jpg": {"a": 0.6, "b": 0.4}, "b/2.jpg": {"a": 0.45, "b": 0.55}}, (0, 1, 2, 3)
    )
    rows = [json.loads(line) for line in (study / "predictions.jsonl").read_text().splitlines()]
    # seed 1 is sure and wrong on photo 1, seed 3 unsure and wrong on it: seeds 0 and 1 averaged are wrong there,
    # seeds 2 and 3 right; photo 2 is right everywhere
    for r in rows:
        if r["photo"] == "a/1.jpg" and r["seed"] in (1, 3):
            r["probabilities"] = {"a": 0.1, "b": 0.9} if r["seed"] == 1 else {"a": 0.45, "b": 0.55}
            r["predicted"], r["right"] = "b", False
    cv = json.loads((study / "cv.json").read_text())
    cv["photos"] = {f"s{r['seed']}/{r['photo']}": r["right"] for r in rows}
    (study / "cv.json").write_text(json.dumps(cv))
    (study / "predictions.jsonl").unlink()  # as results/cv/ keeps a pool study: its runs' results, no predictions.jsonl
    (study / "study.json").write_text("{}")
    for seed in (0, 1, 2, 3):
        predictions = [{k: v for k, v in r.items() if k not in ("seed", "fold")} for r in rows if r["seed"] == seed]
        (study / f"seed-{seed}.json").write_text(json.dumps({"seed": seed, "fold": 0, "predictions": predictions}))
    assert ensembles.main([str(study), "--members", "2", "--json", str(tmp_path / "m.json")]) == 0
    report = json.loads((tmp_path / "m.json").read_text())
    assert report["alone"] == pytest.approx(6 / 8) and report["averaged"] == pytest.approx(6 / 8)
    assert [g["seeds"] for g in report["groups"]] == [[0, 1], [2, 3]]
    assert [g["accuracy"] for g in report["groups"]] == [pytest.approx(1 / 2), 1]
    assert report["difference"] == 0  # photo 1: right in 2 of 4 seeds alone, and in 1 of 2 averages (each for 2)
    assert "2 averaged - one model = +0.000" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--members 3 needs a study whose seeds it divides, and .* has 4"):
        ensembles.main([str(study), "--members", "3"])
    with pytest.raises(SystemExit):
        ensembles.main([str(study), str(study), "--members", "2"])
    assert "--members K averages the seeds of one study" in capsys.readouterr().err
    for seed in (0, 1, 2, 3):
        (study / f"seed-{seed}.json").unlink()
    with pytest.raises(SystemExit, match=r"keeps no predictions \(no predictions.jsonl, no run results\)"):
        ensembles.main([str(study), "--members", "2"])


def test_bench_shared_photos_pairs_two_pool_studies_on_the_photos_both_judged(tmp_path, monkeypatch, capsys):
    """A study trained on more photos judges fewer pool photos (its own are dropped): the two are paired on the
    photos both judged and the seeds both trained, photo by photo; then against every seed of the first."""
    shared_photos = bench_module(monkeypatch, "shared_photos")

    def pool_study(where, answers):  # {seed: {photo: right}}
        where.mkdir()
        (where / "study.json").write_text("{}")
        for seed, rights in answers.items():
            predictions = [{"photo": photo, "right": right} for photo, right in rights.items()]
            (where / f"seed-{seed}.json").write_text(json.dumps({"seed": seed, "fold": 0, "predictions": predictions}))
        return where

    small = pool_study(
        tmp_path / "small",
        {
            0: {"a/1.jpg": False, "a/2.jpg": True, "b/3.jpg": False, "b/dropped.jpg": True},
            1: {"a/1.jpg": False, "a/2.jpg": True, "b/3.jpg": True, "b/dropped.jpg": True},
            2: {"a/1.jpg": True, "a/2.jpg": True, "b/3.jpg": True, "b/dropped.jpg": False},
        },
    )
    large = pool_study(
        tmp_path / "large",
        {
            0: {"a/1.jpg": True, "a/2.jpg": True, "b/3.jpg": True},
            1: {"a/1.jpg": True, "a/2.jpg": True, "b/3.jpg": True},
        },
    )
    found = shared_photos.report(small, large)
    assert (found["photos"], found["seeds"]) == (3, [0, 1])
    assert found["a"] == pytest.approx(3 / 6) and found["b"] == 1
    assert found["difference"] == pytest.approx(3 / 6) and (found["only_a"], found["only_b"]) == (0, 3)
    assert found["classes_a"] == {"a": pytest.approx(2 / 4), "b": pytest.approx(1 / 2)}
    # every seed of the first: photo 1 right in 1 of 3, photo 2 in 3, photo 3 in 2 (photo "dropped" not judged)
    assert found["every_seed_of_a"]["difference"] == pytest.approx(((1 - 1 / 3) + 0 + (1 - 2 / 3)) / 3)
    assert "3 pool photos both judged; seeds 0, 1" in capsys.readouterr().out
    other = pool_study(tmp_path / "other", {5: {"a/1.jpg": True}})
    with pytest.raises(SystemExit, match="share no training seed"):
        shared_photos.report(small, other)


def test_bench_offsets_chooses_each_folds_offsets_on_the_other_folds_alone(tmp_path, monkeypatch, capsys):
    """bench/analysis/offsets.py: each fold's offsets are those that classify the most of the other folds of its own
    seed right (of equal counts the smallest); the fold's own photos, and other seeds', are not asked."""
    offsets = bench_module(monkeypatch, "offsets")

    def seed_rows(seed: int, b_photos: list[tuple[int, float]], a_b: list[float]) -> list[dict]:
        """b's photos: (how many, b's score) a fold, a scored 1 - b; a's photos: 3 a fold, scored b a_b[fold]."""
        rows = [
            {
                "seed": seed,
                "fold": fold,
                "photo": f"b/{fold}-{i}.jpg",
                "label": "b",
                "right": p_b > 0.5,
                "probabilities": {"a": 1 - p_b, "b": p_b},
            }
            for fold, (n, p_b) in enumerate(b_photos)
            for i in range(n)
        ]
        return rows + [
            {
                "seed": seed,
                "fold": fold,
                "photo": f"a/{fold}-{i}.jpg",
                "label": "a",
                "right": True,
                "probabilities": {"a": 1 - p_b, "b": p_b},
            }
            for fold, p_b in enumerate(a_b)
            for i in range(3)
        ]

    # seed 0: folds 0 and 1 want b + 0.5 (log 1.5 = 0.41 mends their 0.4s), fold 2's twenty 0.2s want b + 1.4
    # (log 4 = 1.39), which breaks fold 2's own a photos (0.3: log 7/3 = 0.85). Chosen without fold 2, fold 2 gets
    # + 0.5 (had it been asked: + 1.4); folds 0 and 1 are chosen with fold 2's twenty, so + 1.4.
    # seed 1: every photo right as it is, and a's photos at 0.45 break at any offset above 0.2: + 0 throughout
    # (had seed 0's photos been asked: + 0.5 or + 1.4, and seed 1's a photos wrong)
    rows = seed_rows(0, [(3, 0.4), (3, 0.4), (20, 0.2)], [0.1, 0.1, 0.3]) + seed_rows(1, [(3, 0.6)] * 3, [0.45] * 3)
    study = tmp_path / "study"
    study.mkdir()
    (study / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = {f"s{r['seed']}/{r['photo']}": r["right"] for r in rows}
    (study / "cv.json").write_text(json.dumps({"accuracy": sum(kept.values()) / len(kept), "photos": kept}))
    assert offsets.main([str(study), "--json", str(tmp_path / "o.json")]) == 0
    report = json.loads((tmp_path / "o.json").read_text())
    assert [(c["seed"], c["fold"], c["offsets"]["b"]) for c in report["offsets"]] == [
        (0, 0, 1.4),
        (0, 1, 1.4),
        (0, 2, 0.5),
        (1, 0, 0.0),
        (1, 1, 0.0),
        (1, 2, 0.0),
    ]
    # right: seed 0's b photos of folds 0 and 1 (6 more), its a photos (at 0.1, + 1.4 leaves them right), all of seed 1
    assert report["accuracy"] == pytest.approx((6 + 9 + 18) / 53) and report["difference"] == pytest.approx(6 / 53)
    assert "6 right only in with offsets, 0 only in" in capsys.readouterr().out
    (study / "predictions.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "probabilities"}) + "\n" for r in rows)
    )
    with pytest.raises(SystemExit, match="keep no class probabilities"):
        offsets.main([str(study)])
    (study / "predictions.jsonl").write_text(json.dumps({**rows[0], "probabilities": {c: 0.2 for c in "abcde"}}) + "\n")
    with pytest.raises(SystemExit, match="has 5 classes: the offsets are searched on a full grid"):
        offsets.main([str(study)])
    with pytest.raises(SystemExit, match=r"holds no finished cross-validation \(no cv.json\)"):
        offsets.main([str(tmp_path)])


def test_bench_teachers_refuses_a_study_without_teachers_in_one_line(cv_study, tmp_path, monkeypatch):
    teachers = bench_teachers(monkeypatch)
    with pytest.raises(SystemExit, match=r"fold-0 holds no trained teacher: give a guided or distilled cv study"):
        teachers.main([str(cv_study["study"]), str(tmp_path / "none")])
    with pytest.raises(SystemExit, match=r"holds no finished cv study \(cv.json\)"):
        teachers.main([str(tmp_path), str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()


@pytest.mark.slow  # the teachers scored twice; the fast tier keeps the script's refusals (the test above)
def test_bench_teachers_scores_a_guided_studys_teachers_without_training_them(guided_study, tmp_path, monkeypatch):
    """bench/accuracy/teachers.py: a guided study's fold teachers, loaded (none trained), scored on their own
    fold's held-out photos, written as a study `foodvit cv --compare` pairs."""
    import torch

    import foodvit.training.stages as stages
    from foodvit.rundir.directory import load_checkpoint, save_checkpoint

    teachers = bench_teachers(monkeypatch)
    guided = tmp_path / "guided"
    shutil.copytree(guided_study[0], guided)  # a copy: a teacher is rigged below
    trained = []
    real = stages.build_optimizer  # each stage a run trains before its epochs (here: its teacher) builds one
    monkeypatch.setattr(stages, "build_optimizer", lambda *a, **k: trained.append(1) or real(*a, **k))
    assert teachers.main([str(guided), str(tmp_path / "cnn")]) == 0
    assert trained == []
    scored, vit = json.loads((tmp_path / "cnn" / "cv.json").read_text()), json.loads((guided / "cv.json").read_text())
    assert sorted(scored["photos"]) == sorted(vit["photos"])  # every training photo, each once, as the ViT's study
    predictions = [json.loads(line) for line in (tmp_path / "cnn" / "predictions.jsonl").read_text().splitlines()]
    for k in range(2):
        held_out = (guided / "folds" / "seed-42" / f"fold-{k}" / "test").rglob("*.*")  # the tiny recipe's seed
        assert sorted(p["photo"] for p in predictions if p["fold"] == k) == sorted(
            f"{p.parent.name}/{p.name}" for p in held_out
        )
        assert scored["folds"][k]["correct"] == sum(p["right"] for p in predictions if p["fold"] == k)
    assert compare.compare_studies(tmp_path / "cnn", guided)[0]["n"] == len(vit["photos"])
    # the saved weights are what is scored: a teacher whose head always answers steak answers steak
    state = load_checkpoint(guided / "fold-1" / "teacher.pt")
    state["model"]["fc.weight"].zero_()
    state["model"]["fc.bias"].copy_(torch.tensor([0.0, 5.0, 0.0]))
    save_checkpoint(guided / "fold-1" / "teacher.pt", state)
    assert teachers.main([str(guided), str(tmp_path / "steak")]) == 0 and trained == []
    rigged = [json.loads(line) for line in (tmp_path / "steak" / "predictions.jsonl").read_text().splitlines()]
    assert {p["predicted"] for p in rigged if p["fold"] == 1} == {"steak"}
    e5 = float(torch.tensor(5.0).exp())
    assert all(p["probabilities"]["steak"] == pytest.approx(e5 / (e5 + 2), abs=1e-6) for p in rigged if p["fold"] == 1)
    assert [p for p in rigged if p["fold"] == 0] == [p for p in predictions if p["fold"] == 0]


@pytest.mark.slow  # a second study; cv's folds stay in the fast tier through test_cv_writes_per_fold_...
def test_a_fold_another_process_trains_is_left_to_it_and_taken_once_that_process_is_gone(
    cv_study, photos, tmp_path, monkeypatch
):
    """Two processes on one study: a fold whose run another process holds is skipped, the free fold
    trained, then the held one waited for and trained once its holder is gone; same result as one process."""
    import foodvit.training.run as trainer

    study = tmp_path / "shared"
    (study / "fold-0").mkdir(parents=True)
    # holds fold 0's run lock (as a `foodvit train` of it would) until its stdin closes, and 2 s more
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from foodvit.rundir.directory import RunLock; "
            "lock = RunLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read(); time.sleep(2)",
            str(study / "fold-0"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        real_train, events = trainer.train, []

        def train(config, out, **kwargs):
            events.append(Path(out).name)
            return real_train(config, out, **kwargs)

        def after_fold(step, results):
            events.append(f"done {results[-1]['fold']}")
            holder.stdin.close()  # the other process ends once this one has finished the free fold

        monkeypatch.setattr(trainer, "train", train)
        monkeypatch.setattr(cv, "_wait", lambda seconds: (events.append("wait"), time.sleep(seconds)))
        config = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
        result, folds = cv.run_cv(
            config,
            study,
            study / "folds",
            training_photos(config),
            folds=2,
            seeds=[42],
            after_fold=after_fold,
            wait_s=0.1,
        )
        assert holder.wait(timeout=60) == 0
    finally:
        holder.kill()
    assert events[:3] == ["fold-1", "done 1", "wait"] and events[-2:] == ["fold-0", "done 0"]
    assert set(events[2:-2]) == {"wait"}  # waited, without touching fold 0, while its holder lived
    assert [f["fold"] for f in folds] == [0, 1]
    alone = json.loads((cv_study["study"] / "cv.json").read_text())
    assert {f"s42/{p['photo']}": p["right"] for f in folds for p in f["predictions"]} == alone["photos"]
    assert result.accuracy == pytest.approx(alone["accuracy"])


def test_a_fold_is_run_by_one_process_from_its_look_to_its_result(cv_study, photos, tmp_path):
    """The fold's own lock: while another process runs fold 0 (even between its training and its
    result), this one leaves it; once free, a finished result is read, not computed again."""
    from foodvit.tuning.fold import FoldBusy, run_fold

    config = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    split = training_photos(config)
    folders = fold_folders(split, 2, 42, tmp_path / "folds")
    shutil.copytree(cv_study["study"] / "fold-0", tmp_path / "fold-0")  # a finished run, its result not yet written
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from filelock import FileLock; "
            "lock = FileLock(sys.argv[1], timeout=0); lock.acquire(); print('held', flush=True); sys.stdin.read()",
            str(tmp_path / ".fold-0.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FoldBusy, match="is being run by another process"):
            run_fold(config, tmp_path / "fold-0", folders[0], seed=42, fold=0)
        assert not (tmp_path / "fold-0.json").exists()
    finally:
        holder.communicate("", timeout=60)
    result = run_fold(config, tmp_path / "fold-0", folders[0], seed=42, fold=0)
    assert result["accuracy"] == json.loads((cv_study["study"] / "fold-0.json").read_text())["accuracy"]


def test_two_processes_starting_one_folder_with_different_studies_never_both_go_on(tmp_path, monkeypatch):
    import threading

    folder, start, outcomes = tmp_path / "study", threading.Barrier(8), []
    # every starter has looked for the study before any writes one: the race, every time
    checked, real_dumps, waited = threading.Barrier(8), json.dumps, set()

    def dumps(*args, **kwargs):  # open_study's first dumps is the study it is about to write
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            checked.wait(timeout=30)
        return real_dumps(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", dumps)  # the json module open_study writes with

    def begin(identity):
        start.wait()
        try:
            open_study(folder, identity)
            outcomes.append(("open", identity["lr"]))
        except StudyError:
            outcomes.append(("refused", identity["lr"]))

    threads = [threading.Thread(target=begin, args=({"kind": "cv", "lr": i % 2},)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = json.loads((folder / "study.json").read_text())["lr"]
    assert sorted(outcomes) == sorted([("open", stored)] * 4 + [("refused", 1 - stored)] * 4)
    assert [p.name for p in folder.iterdir()] == ["study.json"]  # no temporary file left


class PruneTrialOne(optuna.pruners.BasePruner):
    """Prunes trial 1 at its first report: a pruner whose mark that trial cannot reach."""

    def prune(self, study, trial) -> bool:
        return trial.number == 1


@pytest.mark.slow  # seven tiny trainings; the fast tier keeps tune's budget checks
def test_tune_prunes_records_a_crashed_trial_and_writes_a_recipe_that_trains(photos, tmp_path, monkeypatch, capsys):
    poisoned = poisoned_copy(photos, tmp_path / "poisoned")  # the test split is never read by the search either
    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n[train]\nepochs = {low = 1, high = 2}\n")
    base = build_config("tiny", {"data.source": str(poisoned), **TINY_OVERRIDES})
    real_run_fold = cv.run_fold

    def run_fold(config, run, folder, **kwargs):
        if run.parent.name == "trial-0002":
            raise RuntimeError("a crash of this trial alone")
        return real_run_fold(config, run, folder, **kwargs)

    monkeypatch.setattr(cv, "run_fold", run_fold)
    lines = []
    study_dir = tmp_path / "study"
    summary = tune(study_dir, base, trials=4, space_file=space, folds=2, pruner=PruneTrialOne(), log=lines.append)
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "PRUNED", "FAIL", "COMPLETE"]
    first, pruned, crashed = study.trials[:3]
    assert first.params == {"optim.lr": 1e-3, "train.epochs": 1} and first.user_attrs["baseline"]  # the starting recipe
    folds = json.loads((study_dir / "trial-0000" / "cv.json").read_text())["folds"]
    assert first.intermediate_values == {0: folds[0]["accuracy"], 1: (folds[0]["accuracy"] + folds[1]["accuracy"]) / 2}
    assert (study_dir / "trial-0001" / "fold-0.json").is_file() and not (study_dir / "trial-0001" / "fold-1").exists()
    assert "a crash of this trial alone" in crashed.user_attrs["error"]
    assert "trial 2: fail" in " ".join(lines) and summary.splitlines()[0].endswith("2 complete, 1 pruned, 1 failed")
    # what pruning saved: the pruned trial's one fold not run, at its own fold time; the study's cost beyond the folds
    assert len(pruned.user_attrs["fold_seconds"]) == 1 and len(first.user_attrs["fold_seconds"]) == 2
    assert costs(study.trials, folds=2)[0].startswith(
        f"pruning: 1 trials stopped early, saving about {round(pruned.user_attrs['fold_seconds'][0])} s"
    )
    assert (
        summary.splitlines()[1].startswith("pruning: 1 trials")
        and "the study's own cost per trial" in summary.splitlines()[2]
    )
    for name in ("history.png", "importance.png", "slice.png", "tune.md"):
        assert (study_dir / name).stat().st_size > 0
    assert "best vs starting recipe" in summary.splitlines()[-1] or "starting recipe (trial 0) is the best" in summary
    recipe = load_recipe(str(study_dir / "best.toml"))
    assert (
        recipe.optim.lr == pytest.approx(study.best_params["optim.lr"])
        and recipe.train.epochs == study.best_params["train.epochs"]
    )
    assert (
        main(
            [
                "train",
                "--recipe",
                str(study_dir / "best.toml"),
                "--data",
                str(photos),
                "--out",
                str(tmp_path / "best"),
                "--quiet",
                "--epochs",
                "1",
            ]
        )
        == 0
    )
    # the same folder with another space, or other photos: refused, not mixed in
    with pytest.raises(StudyError, match="something else.*space"):
        tune(study_dir, base, trials=1, folds=2, log=lines.append)
    other = make_photo_folder(tmp_path / "other", n_train=5, n_test=1)
    with pytest.raises(StudyError, match="something else"):
        tune(
            study_dir,
            build_config("tiny", {"data.source": str(other), **TINY_OVERRIDES}),
            trials=1,
            space_file=space,
            folds=2,
        )


@pytest.mark.slow  # a study interrupted and run again; the fast tier keeps tune's budget checks and cv's resume
def test_an_interrupted_tune_study_goes_on_in_the_same_trial_folder_keeping_its_finished_fold(
    photos, tmp_path, monkeypatch
):
    import foodvit.training.run as trainer

    real_train, started, interrupt = trainer.train, [], [True]

    def train(config, out, **kwargs):
        started.append(f"{Path(out).parent.name}/{Path(out).name}")
        if len(started) == 2 and interrupt[0]:
            raise KeyboardInterrupt  # Ctrl-C as the trial's second fold starts
        return real_train(config, out, **kwargs)

    monkeypatch.setattr(trainer, "train", train)
    base = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    space = {"optim.lr": Param("optim.lr", 1e-4, 1e-2, log=True)}
    study_dir = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        tune(study_dir, base, trials=1, space=space, folds=2, log=lambda line: None)
    interrupt[0] = False
    tune(study_dir, base, trials=1, space=space, folds=2, log=lambda line: None)
    assert started == ["trial-0000/fold-0", "trial-0000/fold-1", "trial-0000/fold-1"]  # fold 0 was not trained again
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    interrupted, again = study.trials
    assert (interrupted.state.name, again.state.name) == ("FAIL", "COMPLETE")
    assert (
        again.params == interrupted.params and again.user_attrs["dir"] == "trial-0000" and again.user_attrs["baseline"]
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("[optim]\nfoo = {low = 1, high = 2}\n", "unknown setting 'optim.foo'"),
        ("[optim]\nlr = {low = -1.0, high = 0.1}\n", "--lr must be in (0, 10], got -1"),
        ("[vit]\nimage_size = {low = 30, high = 64}\n", "not a multiple of the patch size 8"),
        ("[train]\nepochs = {low = 5, high = 2}\n", "low must be below high"),
        ('[data]\naugment = {choices = ["flip", "wild"]}\n', "--augment must be one of"),
        ("[vit]\nembed_dim = {choices = [96, 100]}\n", "width 100 is not a multiple of the 3 heads"),
        (
            "[distill]\ntemperature = {low = 1.0, high = 4.0}\n",
            "distill.temperature may draw a temperature above 0 where distill.weight may be 0",
        ),
        (
            '[guidance]\nweight = {choices = [0.0, 1.0]}\nschedule = {choices = ["constant", "linear"]}\n',
            "guidance.schedule may draw a schedule other than constant where guidance.weight may be 0",
        ),
        (
            "[guidance]\nweight = {choices = [0.0, 1.0]}\nstages = {choices = [3, 4]}\n",
            "guidance.stages may draw the teacher's fourth stage where guidance.weight may be 0",
        ),
        (
            "[distill]\nweight = {choices = [0.0, 1.0]}\n[vit]\ndistill_token = {choices = [true]}\n",
            "vit.distill_token may draw the distillation token",
        ),
        (
            "[contrast]\ntemperature = {low = 0.1, high = 0.5}\n",
            "contrast.temperature may draw a temperature other than 0.2 where contrast.weight may be 0",
        ),
        # a space file of the layout before the objectives' sections: the settings under their flat names
        (
            "[optim]\nmasked = {choices = [0.0, 1.0]}\nmask_pixels = {choices = [true, false]}\n",
            "masked.pixels may draw hidden pixels where masked.weight may be 0",
        ),
        (
            "[optim]\ndrloc = {low = 0.0, high = 1.0}\n[drloc]\nweight = {low = 0.5, high = 1.0}\n",
            "drloc.weight is given twice, also under its flat-layout name optim.drloc: remove optim.drloc",
        ),
        # the CNN teacher's settings with no objective that reads it on, nor one the space may switch on
        ("[teacher]\nepochs = {low = 1, high = 3}\n", "teacher.epochs varies the CNN teacher, which no trial reads"),
        (
            '[optim]\nteacher = {choices = ["resnet18", "resnet34"]}\n[guidance]\nweight = {choices = [0.0]}\n',
            "teacher.architecture varies the CNN teacher, which no trial reads",
        ),
        # where and in which arithmetic the trials train: one for all of them
        ("[train]\namp = {choices = [true, false]}\n", "train.amp cannot be searched"),
        ('[train]\ndevice = {choices = ["cpu", "cuda"]}\n', "train.device cannot be searched"),
        # what Optuna would fail on, or quietly change, refused before a trial runs
        ("[vit]\ndepth = {low = 1, high = 4, log = true, step = 2}\n", "a log scale takes no step"),
        (
            "[vit]\ndepth = {low = 1, high = 4, step = 5}\n",
            "high - low (3) must be a multiple of step 5, e.g. high = 6",
        ),
        ('[optim]\nlr = {low = 0.001, high = 0.01, log = "false"}\n', "log must be true or false, got 'false'"),
        ("[optim]\nbetas = {choices = [[0.9, 0.999], [0.8, 0.99]]}\n", "choices must be single values"),
        # choices checked as ranges are: on the patch grid, heads that divide the width
        ("[vit]\nimage_size = {choices = [30, 32]}\n", "image_size choice 30 is not a multiple of the patch size 8"),
        ("[vit]\nnum_heads = {choices = [3, 5]}\n", "5 heads do not divide the width 192"),
        (
            "[vit]\nnum_heads = {choices = [4, 5]}\nembed_dim = {choices = [240, 256]}\n",
            "5 heads do not divide the width 256",
        ),
        ("[vit]\nimage_size = {low = 32, high = 96, log = true}\n", "moves in steps of the patch size (8)"),
        # read as a recipe is (it was a RecursionError's traceback)
        ("[optim]\nlr = " + "[" * 100_000 + "]" * 100_000 + "\n", "nests arrays or tables thousands deep"),
    ],
)
def test_tune_refuses_a_bad_space_file_in_one_line(photos, tmp_path, capsys, text, message):
    space = tmp_path / "space.toml"
    space.write_text(text)
    assert (
        main(
            ["tune", "--data", str(photos), "--out", str(tmp_path / "s"), "--space", str(space), "--folds", "2", *TINY]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(space) in err
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_no_fold_starts_that_would_end_past_the_budget(photos, tmp_path, monkeypatch):
    import time
    from types import SimpleNamespace

    import foodvit.tuning.search as search

    offset = [0.0]
    monkeypatch.setattr(search, "time", SimpleNamespace(time=lambda: time.time() + offset[0]))
    real_run_fold = cv.run_fold

    def run_fold(*args, **kwargs):
        result = real_run_fold(*args, **kwargs)
        offset[0] = 1000.0  # the clock jumps to the end of the budget while fold 0 finishes
        return result

    monkeypatch.setattr(cv, "run_fold", run_fold)
    base = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    study_dir = tmp_path / "study"
    summary = tune(
        study_dir,
        base,
        trials=3,
        budget_s=1000,
        space={"optim.lr": Param("optim.lr", 1e-4, 1e-2, log=True)},
        folds=2,
        log=lambda line: None,
    )
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["PRUNED"] and study.trials[0].user_attrs["stopped"] == "budget"
    assert not (study_dir / "trial-0000" / "fold-1").exists() and "no trial has finished yet" in summary
    assert "the budget ended" in (study_dir / "tune.md").read_text()


def test_a_search_compares_its_trials_in_one_arithmetic(photos, tmp_path, monkeypatch, capsys):
    """Each trial records the arithmetic it trained in (in the study's database); a machine of another kind is refused
    in one line before it trains a trial, and trials of two kinds (machines that began at once) are named in tune.md."""
    from types import SimpleNamespace

    import torch

    from foodvit.training import engine
    from foodvit.tuning.study import search_arithmetic
    from foodvit.tuning.summary import mixed_arithmetic

    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    study_dir = tmp_path / "study"
    args = ["tune", "--data", str(photos), "--out", str(study_dir), "--space", str(space), "--folds", "2", "--quiet"]
    args += ["--trials", "1", "--device", "cpu", *TINY]
    assert main(args) == 0
    ours = engine.arithmetic(torch.device("cpu"), True)
    other = {"bf16 on cpu": "float32 on cpu", "float32 on cpu": "bf16 on cpu"}[ours]
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert [t.user_attrs["arithmetic"] for t in study.trials] == [ours]
    capsys.readouterr()
    with monkeypatch.context() as patched:
        patched.setattr(engine, "cpu_computes_bf16", lambda: other == "bf16 on cpu")
        assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"train in {ours} (trial 0, its first) and this machine would train in" in err
    assert "--amp false" in err and not (study_dir / "trial-0001").exists()
    assert len(optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}").trials) == 1

    # a machine of the other kind that began beside this one: its trial is refused before it trains, and left for the
    # next `foodvit tune` to run again
    import foodvit.tuning.search as search

    kinds = iter([ours, other])  # the start's check (the study's first trial is this machine's), then the trial's
    monkeypatch.setattr(search, "training_arithmetic", lambda config: next(kinds))
    assert main(args) == 2
    assert "train in" in capsys.readouterr().err and not (study_dir / "trial-0001" / "fold-0").exists()
    refused = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}").trials[1]
    assert refused.state.name == "FAIL" and refused.user_attrs["interrupted"]
    assert "arithmetic" in refused.user_attrs["error"]

    trials = [
        SimpleNamespace(number=n, user_attrs={"arithmetic": kind}) for n, kind in enumerate([ours, other, "bf16"])
    ]
    failed = SimpleNamespace(number=0, user_attrs={"arithmetic": other}, state=optuna.trial.TrialState.FAIL)
    later = SimpleNamespace(number=1, user_attrs={"arithmetic": ours})
    search_arithmetic(study_dir, [failed, later], ours)  # failed before its first fold, trial 0 trained nothing
    search_arithmetic(study_dir, trials, ours, this=3)  # the first trial's kind: goes on beside a later one's
    search_arithmetic(study_dir, trials, other, this=0)  # the trial about to train is left out; "bf16" is unknown
    with pytest.raises(StudyError, match=re.escape(f"train in {ours} (trial 0, its first) and this machine would")):
        search_arithmetic(study_dir, trials, other)
    assert mixed_arithmetic(trials[:1]) == []
    assert mixed_arithmetic(trials) == [
        f"trials trained in 2 arithmetics (trial 0 in {ours}; trial 1 in {other}): compare only trials of one"
    ]


def test_budget_parsing():
    assert [parse_budget(t) for t in ("2h", "45m", "90s", "1h30m", "600")] == [7200, 2700, 90, 5400, 600]
    with pytest.raises(Exception, match="such as 2h"):
        parse_budget("two hours")


@pytest.mark.slow
def test_two_processes_with_one_trial_each_share_one_sqlite_study(photos, tmp_path):
    study_dir = tmp_path / "study"
    space = tmp_path / "space.toml"
    space.write_text("[optim]\nlr = {low = 1e-4, high = 1e-2, log = true}\n")
    command = [
        sys.executable,
        "-m",
        "foodvit",
        "tune",
        "--data",
        str(photos),
        "--out",
        str(study_dir),
        "--trials",
        "1",
        "--folds",
        "2",
        "--space",
        str(space),
        "--quiet",
        *TINY,
    ]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert sum(bool(t.user_attrs.get("baseline")) for t in study.trials) == 1  # the starting recipe ran once


def test_a_starting_value_outside_a_settings_choices_is_searched_too_and_the_first_trial_tries_it(photos, tmp_path):
    """The tiny recipe's augment is "flip"; the guide's space searches ["light", "medium", "strong"]: the first
    trial, the starting recipe, died in Optuna with a ValueError traceback ('flip' not in (...))."""
    space = tmp_path / "space.toml"
    space.write_text('[data]\naugment = {choices = ["light", "medium", "strong"]}\n')
    base = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    lines = []
    tune(tmp_path / "study", base, trials=1, space_file=space, folds=2, log=lines.append)
    assert (
        "data.augment: the starting recipe's 'flip' is not among the space's choices; it is searched too (the first "
        "trial is the starting recipe)" in lines
    )
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert [(t.state.name, t.params) for t in study.trials] == [("COMPLETE", {"data.augment": "flip"})]
    from foodvit.tuning.space import default_space, with_starting_values

    impulse = build_config("tiny", {"vit.init": "impulse", "vit.pos_embed": "sincos2d"})  # searched: jax, mimetic
    widened, keys = with_starting_values(default_space(impulse), impulse)
    assert keys == {"vit.init": "impulse"} and widened["vit.init"].choices == ("impulse", "jax", "mimetic")


@pytest.mark.parametrize("recipe", ["default", "tiny", "course", "paper"])
def test_the_default_space_holds_the_starting_recipe_and_only_valid_models(recipe):
    from foodvit.tuning.space import base_values, default_space

    base = build_config(recipe)
    start, space = base_values(base), default_space(base)
    assert all(p.contains(start[key]) for key, p in space.items())  # the first trial is the recipe itself
    assert all(width % start["vit.num_heads"] == 0 for width in space["vit.embed_dim"].choices)
    sizes = space["vit.image_size"]
    assert sizes.low % start["vit.patch_size"] == 0 and sizes.step == start["vit.patch_size"]


def test_a_trial_keeps_the_bases_progressive_resizing_where_its_model_can_take_it():
    # a searched image size is compared at the recipe's own schedule, not with progressive resizing
    # switched off for every size but the recipe's; a start the user gave on the command line is the
    # base's and is kept the same way; a trial whose model cannot take it trains without it
    for base in (build_config("default"), build_config("default", {"vit.image_size": 64, "data.start_size": 48})):
        start = base.data.start_size
        assert trial_config({"vit.image_size": 128}, base).data.start_size == start
        assert trial_config({"vit.image_size": start}, base).data.start_size == 0
        assert trial_config({"vit.pos_embed": "learned"}, base).data.start_size == 0
        assert trial_config({"optim.lr": 3e-4}, base).data.start_size == start
    assert (
        trial_config({"data.start_size": 0}, build_config("default")).data.start_size == 0
    )  # searched: the trial's own


def test_best_toml_records_the_schedule_the_best_trial_trained_with(tmp_path):
    # best.toml once kept the recipe's 64 px start for a best trial at 48 px, which trained without it:
    # the recipe then stopped `foodvit train` ("above the image size") or trained something else
    import optuna
    from optuna.distributions import IntDistribution

    study = optuna.create_study(direction="maximize")
    for size, accuracy in ((48, 0.7), (128, 0.6)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"vit.image_size": size},
                value=accuracy,
                distributions={"vit.image_size": IntDistribution(32, 128, step=16)},
            )
        )
    write_report(study, tmp_path, build_config("default"), {}, folds=2)
    best = load_recipe(str(tmp_path / "best.toml"))
    assert (best.vit.image_size, best.data.start_size) == (48, 0)


def test_a_study_of_the_flat_layout_runs_its_interrupted_trials_again_under_the_sectioned_names(tmp_path):
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    from foodvit.tuning.search import _requeue_interrupted

    study = optuna.create_study(direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(
            params={"optim.drloc": 0.3},
            state=TrialState.FAIL,
            distributions={"optim.drloc": FloatDistribution(0.0, 1.0)},
            user_attrs={"interrupted": True},
        )
    )
    _requeue_interrupted(study)
    queued = [t for t in study.trials if t.state == TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in queued] == [{"drloc.weight": 0.3}]  # what the space suggests
    study.add_trial(
        optuna.trial.create_trial(
            params={"optim.drloc": 0.5}, value=0.7, distributions={"optim.drloc": FloatDistribution(0.0, 1.0)}
        )
    )
    write_report(study, tmp_path, build_config("default"), {}, folds=2)
    assert "| 0.700 |  | (the starting recipe) |" in (tmp_path / "tune.md").read_text()  # 0.5: the default's


def test_a_study_started_before_a_setting_existed_resumes_and_one_at_another_value_does_not(tmp_path):
    """An upgrade adds settings, at defaults that keep the old behaviour: a study whose study.json
    lacks one is the same study at the default, and another study at any other value."""
    config = RunConfig()
    identity = {"kind": "cv", "folds": 5, "settings": study_settings(config.to_dict())}
    older = json.loads(json.dumps(identity))
    del older["settings"]["pretrain"]["epochs"]  # as a version before the setting wrote it
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps(older))
    open_study(folder, identity)  # resumed: nothing raised
    assert json.loads((folder / "study.json").read_text()) == older  # and the file left as it was
    changed = {**identity, "settings": study_settings(with_settings(config, {"pretrain.epochs": 5}).to_dict())}
    with pytest.raises(StudyError, match=r"pretrain.epochs: 0 -> 5"):
        open_study(folder, changed)
    # a stored setting this version does not know still differs, never silently dropped
    unknown = json.loads(json.dumps(older))
    unknown["settings"]["optim"]["retired_option"] = 1
    (folder / "study.json").write_text(json.dumps(unknown))
    with pytest.raises(StudyError, match="retired_option"):
        open_study(folder, identity)


def test_a_space_with_distillation_always_on_may_search_its_temperature_and_token(tmp_path):
    from foodvit.recipes import load_recipe
    from foodvit.tuning.space import read_space

    config = load_recipe("tiny")
    space = tmp_path / "space.toml"
    space.write_text(
        "[distill]\nweight = {low = 0.5, high = 2.0}\ntemperature = {choices = [0.0, 3.0]}\n"
        "[vit]\ndistill_token = {choices = [false, true]}\n"
    )
    assert set(read_space(space, config)) == {"distill.weight", "distill.temperature", "vit.distill_token"}
    space.write_text("[distill]\nweight = {choices = [0.0, 1.0]}\n")  # hard distillation on or off: nothing needs it
    assert set(read_space(space, config)) == {"distill.weight"}
    space.write_text("\ufeff[distill]\nweight = {choices = [0.0, 1.0]}\n", encoding="utf-8")  # as Notepad saves it
    assert set(read_space(space, config)) == {"distill.weight"}
    space.write_text('[guidance]\nweight = {low = 0.5, high = 2.0}\nschedule = {choices = ["constant", "linear"]}\n')
    assert set(read_space(space, config)) == {"guidance.weight", "guidance.schedule"}
    space.write_text("[guidance]\nweight = {choices = [0.0, 1.0]}\n[teacher]\nsize = {low = 32, high = 64}\n")
    assert set(read_space(space, config)) == {"guidance.weight", "teacher.size"}  # the teacher read where guided


def test_a_study_of_the_old_layout_runs_its_queued_and_retried_trials_with_their_values_under_the_current_names(
    photos, tmp_path, monkeypatch
):
    # a study of the flat layout: its starting recipe queued under the flat name (fixed params), and a trial killed
    # with kill -9 that Optuna's stale-trial retry queued again with its parameters under the flat name
    from types import SimpleNamespace

    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    from foodvit.rundir import directory as rundir
    from foodvit.tuning.folds import fingerprint
    from foodvit.tuning.storage import STUDY_NAME, open_storage

    base = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    split = training_photos(rundir.with_source(base))
    study_dir = tmp_path / "study"
    open_study(
        study_dir,
        {
            "kind": "tune",
            "data": fingerprint(split),
            "classes": list(split.classes),
            "folds": 2,
            "seed": base.train.seed,
            "space": {"optim.drloc": {"low": 0.0, "high": 1.0}},
            "settings": study_settings(base.to_dict()),
        },
    )
    old = optuna.create_study(storage=open_storage(study_dir, None), study_name=STUDY_NAME, direction="maximize")
    old.enqueue_trial({"optim.drloc": 0.25}, user_attrs={"baseline": True})
    old.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params={"optim.drloc": 0.75},
            distributions={"optim.drloc": FloatDistribution(0.0, 1.0)},
        )
    )
    trained = []
    monkeypatch.setattr(
        cv,
        "run_cv",
        lambda config, *a, **k: (trained.append(config.drloc.weight), (SimpleNamespace(accuracy=0.5), []))[1],
    )
    monkeypatch.setattr(cv, "write_study", lambda *a: None)
    tune(
        study_dir,
        base,
        trials=2,
        space={"drloc.weight": Param("drloc.weight", 0.0, 1.0)},
        folds=2,
        log=lambda line: None,
    )
    assert trained == [0.25, 0.75]
    study = optuna.load_study(study_name=STUDY_NAME, storage=open_storage(study_dir, None))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert json.loads((study_dir / "trial-0001" / "trial.json").read_text())["settings"]["drloc"]["weight"] == 0.75


def test_a_space_given_in_python_under_the_old_names_is_searched_under_the_current_ones(photos, tmp_path, monkeypatch):
    from types import SimpleNamespace

    trained = []
    monkeypatch.setattr(
        cv,
        "run_cv",
        lambda config, *a, **k: (trained.append(config.drloc.weight), (SimpleNamespace(accuracy=0.5), []))[1],
    )
    monkeypatch.setattr(cv, "write_study", lambda *a: None)
    base = build_config("tiny", {"data.source": str(photos), **TINY_OVERRIDES})
    study_dir = tmp_path / "study"
    tune(
        study_dir, base, trials=1, space={"optim.drloc": Param("optim.drloc", 0.0, 1.0)}, folds=2, log=lambda line: None
    )
    assert trained == [base.drloc.weight]  # the starting recipe's value, the first trial
    assert json.loads((study_dir / "study.json").read_text())["space"] == {"drloc.weight": {"low": 0.0, "high": 1.0}}
    study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study_dir / 'study.db'}")
    assert study.trials[0].params == {"drloc.weight": base.drloc.weight}
    with pytest.raises(
        ConfigError, match="drloc.weight is given twice, also under its flat-layout name optim.drloc: remove"
    ):
        tune(
            tmp_path / "other",
            base,
            trials=1,
            folds=2,
            space={"drloc.weight": Param("drloc.weight", 0.0, 1.0), "optim.drloc": Param("optim.drloc", 0.0, 1.0)},
        )


GOOD_RESULT = {"seed": 0, "fold": 0, "n": 1, "correct": 1, "accuracy": 1.0, "seconds": 1.0}  # of one GOOD_ANSWER
GOOD_ANSWER = {"photo": "pizza/1.jpg", "label": "pizza", "right": True}


@pytest.mark.parametrize(
    "damaged",
    [
        "{not json",
        "[1, 2]",
        json.dumps({**GOOD_RESULT, "predictions": None}),  # once failed in the summary with a TypeError
        json.dumps({**GOOD_RESULT, "predictions": [{**GOOD_ANSWER, "right": "yes"}]}),
        json.dumps({**GOOD_RESULT, "predictions": [{k: v for k, v in GOOD_ANSWER.items() if k != "label"}]}),
        json.dumps({**GOOD_RESULT, "seed": "0", "predictions": [GOOD_ANSWER]}),
        # no longer agreeing with itself (a traceback where the study summed it, or a study over fewer photos)
        json.dumps({**GOOD_RESULT, "accuracy": "1.0", "predictions": [GOOD_ANSWER]}),
        json.dumps({**GOOD_RESULT, "n": 2, "predictions": [GOOD_ANSWER]}),
        json.dumps({**GOOD_RESULT, "n": 0, "correct": 0, "predictions": []}),
    ],
)
def test_a_damaged_run_result_is_scored_again_from_its_run(tmp_path, damaged):
    from foodvit.tuning.fold import read_result

    path = tmp_path / "fold-0.json"
    path.write_text(json.dumps({**GOOD_RESULT, "predictions": [GOOD_ANSWER]}))
    assert read_result(path) == {**GOOD_RESULT, "predictions": [GOOD_ANSWER]}
    path.write_text(damaged)
    assert read_result(path) is None


def test_a_space_searching_heads_and_widths_together_is_checked_pair_by_pair(tmp_path):
    # each was once checked against the recipe's other (192 wide, 3 heads): a space whose every pair divides was refused
    from foodvit.recipes import load_recipe
    from foodvit.tuning.space import read_space

    space = tmp_path / "space.toml"
    space.write_text("[vit]\nnum_heads = {choices = [3, 5]}\nembed_dim = {choices = [240, 480]}\n")
    assert set(read_space(space, load_recipe("tiny"))) == {"vit.num_heads", "vit.embed_dim"}


def test_a_fold_whose_model_card_lost_its_metrics_is_named_with_what_to_do(cv_study, photos, tmp_path, capsys):
    # scoring a fold again from its run read model.json's metrics unchecked: a KeyError's traceback
    study = tmp_path / "study"
    shutil.copytree(cv_study["study"], study)
    for name in ("fold-0.json", "cv.json"):
        (study / name).unlink()
    card = json.loads((study / "fold-0" / "model.json").read_text())
    del card["metrics"]
    (study / "fold-0" / "model.json").write_text(json.dumps(card))
    capsys.readouterr()
    assert main(["cv", "--data", str(photos), "--folds", "2", "--out", str(study), "--quiet", *TINY]) == 2
    said = capsys.readouterr().err
    assert f"{study / 'fold-0' / 'model.json'} is not the model card training writes: remove" in said, said


def test_two_photos_of_one_name_in_a_study_are_named_before_anything_is_written(tmp_path, capsys):
    # pizza/a/b.jpg and pizza/a__b.jpg: "cannot use ... (File exists); check the path", study.json left behind
    root = make_photo_folder(tmp_path / "photos", n_train=3, n_test=1)
    photo = next((root / "train" / "pizza").iterdir())
    (root / "train" / "pizza" / "a").mkdir()
    (root / "train" / "pizza" / "a" / "b.jpg").write_bytes(photo.read_bytes())
    (root / "train" / "pizza" / "a__b.jpg").write_bytes(photo.read_bytes()[:-1] + b"\xd9")
    assert main(["cv", "--data", str(root), "--folds", "2", "--out", str(tmp_path / "study"), *TINY]) == 2
    said = capsys.readouterr().err
    assert "have one name in a study (pizza/a__b.jpg" in said and "rename one of them" in said, said
    assert not (tmp_path / "study").exists()
