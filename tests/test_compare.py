"""tuning/compare.py: paired differences between two studies with the photo as the unit of the standard error."""

import math
import statistics

import pytest

from foodvit.errors import StudyError
from foodvit.tuning import compare


def predictions(rights: list[bool], seeds: list[int]) -> dict[str, bool]:
    """The same answers on every photo under each seed, keyed as a study keys them."""
    return {compare.prediction_key(seed, f"pizza/{i}.jpg"): right for seed in seeds for i, right in enumerate(rights)}


A = [True, False, True, True, False, True, False, True, True, False]
B = [True, True, False, True, True, True, False, True, True, True]


def test_the_same_photos_under_a_second_seed_do_not_shrink_the_standard_error():
    one = compare.paired(predictions(A, [0]), predictions(B, [0]))
    two = compare.paired(predictions(A, [0, 1]), predictions(B, [0, 1]))
    diffs = [int(b) - int(a) for a, b in zip(A, B, strict=True)]
    assert one["standard_error"] == pytest.approx(statistics.stdev(diffs) / math.sqrt(len(diffs)))
    assert two["difference"] == one["difference"] == pytest.approx(0.2)
    assert two["standard_error"] == pytest.approx(one["standard_error"])
    assert (two["n"], two["photos"], one["n"], one["photos"]) == (20, 10, 10, 10)
    # what counting every prediction as independent would have said: smaller by about sqrt(2)
    naive = statistics.stdev(diffs * 2) / math.sqrt(2 * len(diffs))
    assert naive < 0.75 * two["standard_error"]


def test_seeds_that_disagree_are_averaged_per_photo_before_the_standard_error():
    a = {"s0/x": False, "s1/x": False, "s0/y": True, "s1/y": True, "s0/z": False, "s1/z": True}
    b = {"s0/x": True, "s1/x": False, "s0/y": True, "s1/y": True, "s0/z": True, "s1/z": True}
    result = compare.paired(a, b)
    per_photo = [0.5, 0.0, 0.5]
    assert result["difference"] == pytest.approx(2 / 6)
    assert result["standard_error"] == pytest.approx(statistics.stdev(per_photo) / math.sqrt(3))
    assert result["only_b"] == ["s0/x", "s0/z"] and result["only_a"] == []


def test_the_line_names_the_photos_as_the_unit_and_other_photos_are_refused():
    result = compare.paired(predictions(A, [0, 1]), predictions(B, [0, 1]))
    line = compare.compare_line(result, "a", "b")
    assert line.startswith("b - a = +0.200 +- ") and "over 10 photos (20 predictions" in line
    assert "6 right only in b, 2 only in a" in line
    with pytest.raises(StudyError, match="do not hold the same photos"):
        compare.paired(predictions(A, [0]), predictions(A, [1]))


def test_a_study_names_its_recipe_and_the_settings_it_changed_from_its_own_files(tmp_path):
    """The data-efficiency curve groups studies by this name, read from the study's files, never inferred."""
    import json

    from foodvit.recipes import load_recipe

    def study(name: str, settings: dict, recipe: str = "default"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "cv.json").write_text(json.dumps({"recipe": recipe, "photos": {}}))
        (folder / "study.json").write_text(json.dumps({"settings": settings}))
        return folder

    default = load_recipe("default").to_dict()
    share = {
        **default,
        "data": {**default["data"], "train_fraction": 0.4},
    }  # a curve's point: the share is not a change
    unmasked = {**default, "masked": {**default["masked"], "weight": 0.0}}
    older = json.loads(json.dumps(default))
    del older["masked"]  # a study stored before a setting existed counts it at its default (off)
    old_layout = {**older, "optim": {**default["optim"], "masked": 0.0}}  # the objectives' settings in optim
    assert compare.study_recipe(study("a", default)) == "default"
    assert compare.study_recipe(study("b", share)) == "default"
    assert compare.study_recipe(study("c", unmasked)) == "default (masked.weight=0.0)"
    assert compare.study_recipe(study("d", older)) == "default (masked.weight=0.0)"
    assert compare.study_recipe(study("f", old_layout)) == "default (masked.weight=0.0)"
    assert compare.study_recipe(study("e", default, recipe="gone.toml")) == "gone.toml"
