"""Preprocessing (what the model expects) and augmentation presets (what a recipe adds),
on torchvision's transforms v2. Inputs are PIL images or uint8 tensors (the decode cache)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2

_INTERPOLATION = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


@dataclass(frozen=True)
class Preprocess:
    """How a photo becomes the model's input; stored with every trained run and weights file.

    mode 'crop': resize the shorter side to resize_size, then centre-crop image_size (torchvision's
    weights: 256 then 224). mode 'square': resize both sides to image_size (the course).
    """

    image_size: int
    resize_size: int
    mode: str = "crop"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.mode not in ("crop", "square"):
            raise ValueError(f"preprocessing mode must be 'crop' or 'square', got {self.mode!r}")
        if self.interpolation not in _INTERPOLATION:
            raise ValueError(f"interpolation must be one of {', '.join(_INTERPOLATION)}, got {self.interpolation!r}")
        if self.mode == "crop" and self.resize_size < self.image_size:
            raise ValueError(f"resize size {self.resize_size} is smaller than the crop {self.image_size}")

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocess":
        return cls(**{**d, "mean": tuple(d["mean"]), "std": tuple(d["std"])})

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @property
    def decode_size(self) -> int:
        """The shorter side a cached photo needs so that no transform upsamples it."""
        return self.resize_size


def make_preprocess(image_size: int, mean, std, mode: str = "crop", crop_pct: float = 0.875, interpolation: str = "bilinear") -> Preprocess:
    resize = image_size if mode == "square" else int(math.floor(image_size / crop_pct + 1e-9))  # as timm: 224 / 0.875 = 256
    return Preprocess(image_size, resize, mode, tuple(mean), tuple(std), interpolation)


def _to_float(p: Preprocess) -> list:
    """PIL image or uint8 tensor -> normalised float tensor. Geometric ops come before this, so a
    PIL photo is resized by PIL, exactly as torchvision's weights transforms do."""
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(p.mean, p.std)]


def eval_transform(p: Preprocess) -> v2.Compose:
    """Deterministic: resize (and centre-crop), scale to [0, 1], normalise."""
    interp = _INTERPOLATION[p.interpolation]
    if p.mode == "square":
        resize = [v2.Resize((p.image_size, p.image_size), interpolation=interp, antialias=True)]
    else:
        resize = [v2.Resize(p.resize_size, interpolation=interp, antialias=True), v2.CenterCrop(p.image_size)]
    return v2.Compose([*resize, *_to_float(p)])


def model_view(p: Preprocess, photo) -> torch.Tensor:
    """What the model sees of a photo, before scaling and normalisation: uint8 (3, S, S)."""
    return v2.Compose([*eval_transform(p).transforms[:-3], v2.ToImage()])(photo).as_subclass(torch.Tensor)


PRESETS = ("none", "flip", "light", "medium", "strong")


def train_transform(p: Preprocess, preset: str = "none", scale_min: float = 0.25, random_erasing: float = 0.0) -> v2.Compose:
    """The training transform of an augmentation preset.

    none:   the eval transform (the course trained without augmentation).
    flip:   the eval transform and horizontal flips.
    light:  random resized crop (area scale_min..1) and flips.
    medium: light, then TrivialAugment (Mueller & Hutter 2021), one random op a photo.
    strong: light, then RandAugment with 2 ops at magnitude 9 (Cubuk et al. 2020; DeiT's rand-m9).
    Random erasing (a share of photos) comes after normalisation in every preset.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown augmentation preset {preset!r}; expected one of {', '.join(PRESETS)}")
    interp = _INTERPOLATION[p.interpolation]
    if preset in ("none", "flip"):
        ops = eval_transform(p).transforms[:-3]  # the resize (and crop)
        if preset == "flip":
            ops.append(v2.RandomHorizontalFlip())
    else:
        ops = [v2.RandomResizedCrop(p.image_size, scale=(scale_min, 1.0), interpolation=interp, antialias=True),
               v2.RandomHorizontalFlip()]
        if preset == "medium":
            ops.append(v2.TrivialAugmentWide(interpolation=interp))
        elif preset == "strong":
            ops.append(v2.RandAugment(num_ops=2, magnitude=9, interpolation=interp))
    ops += _to_float(p)
    if random_erasing > 0:
        ops.append(v2.RandomErasing(p=random_erasing, value=0))
    return v2.Compose(ops)


def batch_mixer(num_classes: int, mixup: float = 0.0, cutmix: float = 0.0, prob: float = 1.0) -> "BatchMixer | None":
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
