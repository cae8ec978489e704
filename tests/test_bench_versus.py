"""bench/speed/versus_commit.py's verdict on two runs' metrics.csv: the check that a speed change learns the same."""

import csv

import pytest
from bench.speed.versus_commit import metrics_difference

COLUMNS = ["epoch", "train_loss", "test_loss", "test_acc", "lr", "seconds"]


def write(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(dict(zip(COLUMNS, row, strict=True)) for row in rows)
    return path


def test_runs_that_differ_only_in_time_or_in_how_often_they_test_are_identical(tmp_path):
    each = write(tmp_path / "each.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0), (2, 1.1, 1.0, 0.6, 5e-4, 8.0)])
    slower = write(tmp_path / "slower.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 12.0), (2, 1.1, 1.0, 0.6, 5e-4, 11.0)])
    fewer = write(tmp_path / "fewer.csv", [(1, 1.5, "", "", 1e-3, 8.0), (2, 1.1, 1.0, 0.6, 5e-4, 8.0)])
    assert metrics_difference(each, slower) == "identical"
    assert metrics_difference(each, fewer) == "identical (tested in 2 and 1 epochs)"
    never = write(tmp_path / "never.csv", [(1, 1.5, "", "", 1e-3, 8.0), (2, 1.1, "", "", 5e-4, 8.0)])
    assert metrics_difference(each, never) == "not both tested at the last epoch (tested in 2 and 0 epochs)"


def test_a_training_or_test_value_that_moved_is_the_largest_difference(tmp_path):
    each = write(tmp_path / "each.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0), (2, 1.1, 1.0, 0.6, 5e-4, 8.0)])
    trained = write(tmp_path / "trained.csv", [(1, 1.5, "", "", 1e-3, 9.0), (2, 1.25, 1.0, 0.6, 5e-4, 8.0)])
    tested = write(tmp_path / "tested.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0), (2, 1.1, 1.0, 0.64, 5e-4, 8.0)])
    assert metrics_difference(each, trained) == "largest difference 0.15 (train_loss at epoch 2)"
    assert metrics_difference(each, tested).startswith("largest difference 0.04 (test_acc at epoch 2)")
    short = write(tmp_path / "short.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0)])
    assert metrics_difference(each, short) == "2 epochs against 1"


def test_two_studies_are_identical_when_every_held_out_photo_has_the_same_probabilities(tmp_path):
    import json

    from bench.speed.versus_commit import study_difference

    def study(name, pizza, seeds=(42,)):
        folder = tmp_path / name
        folder.mkdir()
        lines = [
            {"seed": seed, "fold": fold, "photo": f"pizza/{fold}.jpg", "probabilities": {"pizza": p, "steak": 1 - p}}
            for seed in seeds
            for fold, p in enumerate(pizza)
        ]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return folder

    a, b, c = study("a", [0.9, 0.4]), study("b", [0.9, 0.4]), study("c", [0.9, 0.45])
    assert study_difference(a, b) == "identical"
    assert study_difference(a, c) == "1 of 2 photos differ, by up to 0.05"
    assert study_difference(a, study("d", [0.9])) == "2 held-out predictions against 1, not of the same photos"
    two, other = study("two", [0.9, 0.4], seeds=(42, 43)), study("other", [0.9, 0.4, 0.5], seeds=(42, 43))
    assert study_difference(two, other).startswith("4 held-out predictions against 6")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert study_difference(empty, empty) == "0 held-out predictions against 0, not of the same photos"


def test_keep_refuses_a_folder_that_exists_before_anything_runs(tmp_path, capsys, monkeypatch):
    from bench.speed import versus_commit

    monkeypatch.setattr(versus_commit, "checkout", lambda *a: pytest.fail("checked out before refusing --keep"))
    (tmp_path / "mine.txt").write_text("the user's own file")
    with pytest.raises(SystemExit) as refused:
        versus_commit.main(["--keep", str(tmp_path), "--no-record"])
    assert refused.value.code == 2 and "it exists; give a new folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "the user's own file"


@pytest.mark.parametrize("native", [True, False])
def test_a_rows_machine_says_whether_the_cpu_computes_bf16(monkeypatch, native):
    # two CPUs of one model name train at speeds 1.5 times apart when only one multiplies bf16: the row tells them apart
    from bench import results

    from foodvit.training import engine

    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: native)
    monkeypatch.setattr(results, "cpu_name", lambda: "AMD EPYC")
    monkeypatch.setattr(results.os, "sched_getaffinity", lambda pid: {0, 1})
    expected = "AMD EPYC with native bf16, 2 cores" if native else "AMD EPYC, 2 cores"
    assert results.machine() == expected
