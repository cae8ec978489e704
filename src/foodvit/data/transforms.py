"""Training augmentation presets (what a recipe adds) and batch mixing, on torchvision's transforms
v2. Inputs are PIL images or uint8 tensors (the decode cache). What the model expects of a photo
at evaluation lives in preprocess.py."""

from __future__ import annotations

import torch
from torchvision.transforms import InterpolationMode, v2

from foodvit.data.preprocess import Preprocess, crop_view, to_array
from foodvit.errors import ConfigError
from foodvit.settings.run import AUGMENT_PRESETS as PRESETS

_INTERPOLATION = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def _to_float(p: Preprocess) -> list:
    """PIL image or uint8 tensor -> normalised float tensor."""
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(p.mean, p.std)]


def _resize_ops(p: Preprocess) -> list:
    """The evaluation resize (and crop) as torchvision ops, for PIL photos and uint8 tensors alike."""
    interp = _INTERPOLATION[p.interpolation]
    if p.mode == "square":
        return [v2.Resize((p.image_size, p.image_size), interpolation=interp, antialias=True)]
    return [v2.Resize(p.resize_size, interpolation=interp, antialias=True), v2.CenterCrop(p.image_size)]


def train_transform(
    p: Preprocess, preset: str = "none", scale_min: float = 0.25, random_erasing: float = 0.0
) -> v2.Compose:
    """The training transform of an augmentation preset.

    none:   the eval transform (the course trained without augmentation).
    flip:   the eval transform and horizontal flips.
    light:  random resized crop (area scale_min..1) and flips.
    medium: light, then TrivialAugment (Mueller & Hutter 2021), one random op a photo.
    strong: light, then RandAugment with 2 ops at magnitude 9 (Cubuk et al. 2020; DeiT's rand-m9).
    Random erasing (a share of photos) comes after normalisation in every preset.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown augmentation preset {preset!r}; expected one of {', '.join(PRESETS)}")
    interp = _INTERPOLATION[p.interpolation]
    if preset in ("none", "flip"):
        ops = _resize_ops(p)
        if preset == "flip":
            ops.append(v2.RandomHorizontalFlip())
    else:
        ops = [
            v2.RandomResizedCrop(p.image_size, scale=(scale_min, 1.0), interpolation=interp, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
        if preset == "medium":
            ops.append(v2.TrivialAugmentWide(interpolation=interp))
        elif preset == "strong":
            ops.append(v2.RandAugment(num_ops=2, magnitude=9, interpolation=interp))
    ops += _to_float(p)
    if random_erasing > 0:
        ops.append(v2.RandomErasing(p=random_erasing, value=0))
    return v2.Compose(ops)


def batch_mixer(num_classes: int, mixup: float = 0.0, cutmix: float = 0.0, prob: float = 1.0) -> BatchMixer | None:
    """Mixup and/or CutMix on whole batches (one of the two, chosen at random, when both are on).

    Returns a callable (images, labels) -> (images, soft labels (B, K) summing to 1), or None.
    """
    ops = []
    if mixup > 0:
        ops.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
    if cutmix > 0:
        ops.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
    if not ops:
        return None
    return BatchMixer(ops[0] if len(ops) == 1 else v2.RandomChoice(ops), num_classes, prob)


class BatchMixer:
    """Applies `mix` to a batch with probability `prob`, else returns one-hot labels. A class, not a
    closure, so that loader workers started by spawn or forkserver can receive it."""

    def __init__(self, mix, num_classes: int, prob: float = 1.0) -> None:
        self.mix, self.num_classes, self.prob = mix, num_classes, prob

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        if self.prob < 1.0 and torch.rand(()) >= self.prob:
            return images, torch.nn.functional.one_hot(labels, self.num_classes).float()
        return self.mix(images, labels)


# ------------------------------------------------------------------ evaluation, as tensors


class EvalTransform:
    """The deterministic evaluation preprocessing, PIL photo -> float tensor (3, S, S). A class so
    that loader workers started by spawn can receive it."""

    def __init__(self, p: Preprocess) -> None:
        self.preprocess = p

    def __call__(self, photo):
        return torch.from_numpy(to_array(self.preprocess, photo))


def eval_transform(p: Preprocess) -> EvalTransform:
    return EvalTransform(p)


def model_view(p: Preprocess, photo):
    """What the model sees of a photo, before scaling and normalisation: uint8 tensor (3, S, S)."""
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(np.asarray(crop_view(p, photo), dtype=np.uint8).transpose(2, 0, 1)))
