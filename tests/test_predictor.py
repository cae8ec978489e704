"""The Predictor (one way from a photo to probabilities) and photo decoding from bytes."""

import io

import numpy as np
import pytest
import torch
from helpers import randomize_
from PIL import Image

import foodvit
from foodvit.data.photos import MAX_PIXELS, PhotoError, decode
from foodvit.data.preprocess import make_preprocess
from foodvit.data.transforms import eval_transform
from foodvit.errors import InputError

CLASSES = ["pizza", "steak", "sushi"]


@pytest.fixture(scope="module")
def predictor():
    torch.manual_seed(0)
    model = randomize_(foodvit.create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2)).eval()
    return foodvit.Predictor(model, CLASSES, make_preprocess(32, (0.5,) * 3, (0.5,) * 3))


def _jpeg(seed=0, size=(48, 40)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_classify_equals_the_models_own_softmax_for_bytes_paths_and_images(predictor, tmp_path):
    data = _jpeg()
    (tmp_path / "a.jpg").write_bytes(data)
    photo = Image.open(io.BytesIO(data)).convert("RGB")
    with torch.no_grad():
        expected = predictor.model(eval_transform(predictor.preprocess)(photo)[None]).softmax(-1)[0].double().numpy()
    for source in (data, tmp_path / "a.jpg", photo):
        answer = predictor.classify(source, top_k=2)
        np.testing.assert_allclose(list(answer["probabilities"].values()), expected, atol=1e-6)
        assert list(answer["probabilities"]) == CLASSES
        assert answer["label"] == CLASSES[int(expected.argmax())] and answer["top_k"][0] == [
            answer["label"],
            answer["probability"],
        ]
        assert len(answer["top_k"]) == 2 and answer["top_k"][0][1] >= answer["top_k"][1][1] and answer["seconds"] > 0


def test_classify_many_is_one_batch_with_the_same_answers_and_keeps_going_past_bad_photos(predictor):
    photos = [_jpeg(0), b"not an image", _jpeg(1), b""]
    answers = predictor.classify_many(photos, names=["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    assert (
        "b.jpg is not an image Pillow can read" in answers[1]["error"]
        and "d.jpg is empty (0 bytes)" in answers[3]["error"]
    )
    for i in (0, 2):
        alone = predictor.classify(photos[i])
        assert answers[i]["label"] == alone["label"]
        np.testing.assert_allclose(
            list(answers[i]["probabilities"].values()), list(alone["probabilities"].values()), atol=1e-6
        )


def test_classify_many_refuses_names_that_do_not_match_the_photos(predictor, tmp_path):
    # one name per photo, not a shorter list silently dropping photos (zip's own ValueError, now one that says so)
    with pytest.raises(InputError, match=r"got 2 photos and 1 names; give a name a photo"):
        predictor.classify_many([_jpeg(0), _jpeg(1)], names=["a.jpg"])
    # one path given: an answer for each of its characters, "photo 1 does not exist" ...
    with pytest.raises(InputError, match=r"takes a list of photos, got one .*; use classify for one photo"):
        predictor.classify_many(str(tmp_path / "a.jpg"))
    answers = predictor.classify_many(photo for photo in [_jpeg(0), _jpeg(1)])  # a generator: no len() of its own
    assert [a["label"] for a in answers] == [predictor.classify(_jpeg(i))["label"] for i in (0, 1)]


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", r"is empty \(0 bytes\); expected a JPEG, PNG"),
        (b"GIF89a but not really", "is not an image Pillow can read"),
        (b"%PDF-1.7 hello", "is not an image Pillow can read; expected a JPEG, PNG"),
        (_jpeg(size=(300, 200))[:400], "damaged or truncated.*expected a complete image file"),  # cut in the header
        (_jpeg(size=(300, 200))[:5000], "is damaged or truncated.*expected a complete image file"),  # cut in the pixels
    ],
)
def test_bad_bytes_are_refused_with_what_is_accepted(data, message):
    with pytest.raises(PhotoError, match=message) as caught:
        decode(data, "upload.jpg")
    assert str(caught.value).startswith("upload.jpg ")


def test_a_missing_file_a_folder_and_an_empty_image_are_refused_as_what_they_are(predictor, tmp_path):
    # "cannot be read as an image, damaged or truncated? (FileNotFoundError ...)"; a ZeroDivisionError for 0 x 0
    with pytest.raises(PhotoError, match=r"missing\.jpg does not exist$"):
        predictor.classify(str(tmp_path / "missing.jpg"))
    with pytest.raises(PhotoError, match=r"is a folder, not a photo file$"):
        predictor.classify(tmp_path)
    with pytest.raises(PhotoError, match=r"has no pixels \(0 x 0\)"):
        predictor.classify(Image.new("RGB", (0, 0)))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow warns, then foodvit refuses
