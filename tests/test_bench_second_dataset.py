"""bench/accuracy/second_dataset.py's table: each class's accuracy of the ViT and the ResNet-18 over the seeds and
their paired difference, the figures the Results page and the README show for the second data set."""

import json

import pytest
from bench.accuracy.second_dataset import table

# two seeds, two classes of two photos: True where the model got the photo right under that seed
VIT = {"ramen/a": (True, True), "ramen/b": (True, False), "ice_cream/c": (False, False), "ice_cream/d": (True, True)}
CNN = {"ramen/a": (False, False), "ramen/b": (True, False), "ice_cream/c": (True, False), "ice_cream/d": (False, False)}


def study(folder, answers):
    folder.mkdir(parents=True)
    photos = {f"s{seed}/{photo}": right[seed] for photo, right in answers.items() for seed in (0, 1)}
    (folder / "cv.json").write_text(json.dumps({"photos": photos}))


def test_each_class_and_all_photos_are_paired_with_the_photo_as_the_unit(tmp_path):
    study(tmp_path / "vit", VIT)
    study(tmp_path / "cnn", CNN)
    rows, text = table(tmp_path)
    by_class = {row["class"]: row for row in rows}
    assert list(by_class) == ["ice_cream", "ramen", "all"]
    ramen, ice, everything = by_class["ramen"], by_class["ice_cream"], by_class["all"]
    assert (ramen["vit"], ramen["cnn"], ramen["difference"]) == (0.75, 0.25, 0.5)
    assert (ramen["only_vit"], ramen["only_cnn"], ramen["photos"]) == (2, 0, 2)
    assert ramen["difference_se"] == pytest.approx(0.5)  # its photos' differences over the seeds: 1 and 0
    assert (ice["vit"], ice["cnn"], ice["difference"]) == (0.5, 0.25, 0.25)
    assert (ice["only_vit"], ice["only_cnn"]) == (2, 1)
    assert (everything["vit"], everything["cnn"], everything["difference"]) == (0.625, 0.25, 0.375)
    assert (everything["only_vit"], everything["only_cnn"], everything["photos"]) == (4, 1, 4)
    # each photo's differences averaged over its seeds (1, 0, -0.5, 1), then the standard error over the 4 photos
    assert everything["difference_se"] == pytest.approx(0.375)
    assert "| all | 0.625 | 0.250 | +0.375 +- 0.375 |" in text.splitlines()
