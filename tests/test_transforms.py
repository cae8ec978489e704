"""Preprocessing and augmentation: shapes, ranges, equality with torchvision's weights transforms,
and the batch mixers."""

import pytest
import torch
from PIL import Image

from foodvit.data.preprocess import Preprocess, make_preprocess
from foodvit.data.transforms import batch_mixer, eval_transform, train_transform
from foodvit.settings.run import AUGMENT_PRESETS as PRESETS


def photo(w=120, h=90):
    g = torch.Generator().manual_seed(0)
    return Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy())


def test_crop_preprocessing_matches_torchvision_imagenet_weights():
    from torchvision.models import ViT_B_16_Weights

    ours = eval_transform(make_preprocess(224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "crop", 224 / 256))
    theirs = ViT_B_16_Weights.IMAGENET1K_V1.transforms()
    image = photo(400, 300)
    torch.testing.assert_close(ours(image), theirs(image), atol=1e-5, rtol=0)


def test_square_preprocessing_is_the_course_transform():
    from torchvision import transforms as T

    ours = eval_transform(Preprocess(224, 224, "square", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    course = T.Compose([T.Resize((224, 224)), T.ToTensor()])
    image = photo()
    torch.testing.assert_close(ours(image), course(image), atol=1e-6, rtol=0)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_gives_normalised_images_of_the_model_size(preset):
    p = make_preprocess(64, (0.5,) * 3, (0.5,) * 3)
    transform = train_transform(p, preset, random_erasing=0.5)
    torch.manual_seed(0)
    for source in (photo(), torch.randint(0, 256, (3, 70, 90), dtype=torch.uint8)):
        out = transform(source)
        assert out.shape == (3, 64, 64) and out.dtype == torch.float32
        assert out.min() >= -1.0 - 1e-6 and out.max() <= 1.0 + 1e-6  # (x - 0.5) / 0.5 of [0, 1]


def test_augmentation_is_random_and_seeded():
    transform = train_transform(make_preprocess(32, (0.5,) * 3, (0.5,) * 3), "strong")
    image = photo()
    torch.manual_seed(1)
    a = transform(image)
    torch.manual_seed(1)
    b = transform(image)
    c = transform(image)
    assert torch.equal(a, b) and not torch.equal(b, c)


@pytest.mark.parametrize("mixup,cutmix", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixed_labels_sum_to_one(mixup, cutmix):
    mix = batch_mixer(3, mixup, cutmix)
    torch.manual_seed(0)
    images, labels = torch.rand(8, 3, 16, 16), torch.randint(0, 3, (8,))
    mixed, soft = mix(images, labels)
    assert mixed.shape == images.shape and soft.shape == (8, 3)
    torch.testing.assert_close(soft.sum(1), torch.ones(8))
    assert (soft >= 0).all() and (soft.max(1).values < 1).any()  # some labels really are mixed


def test_mixing_switched_off_or_skipped():
    assert batch_mixer(3) is None
    mix = batch_mixer(3, mixup=0.8, prob=0.0)
    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    same, soft = mix(images, labels)
    assert torch.equal(same, images) and torch.equal(soft, torch.eye(3)[labels])


def test_bad_preprocessing_is_refused():
    with pytest.raises(ValueError, match="smaller than the crop"):
        Preprocess(224, 200, "crop")
    with pytest.raises(ValueError, match="unknown augmentation preset 'wild'"):
        train_transform(make_preprocess(32, (0.5,) * 3, (0.5,) * 3), "wild")