def test_a_decompression_bomb_in_bytes_is_refused_from_its_header():
    buffer = io.BytesIO()
    Image.new("1", (10_000, 9_000)).save(buffer, format="PNG")  # 90 megapixels in a few kilobytes
    assert len(buffer.getvalue()) < 200_000 and 10_000 * 9_000 > MAX_PIXELS
    with pytest.raises(PhotoError, match="90 megapixels, over the limit of 50"):
        decode(buffer.getvalue(), "bomb.png")


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_bomb_is_refused_with_one_limit_in_megapixels_and_what_to_do(tmp_path):
    buffer = io.BytesIO()
    Image.new("1", (20_000, 10_000)).save(
        buffer, format="PNG"
    )  # over twice the limit: Pillow itself refuses it at open
    (tmp_path / "bomb.png").write_bytes(buffer.getvalue())
    for source in (buffer.getvalue(), tmp_path / "bomb.png"):
        with pytest.raises(
            PhotoError, match=r"is 200 megapixels, over the limit of 50 megapixels .*resize it below the limit"
        ) as caught:
            decode(source, "bomb.png")
        assert (
            "178956970" not in str(caught.value)
            and "exceeds" not in str(caught.value)
            and caught.value.kind == "too large"
        )
    small = io.BytesIO()
    Image.new("1", (3_000, 2_000)).save(small, format="PNG")
    with pytest.raises(PhotoError, match=r"is 3000 x 2000 = 6 megapixels, over the limit of 5 megapixels"):
        decode(small.getvalue(), "big.png", max_pixels=5_000_000)  # a server's lower limit, in the same words


def test_an_empty_file_is_called_empty_as_bytes_and_as_a_path(tmp_path, capsys):
    (tmp_path / "empty.jpg").write_bytes(b"")
    for source in (b"", tmp_path / "empty.jpg"):
        with pytest.raises(PhotoError, match=r"is empty \(0 bytes\); expected a JPEG, PNG") as caught:
            decode(source, "empty.jpg")
        assert caught.value.kind == "empty"


def test_predict_on_an_empty_photo_says_empty_through_the_cli(tmp_path, predictor, capsys):
    from foodvit.cli.main import main
    from foodvit.rundir.trained import save_model

    save_model(tmp_path, predictor.model, CLASSES, predictor.preprocess)
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert main(["predict", str(tmp_path), str(tmp_path / "empty.jpg")]) == 1
    assert f"{tmp_path / 'empty.jpg'} is empty (0 bytes)" in capsys.readouterr().err


