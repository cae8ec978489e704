"""A validation source (data/validation.py, `foodvit train --validate-on`) and studies on it (`foodvit cv
--validate-on`, tuning/cv.py, folds.py, compare.py): photos also in the training data dropped and counted, the
test split read once at the end, one run a seed judged on the pool, and two pool studies paired with the photo as
the unit of the standard error. Tiny runs on generated photos."""

import csv
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest
from helpers import make_photo, make_photo_folder

from foodvit.cli.main import main
from foodvit.data.datasource import DataSource
from foodvit.data.validation import validation_pool
from foodvit.errors import DataError, StudyError
from foodvit.tuning import compare

TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


@pytest.fixture(scope="module")
def pool(tmp_path_factory, photos) -> Path:
    """Three new photos a class, plus a copy of one training and one test photo (the same bytes, another name)."""
    root = tmp_path_factory.mktemp("pool")
    for c, name in enumerate(("pizza", "steak", "sushi")):
        for i in range(3):
            make_photo(root / name / f"new-{i}.jpg", (40 + 80 * c, 120, 200 - 60 * c), (40, 48), seed=7000 + 10 * c + i)
    shutil.copy(photos / "train" / "pizza" / "000.jpg", root / "pizza" / "copy-of-train.jpg")
    shutil.copy(photos / "test" / "sushi" / "001.jpg", root / "sushi" / "copy-of-test.jpg")
    return root


def test_a_pool_drops_and_counts_photos_also_in_the_training_data(photos, pool, tmp_path):
    listed = DataSource.parse(str(photos)).listed()
    found = validation_pool(str(pool), listed)
    assert sorted(p.name for p in found.dropped) == ["copy-of-test.jpg", "copy-of-train.jpg"]
    assert len(found.listing.files) == 9 and found.listing.classes == ("pizza", "steak", "sushi")
    assert "9 photos" in found.line() and "2 dropped" in found.line()
    keys = found.keys()
    assert sorted(keys.values())[:3] == ["pizza/new-0.jpg", "pizza/new-1.jpg", "pizza/new-2.jpg"]
    # a set with train/ and test/ counts both splits, its photos named as in a folder of class folders
    whole = tmp_path / "set"
    shutil.copytree(pool, whole / "train")
    (whole / "test" / "steak").mkdir(parents=True)
    shutil.move(whole / "train" / "steak" / "new-0.jpg", whole / "test" / "steak" / "new-0.jpg")
    from_set = validation_pool(str(whole), listed)
    assert sorted(from_set.keys().values()) == sorted(keys.values()) and len(from_set.dropped) == 2
    # some classes only, in the run's class order
    some = validation_pool(f"{pool}:sushi", listed)
    assert {some.listing.classes[label] for _, label in some.listing.files} == {"sushi"}
    assert len(some.listing.files) == 3 and len(some.dropped) == 1


def test_a_pool_of_other_classes_or_only_training_photos_is_refused(photos, tmp_path):
    listed = DataSource.parse(str(photos)).listed()
    other = make_photo_folder(tmp_path / "other", n_train=1, n_test=0, classes=("pizza", "ramen"))
    with pytest.raises(DataError, match=r"class.es. ramen that the training data has not.*other/train:pizza\)"):
        validation_pool(str(other / "train"), listed)
    # the way out that message names: a KeyError on ramen's photos
    from PIL import Image

    Image.new("RGB", (40, 48), (1, 2, 3)).save(other / "train" / "pizza" / "new.jpg")  # not a training photo
    pizza = validation_pool(f"{other / 'train'}:pizza", listed)
    assert {pizza.listing.classes[label] for _, label in pizza.listing.files} == {"pizza"}
    with pytest.raises(DataError, match="every photo of the validation source .* is also in the training data"):
        validation_pool(str(photos / "test"), listed)


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_a_missing_or_empty_pool_is_described_as_a_pool_is_laid_out(photos, tmp_path, where):
    # the message once described a data set's train/ and test/ layout, which a pool need not have
    listed = DataSource.parse(str(photos)).listed()
    pool = tmp_path / "pool"
    if where == "empty":
        pool.mkdir()
    with pytest.raises(DataError) as refused:
        validation_pool(str(pool), listed)
    says = "does not exist" if where == "missing" else "has no class folders"
    assert str(refused.value).startswith(f"the validation source {pool} {says}; expected a folder of class folders")


