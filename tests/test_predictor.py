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
        assert answer["label"] == CLASSES[int(expected.argmax())] and answer["top_k"][0] == [answer["label"], answer["probability"]]
        assert len(answer["top_k"]) == 2 and answer["top_k"][0][1] >= answer["top_k"][1][1] and answer["seconds"] > 0


def test_classify_many_is_one_batch_with_the_same_answers_and_keeps_going_past_bad_photos(predictor):
    photos = [_jpeg(0), b"not an image", _jpeg(1), b""]
    answers = predictor.classify_many(photos, names=["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    assert "b.jpg is not an image Pillow can read" in answers[1]["error"] and "d.jpg is empty (0 bytes)" in answers[3]["error"]
    for i in (0, 2):
        alone = predictor.classify(photos[i])
        assert answers[i]["label"] == alone["label"]
        np.testing.assert_allclose(list(answers[i]["probabilities"].values()), list(alone["probabilities"].values()), atol=1e-6)


@pytest.mark.parametrize("data,message", [
    (b"", r"is empty \(0 bytes\); expected a JPEG, PNG"),
    (b"GIF89a but not really", "is not an image Pillow can read"),
    (b"%PDF-1.7 hello", "is not an image Pillow can read; expected a JPEG, PNG"),
    (_jpeg(size=(300, 200))[:400], "damaged or truncated.*expected a complete image file"),  # cut in the header
    (_jpeg(size=(300, 200))[:5000], "is damaged or truncated.*expected a complete image file"),  # cut in the pixels
])
def test_bad_bytes_are_refused_with_what_is_accepted(data, message):
    with pytest.raises(PhotoError, match=message) as caught:
        decode(data, "upload.jpg")
    assert str(caught.value).startswith("upload.jpg ")


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow warns, then foodvit refuses
def test_a_decompression_bomb_in_bytes_is_refused_from_its_header():
    buffer = io.BytesIO()
    Image.new("1", (10_000, 9_000)).save(buffer, format="PNG")  # 90 megapixels in a few kilobytes
    assert len(buffer.getvalue()) < 200_000 and 10_000 * 9_000 > MAX_PIXELS
    with pytest.raises(PhotoError, match="90 megapixels, over the limit of 89"):
        decode(buffer.getvalue(), "bomb.png")


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