def _large_photo(size, fmt):
    """A smooth photo (a gradient with a few shapes, as photos are) saved as `fmt`, upscaled from small."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(small).resize(size, Image.Resampling.BICUBIC).save(buffer, format=fmt, quality=95)
    return buffer.getvalue()


@pytest.mark.slow  # a very large photo decoded twice; the fast tier keeps the predictor's other photos and sizes
def test_a_photo_far_larger_than_the_model_needs_is_decoded_reduced_to_the_same_input(predictor):
    from foodvit.data.photos import REDUCE_FLOOR, reduction
    from foodvit.data.preprocess import to_array

    p = predictor.preprocess
    assert reduction((1200, 1000), p.resize_size) == 1  # a normal photo: decoded whole, as before
    normal = _jpeg(size=(1200, 1000))
    np.testing.assert_array_equal(predictor.prepare(normal), to_array(p, Image.open(io.BytesIO(normal)).convert("RGB")))
    for fmt in ("JPEG", "PNG"):
        data = _large_photo((4 * REDUCE_FLOOR + 100, 2 * REDUCE_FLOOR + 50), fmt)
        whole = to_array(p, Image.open(io.BytesIO(data)).convert("RGB"))
        assert decode(data, reduce_to=p.resize_size).size[1] < 2 * REDUCE_FLOOR  # reduced...
        assert (
            np.abs(predictor.prepare(data) - whole).max() <= 2 / 255 + 1e-6
        )  # ...and no pixel of the model's input off by more than one level
        np.testing.assert_allclose(
            predictor.probabilities(predictor.prepare(data)[None]), predictor.probabilities(whole[None]), atol=5e-3
        )


def test_decode_budget_keeps_concurrent_reservations_within_its_bytes():
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from foodvit.data.photos import DecodeBudget

    budget, peak, lock = DecodeBudget(100), [0], threading.Lock()

    def hold(n):
        with budget.reserve(n):
            with lock:
                peak[0] = max(peak[0], budget.used)
            time.sleep(0.01)
        return n

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sum(pool.map(hold, [40] * 8 + [500])) == 820  # each is let through, the largest alone
    assert 40 <= peak[0] <= 100 and budget.used == 0


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_is_given_back_after_a_large_decode():
    from foodvit.data.photos import release_memory

    assert release_memory() is True


def test_modes_are_converted_and_other_types_refused():
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    assert decode(rgba).getpixel((1, 1)) == (255, 255, 255)  # transparent laid over white
    with pytest.raises(PhotoError, match="is a int; expected a PIL image, the bytes of an image file or a path"):
        decode(3)


def test_a_run_with_mismatched_files_is_refused_at_load(tmp_path, predictor):
    from foodvit.rundir.trained import save_model

    save_model(tmp_path, predictor.model, CLASSES, predictor.preprocess)
    assert foodvit.load_predictor(tmp_path).classes == CLASSES
    card = (tmp_path / "model.json").read_text().replace('"sushi"', '"sushi", "ramen"')
    (tmp_path / "model.json").write_text(card)
    with pytest.raises(foodvit.FoodVitError, match="4 class names for a model with 3 outputs"):
        foodvit.load_predictor(tmp_path)
    (tmp_path / "model.json").write_text("{")
    with pytest.raises(foodvit.FoodVitError, match="model.json is not readable JSON"):
        foodvit.load_predictor(tmp_path)


def test_preprocessing_takes_numbers_of_any_kind_and_keeps_them_as_pythons():
    """numpy's numbers, which a library caller may pass, were refused by the model card's checks."""
    import json

    import numpy as np

    from foodvit.data.preprocess import Preprocess, make_preprocess

    mean = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    made = make_preprocess(np.int64(32), mean, mean)
    assert made == make_preprocess(32, (0.5, 0.25, 0.125), (0.5, 0.25, 0.125))
    assert type(made.image_size) is int and all(type(v) is float for v in made.mean + made.std)
    assert Preprocess.from_dict(json.loads(made.to_json())) == made


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("classes", 5, "its classes must be a list of distinct names, got 5"),
        ("classes", "abc", 'its classes must be a list of distinct names, got "abc"'),
        ("classes", ["pizza", "pizza", "sushi"], "its classes must be a list of distinct names"),
        ("preprocess", "x", "the preprocessing must be an object with image_size, resize_size, mean and std"),
        ("preprocess", {"image_size": -5}, "the preprocessing must be an object with image_size"),
        (
            "preprocess.mean",
            ["a", "b", "c"],
            r"mean must be a number a channel \(3, or 1 for all\), got \['a', 'b', 'c'\]",
        ),
        ("preprocess.mean", [0.5, 0.5], r"preprocessing's mean must be a number a channel \(3, or 1 for all\)"),
        ("preprocess.std", [0, 0, 0], "preprocessing's std must be above 0 for every channel"),
        ("preprocess.resize_size", 10**7, "preprocessing's resize_size must be a whole number from 1 to 4096"),
        ("model.image_size", 100000, "a model setting is out of its range"),
        ("model.depth", 7, r"model.safetensors does not hold the model model.json describes"),
        # read by serve's page, export-space and export-web alone: tracebacks there, where predict took the card
        ("metrics", "oops", 'its metrics must be an object, got "oops"'),
        ("metrics", {"test_acc": "high"}, 'its metrics.test_acc must be a share, got "high"'),
        ("metrics", {"test_acc": 0.5, "test_n": "many"}, 'its metrics.test_n must be a count, got "many"'),
        ("metrics", {"recipe": ["x"]}, r'its metrics.recipe must be text, got \["x"\]'),
        ("model", "y", 'its model must be an object, got "y"'),
        # the photos were blamed: "expected 32 x 32 images, got 16 x 16; resize them"
        ("preprocess.image_size", 16, "its preprocessing gives 16 px photos to a model of 32 px"),
    ],
)
def test_a_damaged_model_card_is_named_with_its_field_at_load(tmp_path, predictor, field, value, said):
    """A hand-edited or damaged model.json gave a TypeError or KeyError, NaN probabilities (std 0), labels made of a
    string's letters, a process killed for memory (a resize to 10^7 px), or a message meant for Python callers."""
    import json

    from foodvit.rundir.trained import save_model

    save_model(tmp_path, predictor.model, CLASSES, predictor.preprocess)
    card = json.loads((tmp_path / "model.json").read_text())
    *parents, last = field.split(".")
    holder = card
    for key in parents:
        holder = holder[key]
    holder[last] = value
    (tmp_path / "model.json").write_text(json.dumps(card))
    with pytest.raises(foodvit.FoodVitError, match=rf"model\.json is damaged: {said}|{said}") as refused:
        foodvit.load_predictor(tmp_path)
    assert "\n" not in str(refused.value) and "restore" in str(refused.value)


def test_a_model_file_with_nan_weights_is_refused_at_load(tmp_path, predictor):
    # it answered "pizza (nan)" for every photo, NaN in --json, and an accuracy of the first class's share
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from foodvit.rundir.trained import save_model

    save_model(tmp_path, predictor.model, CLASSES, predictor.preprocess)
    state = load_file(tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as opened:
        metadata = opened.metadata()  # kept as written
    state["head.weight"][0, 0] = float("nan")
    save_file(state, tmp_path / "model.safetensors", metadata=metadata)
    with pytest.raises(foodvit.FoodVitError, match=r"model\.safetensors is damaged: 1 of its tensors hold NaN"):
        foodvit.load_predictor(tmp_path)