def test_train_validates_on_the_pool_and_reads_the_test_split_once(photos, pool, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(photos),
                "--validate-on",
                str(pool),
                "--out",
                str(run),
                "--quiet",
                *TINY,
                "--epochs",
                "2",
                "--eval-every",
                "1",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader((run / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(row["val_acc"] and not row["test_acc"] for row in rows)  # the pool, each epoch
    metrics = json.loads((run / "model.json").read_text())["metrics"]
    assert metrics["val_n"] == 9 and metrics["val_dropped"] == 2 and metrics["test_n"] == 6
    answers = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert len(answers) == 9 and statistics.mean(a["right"] for a in answers) == pytest.approx(metrics["val_acc"])
    assert {a["photo"] for a in answers} == set(
        validation_pool(str(pool), DataSource.parse(str(photos)).listed()).keys().values()
    )
    report = (run / "report.md").read_text()
    assert (
        "**Validation accuracy:" in report
        and "2 of its photos left out" in report
        and "## Per class (validation)" in report
        and "The test split was read once, for this report: nothing" in report  # it said so of every run
    )
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--data",
                str(photos),
                "--validate-on",
                str(pool),
                "--val-fraction",
                "0.25",
                "--out",
                str(tmp_path / "both"),
                *TINY,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keep one of the two" in err


@pytest.fixture(scope="module")
def pool_study(tmp_path_factory, photos, pool):
    study = tmp_path_factory.mktemp("studies") / "pool"
    assert (
        main(
            [
                "cv",
                "--data",
                str(photos),
                "--validate-on",
                str(pool),
                "--seeds",
                "2",
                "--seed",
                "0",
                "--out",
                str(study),
                "--quiet",
                "--device",
                "cpu",  # on a CUDA machine too: the arithmetic test reads the CPU's
                *TINY,
            ]
        )
        == 0
    )
    return study


def test_a_pool_study_trains_each_seed_on_every_training_photo_and_scores_the_pool(pool_study, photos):
    result = json.loads((pool_study / "cv.json").read_text())
    assert result["study"]["kind"] == "pool" and result["study"]["dropped"] == 2 and result["study"]["seeds"] == [0, 1]
    assert sorted(result["photos"]) == sorted(
        f"s{seed}/{key}"
        for seed in (0, 1)
        for key in ([f"{c}/new-{i}.jpg" for c in ("pizza", "steak", "sushi") for i in range(3)])
    )
    for seed in (0, 1):
        config = json.loads((pool_study / f"seed-{seed}" / "config.json").read_text())
        assert config["train"]["seed"] == seed and config["data"]["validate_on"] == ""
        assert json.loads((pool_study / f"seed-{seed}" / "model.json").read_text())["metrics"]["train_photos"] == 12
    assert "| seed | photos | accuracy |" in (pool_study / "cv.md").read_text()


def test_a_study_trains_every_run_in_one_arithmetic(pool_study, photos, pool, tmp_path, monkeypatch, capsys):
    """Each run's result records its arithmetic (bf16 autocast or float32); a machine of the other arithmetic may not
    train a study's runs left, and results of both are refused, never summarised together."""
    import torch

    from foodvit.training import engine

    ours = engine.arithmetic(torch.device("cpu"), True)
    other = {"bf16 on cpu": "float32 on cpu", "float32 on cpu": "bf16 on cpu"}[ours]
    assert [json.loads((pool_study / f"seed-{s}.json").read_text())["arithmetic"] for s in (0, 1)] == [ours, ours]
    assert [f["arithmetic"] for f in json.loads((pool_study / "cv.json").read_text())["folds"]] == [ours, ours]
    chip = engine.processor(torch.device("cpu"))  # and the chip, whose rounding differs from another's
    assert chip and [json.loads((pool_study / f"seed-{s}.json").read_text())["processor"] for s in (0, 1)] == [chip] * 2
    assert [f["processor"] for f in json.loads((pool_study / "cv.json").read_text())["folds"]] == [chip, chip]
    args = ["cv", "--data", str(photos), "--validate-on", str(pool), "--seeds", "2", "--seed", "0", *TINY, "--quiet"]
    args += ["--device", "cpu"]  # the fixture's device

    study = tmp_path / "left"  # seed 1 left to train, on a CPU of the other arithmetic: refused before it trains
    shutil.copytree(pool_study, study)
    shutil.rmtree(study / "seed-1")
    (study / "seed-1.json").unlink()
    with monkeypatch.context() as patched:
        patched.setattr(engine, "cpu_computes_bf16", lambda: other == "bf16 on cpu")
        assert main([*args, "--out", str(study)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and f"seed-0 trained in {ours} and this machine would train the rest in {other}" in err
    )
    assert "start a new study with --amp false" in err and not (study / "seed-1").exists()

    study = tmp_path / "mixed"  # both results written, in different arithmetic: the study is not summarised
    shutil.copytree(pool_study, study)
    (study / "cv.json").unlink()
    seed_1 = json.loads((study / "seed-1.json").read_text())
    (study / "seed-1.json").write_text(json.dumps({**seed_1, "arithmetic": other}))
    assert main([*args, "--out", str(study)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"mixes arithmetic: seed-0 trained in {ours}, seed-1 in {other}" in err
    assert f"remove {study / 'seed-1'} with {study / 'seed-1'}.json" in err and not (study / "cv.json").exists()

    # a result written before foodvit recorded its arithmetic, or that names it without the device, is not taken
    # for either
    (study / "seed-1.json").write_text(json.dumps({**seed_1, "arithmetic": other.split()[0]}))
    assert main([*args, "--out", str(study)]) == 0 and (study / "cv.json").is_file()
    del seed_1["arithmetic"]
    (study / "seed-1.json").write_text(json.dumps(seed_1))
    (study / "cv.json").unlink()
    assert main([*args, "--out", str(study)]) == 0 and (study / "cv.json").is_file()


def test_a_pool_study_grows_by_seeds_and_pairs_with_a_study_of_fewer_on_the_seeds_both_hold(
    pool_study, photos, pool, tmp_path, monkeypatch, capsys
):
    """A larger --seeds trains the new seed alone; --compare pairs the grown study with the two-seed one on seeds 0 and
    1; a process that started before the study grew (a smaller --seeds) leaves the summary to the one that grew it."""
    from foodvit.tuning import cv

    grown = tmp_path / "grown"
    shutil.copytree(pool_study, grown)
    kept = {s: (grown / f"seed-{s}.json").read_bytes() for s in (0, 1)}
    args = [
        "cv",
        "--data",
        str(photos),
        "--validate-on",
        str(pool),
        "--seed",
        "0",
        *TINY,
        "--quiet",
        "--out",
        str(grown),
    ]
    assert main([*args, "--seeds", "3", "--device", "cpu"]) == 0
    assert "grown from seeds 0, 1 to 0, 1, 2" in capsys.readouterr().err
    assert all((grown / f"seed-{s}.json").read_bytes() == kept[s] for s in (0, 1))
    result = json.loads((grown / "cv.json").read_text())
    assert [f["seed"] for f in result["folds"]] == [0, 1, 2] and len(result["photos"]) == 27
    result, line = compare.compare_studies(pool_study, grown)
    assert result["difference"] == 0 and result["n"] == 18 and result["photos"] == 9
    assert "of seeds 0, 1, which both studies hold" in line and "alone: +0.000 / +0.000" in line, line
    kept = {}  # as results/cv keeps a study (study.json, cv.json, cv.md; no runs): they pair all the same
    for name, folder in (("two", pool_study), ("three", grown)):
        kept[name] = tmp_path / "kept" / name
        kept[name].mkdir(parents=True)
        for file in ("study.json", "cv.json", "cv.md"):
            shutil.copy(folder / file, kept[name] / file)
    assert compare.compare_studies(kept["two"], kept["three"]) == (
        result,
        line.replace(str(pool_study), str(kept["two"])).replace(str(grown), str(kept["three"])),
    )
    unfinished = tmp_path / "unfinished"  # seed 1's result not written yet: the seeds both have finished pair
    shutil.copytree(grown, unfinished)
    for file in ("cv.json", "seed-1.json"):
        (unfinished / file).unlink()
    line = compare.compare_studies(pool_study, unfinished)[1]
    assert "over 9 photos of the seeds both have finished, seed 0;" in line, line

    late = tmp_path / "late"  # grown to four seeds by another process while a three-seed process summarises
    shutil.copytree(grown, late)
    (late / "cv.json").unlink()
    real = cv.run_cv

    def grown_meanwhile(*a, **k):
        found = real(*a, **k)
        stored = json.loads((late / "study.json").read_text())
        (late / "study.json").write_text(json.dumps({**stored, "seeds": [0, 1, 2, 3]}))
        return found

    monkeypatch.setattr(cv, "run_cv", grown_meanwhile)
    assert main([*args[:-1], str(late), "--seeds", "3", "--device", "cpu"]) == 0
    said = capsys.readouterr()
    assert "has grown to seeds 0, 1, 2, 3 while this ran: the results of seeds 0, 1, 2 are kept" in said.err
    assert "its summary is written by the process training its new seeds" in said.out and "cv.md" not in said.out
    assert not (late / "cv.json").exists()


@pytest.mark.slow  # a guided pool study; the CV lender's checks stay in the fast tier of test_tune
def test_a_pool_lenders_teachers_trained_elsewhere_are_refused(photos, pool, tmp_path, capsys):
    """A pool study lends its seeds' teachers (seed-S/teacher.pt) only where they trained as this study's would: one
    trained with another number of threads is refused before the borrowing study's folder is made."""
    import torch

    from foodvit.rundir.directory import load_checkpoint

    guided = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "2", "--guidance", "1"]
    args = ["cv", "--data", str(photos), "--validate-on", str(pool), "--seed", "0", "--quiet", "--device", "cpu"]
    lender = tmp_path / "lender"
    assert main([*args, *guided, "--out", str(lender)]) == 0
    teacher = load_checkpoint(lender / "seed-0" / "teacher.pt")
    threads = torch.get_num_threads()
    torch.save(
        {**teacher, "trained_on": {**teacher["trained_on"], "threads": threads + 1}}, lender / "seed-0" / "teacher.pt"
    )
    capsys.readouterr()
    assert main([*args, *guided, "--out", str(tmp_path / "b"), "--teachers", str(lender)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "trained its CNN teachers elsewhere" in err and "threads" in err, err
    assert not (tmp_path / "b").exists()


def test_a_study_the_bench_keeps_grows_by_seeds_without_training_the_seeds_it_holds(
    pool_study, photos, pool, tmp_path, monkeypatch
):
    """bench/accuracy/pool.py keeps a pool study's seed results beside its summary, so the kept study grows: only the
    new seed trains."""
    from bench.accuracy import pool as bench_pool

    import foodvit.training.run as trainer

    monkeypatch.setattr(bench_pool, "RESULTS", tmp_path / "results")
    kept = bench_pool.keep(pool_study)
    assert sorted(p.name for p in kept.iterdir()) == ["cv.json", "cv.md", "seed-0.json", "seed-1.json", "study.json"]
    real_train, started = trainer.train, []
    monkeypatch.setattr(
        trainer, "train", lambda config, run, **kw: started.append(Path(run).name) or real_train(config, run, **kw)
    )
    args = ["cv", "--data", str(photos), "--validate-on", str(pool), "--seed", "0", "--seeds", "3", *TINY, "--quiet"]
    assert main([*args, "--device", "cpu", "--out", str(kept)]) == 0
    assert started == ["seed-2"] and [f["seed"] for f in json.loads((kept / "cv.json").read_text())["folds"]] == [
        0,
        1,
        2,
    ]


def test_pool_study_options_that_belong_to_cross_validation_are_refused(photos, pool, tmp_path, capsys):
    for extra, message in ((["--folds", "3"], "leave --folds out"), (["--fold", "0"], "leave --fold out")):
        assert (
            main(["cv", "--data", str(photos), "--validate-on", str(pool), "--out", str(tmp_path / "x"), *TINY, *extra])
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "x").exists()


def fake_study(folder: Path, kind: str, photos: dict, *, folds=1, seeds=(0, 1), settings=None) -> Path:
    """A finished study's two files, as `foodvit cv` writes them, with these predictions."""
    folder.mkdir(parents=True)
    identity = {
        "kind": kind,
        "data": "d",
        "classes": ["a", "b"],
        "folds": folds,
        "seeds": list(seeds),
        "settings": settings or {},
        **({"validation": "v"} if kind == "pool" else {}),
    }
    (folder / "study.json").write_text(json.dumps(identity))
    (folder / "cv.json").write_text(json.dumps({"recipe": "default", "photos": photos}))
    return folder


def test_two_seeds_of_identical_answers_give_the_one_seed_standard_error(tmp_path):
    a_answers = [True, False, True, True, False, True, False, True]
    b_answers = [True, True, False, True, True, True, False, False]
    one = compare.compare_studies(
        fake_study(tmp_path / "a1", "pool", {f"s0/x/{i}": r for i, r in enumerate(a_answers)}, seeds=(0,)),
        fake_study(tmp_path / "b1", "pool", {f"s0/x/{i}": r for i, r in enumerate(b_answers)}, seeds=(0,)),
    )[0]
    twice = lambda answers: {f"s{s}/x/{i}": r for s in (0, 1) for i, r in enumerate(answers)}  # noqa: E731
    two = compare.compare_studies(
        fake_study(tmp_path / "a2", "pool", twice(a_answers)), fake_study(tmp_path / "b2", "pool", twice(b_answers))
    )[0]
    diffs = [int(b) - int(a) for a, b in zip(a_answers, b_answers, strict=True)]
    assert one["standard_error"] == pytest.approx(statistics.stdev(diffs) / math.sqrt(len(diffs)))
    assert two["standard_error"] == pytest.approx(one["standard_error"]) and two["n"] == 16 and two["photos"] == 8
    assert two["difference"] == pytest.approx(one["difference"])


def test_compare_gives_each_seeds_difference_beside_the_pooled_one(tmp_path):
    """A lead one seed carries shows: seed 0 gains two photos of four, seed 1 loses one."""
    a = {"s0/x/1": False, "s0/x/2": False, "s0/x/3": True, "s0/x/4": True}
    a |= {"s1/x/1": True, "s1/x/2": True, "s1/x/3": True, "s1/x/4": False}
    b = {**a, "s0/x/1": True, "s0/x/2": True, "s1/x/3": False}
    result, line = compare.compare_studies(fake_study(tmp_path / "a", "pool", a), fake_study(tmp_path / "b", "pool", b))
    assert result["by_seed"] == {0: 0.5, 1: -0.25} and result["difference"] == pytest.approx(0.125)
    assert line.endswith("seeds 0 / 1 alone: +0.500 / -0.250)"), line
    one_seed = compare.compare_studies(
        fake_study(tmp_path / "a1", "pool", {k: v for k, v in a.items() if k.startswith("s0/")}, seeds=(0,)),
        fake_study(tmp_path / "b1", "pool", {k: v for k, v in b.items() if k.startswith("s0/")}, seeds=(0,)),
    )[1]
    assert "alone" not in one_seed


def test_compare_says_when_runs_that_pair_trained_on_other_chips(tmp_path):
    """The chips of the runs that pair, seed by seed: a study grown by a seed on another chip is no other chip for the
    seeds both hold, and two studies whose seeds trained crosswise pair every run across chips."""

    def study(name, chips: dict, seeds=(0, 1)):
        answers = {f"s{seed}/x/{i}": bool((i + seed) % 2) for seed in seeds for i in range(4)}
        folder = fake_study(tmp_path / name, "pool", answers, seeds=seeds)
        folds = [{"seed": seed, "fold": 0, **({"processor": chips[seed]} if seed in chips else {})} for seed in seeds]
        found = {"recipe": "default", "study": {"seeds": list(seeds)}, "photos": answers, "folds": folds}
        (folder / "cv.json").write_text(json.dumps(found))
        return folder

    a = study("a", {0: "X", 1: "X"})
    grown = study("grown", {0: "X", 1: "X", 2: "Y"}, seeds=(0, 1, 2))
    result, line = compare.compare_studies(a, grown)
    assert "chips" not in line and result["n"] == 8 and "of seeds 0, 1, which both studies hold" in line, line
    crossed = compare.compare_studies(study("c", {0: "X", 1: "Y"}), study("d", {0: "Y", 1: "X"}))[1]
    assert crossed.endswith(
        f"2 of the 2 paired runs trained on other chips (seed 0: X in {tmp_path / 'c'}, Y in {tmp_path / 'd'}), whose "
        "rounding alone moves photos: pair runs trained on one"
    ), crossed
    assert "chips" not in compare.compare_studies(a, study("e", {0: "X"}))[1]  # a run that does not say


def test_a_summary_of_fewer_seeds_than_its_study_holds_is_not_read(tmp_path):
    """A study grown to seeds 0, 1, 2 whose cv.json still speaks for 0 and 1 (its growth cut short): --compare pairs its
    runs' results, all three seeds, rather than the stale summary."""

    def answers(seeds):
        return {f"s{seed}/x/{i}": bool((i + seed) % 2) for seed in seeds for i in range(4)}

    b = fake_study(tmp_path / "b", "pool", answers((0, 1, 2)), seeds=(0, 1, 2))
    a = fake_study(tmp_path / "a", "pool", answers((0, 1)), seeds=(0, 1, 2))
    (a / "cv.json").write_text(json.dumps({"photos": answers((0, 1)), "study": {"seeds": [0, 1]}}))
    for seed in (0, 1, 2):
        predictions = [{"photo": f"x/{i}", "right": bool((i + seed) % 2)} for i in range(4)]
        (a / f"seed-{seed}.json").write_text(json.dumps({"seed": seed, "fold": 0, "predictions": predictions}))
    result, line = compare.compare_studies(a, b)
    assert result["n"] == 12 and "which both" not in line and "finished" not in line, line


def test_compare_refuses_studies_scored_differently_and_names_the_settings_that_differ(tmp_path, capsys):
    answers = {"s0/x/1": True, "s0/x/2": False}
    cv5 = fake_study(tmp_path / "cv5", "cv", answers, folds=5, seeds=(0,))
    cv3 = fake_study(tmp_path / "cv3", "cv", answers, folds=3, seeds=(0,))
    on_pool = fake_study(tmp_path / "pool", "pool", answers, seeds=(0,))
    longer = fake_study(tmp_path / "longer", "cv", answers, folds=5, seeds=(0,), settings={"train": {"epochs": 150}})
    other_pool = fake_study(tmp_path / "other-pool", "pool", answers, seeds=(0,))
    (other_pool / "study.json").write_text(
        json.dumps({**json.loads((other_pool / "study.json").read_text()), "validation": "w"})
    )
    for a, b, message in (
        (cv5, cv3, "is 5-fold CV, seeds [0] and"),
        (cv5, on_pool, "on validation pool v"),
        (on_pool, other_pool, "is a study on validation pool v, seeds [0] and"),
    ):
        with pytest.raises(StudyError, match=re.escape(message)):
            compare.compare_studies(a, b)
        assert main(["cv", "--compare", str(a), str(b)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "compare studies of the same data, folds" in err
    line = compare.compare_studies(cv5, longer)[1]
    assert line.endswith("changes train.epochs 10 -> 150"), line  # settings {} are the default recipe's


def test_bench_pool_records_a_components_worth_as_the_rule_reads_it(tmp_path, monkeypatch):
    """bench/accuracy/pool.py: the row of a study without a component keeps B - A (as every studies.csv row does)
    and says the component is worth A - B; --record appends it to studies.csv and keeps both studies' results."""
    from bench.accuracy import pool as bench_pool

    with_it = [True, True, True, False, True, True, True, False]
    without = [True, False, True, False, False, True, True, True]
    studies = []
    for name, answers in (("base", with_it), ("no-x", without)):
        folder = fake_study(tmp_path / name, "pool", {f"s{s}/x/{i}": r for s in (0, 1) for i, r in enumerate(answers)})
        found = json.loads((folder / "cv.json").read_text())
        found.update(accuracy=sum(answers) / len(answers), standard_error=0.1, n=len(answers))
        (folder / "cv.json").write_text(json.dumps(found))
        (folder / "cv.md").write_text("a study")
        studies.append(folder)
    row = bench_pool.row(*studies, "x", "--x 0", removes=True)
    assert row["difference"] == "-0.1250" and (row["only_b"], row["only_a"]) == (
        2,
        4,
    )  # answers: a photo under each seed
    assert row["reason"].startswith("the component is worth +0.125 (") and row["overrides"] == "--x 0"
    assert row["reason"].endswith("; seeds 0 / 1 alone: +0.125 / +0.125")  # each seed gave the same answers
    assert compare.seeds_alone({0: 0.5, 1: -0.25}, sign=-1.0) == "; seeds 0 / 1 alone: -0.500 / +0.250"
    assert compare.seeds_alone({3: 0.5}) == ""
    results = tmp_path / "results"
    monkeypatch.setattr(bench_pool, "RESULTS", results)
    assert (
        bench_pool.main([str(studies[0]), str(studies[1]), "--idea", "x", "--removes", "--record", "--adopted", "kept"])
        == 0
    )
    rows = list(csv.DictReader((results / "studies.csv").open()))
    assert [(r["table"], r["idea"], r["adopted"], r["difference"]) for r in rows] == [("pool", "x", "kept", "-0.1250")]
    assert sorted(p.name for p in (results / "cv").iterdir()) == ["base", "no-x"]
    top = bench_pool.headline(studies[0])  # the default's own pool figure, as the README's table reads it
    assert (top["key"], top["value"], top["metric"]) == ("vit-pool", "0.750", "validation pool accuracy, 2 seeds")
    # the settings a row names are the settings the study changes, whatever else the comparison's line says (here,
    # that its runs trained on other chips)
    for folder, chip, lr in ((studies[0], "X", 0.001), (studies[1], "Y", 0.002)):
        identity = json.loads((folder / "study.json").read_text())
        (folder / "study.json").write_text(json.dumps({**identity, "settings": {"optim": {"lr": lr}}}))
        found = json.loads((folder / "cv.json").read_text())
        found["folds"] = [{"seed": seed, "fold": 0, "processor": chip} for seed in (0, 1)]
        (folder / "cv.json").write_text(json.dumps(found))
    assert "other chips" in compare.compare_studies(*studies)[1]
    assert bench_pool.row(*studies, "lr", "", removes=False)["overrides"] == "optim.lr 0.001 -> 0.002"
    grown = json.loads((studies[1] / "study.json").read_text())  # a row pairs studies of the same seeds
    (studies[1] / "study.json").write_text(json.dumps({**grown, "seeds": [0, 1, 2]}))
    with pytest.raises(SystemExit, match="a row pairs studies of the same seeds"):
        bench_pool.row(*studies, "lr", "", removes=False)


def test_shared_photos_are_those_of_the_same_bytes_whatever_their_size_and_tail_share(tmp_path):
    from foodvit.data.validation import TAIL, shared_photos

    tail = bytes(range(256)) * (TAIL // 256 + 1)
    files = {
        "ours.jpg": b"head one" + tail,
        "copy.jpg": b"head one" + tail,  # the same bytes
        "other.jpg": b"head two" + tail,  # the same size and last bytes, another head: read whole to tell
        "short.jpg": b"head" + tail,  # another size: never read
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    ours = [tmp_path / "ours.jpg", tmp_path / "other.jpg", tmp_path / "short.jpg"]
    assert shared_photos(ours, [tmp_path / "copy.jpg"]) == {tmp_path / "ours.jpg"}
    assert shared_photos(ours, [tmp_path / "missing.jpg"]) == set()
