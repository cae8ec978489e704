"""bench/speed/versus_commit.py's verdict on two runs' metrics.csv: the check that a speed change learns the same."""

import csv

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


def test_a_training_or_test_value_that_moved_is_the_largest_difference(tmp_path):
    each = write(tmp_path / "each.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0), (2, 1.1, 1.0, 0.6, 5e-4, 8.0)])
    trained = write(tmp_path / "trained.csv", [(1, 1.5, "", "", 1e-3, 9.0), (2, 1.25, 1.0, 0.6, 5e-4, 8.0)])
    tested = write(tmp_path / "tested.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0), (2, 1.1, 1.0, 0.64, 5e-4, 8.0)])
    assert metrics_difference(each, trained) == "largest difference 0.15 (train_loss at epoch 2)"
    assert metrics_difference(each, tested).startswith("largest difference 0.04 (test_acc at epoch 2)")
    short = write(tmp_path / "short.csv", [(1, 1.5, 1.2, 0.4, 1e-3, 9.0)])
    assert metrics_difference(each, short) == "2 epochs against 1"
