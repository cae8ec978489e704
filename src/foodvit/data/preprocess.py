"""What the model expects of a photo (Preprocess), and the evaluation preprocessing itself.

The evaluation path (resize, centre-crop, scale to [0, 1], normalise) runs on Pillow and NumPy
alone, so that predicting needs neither torchvision nor, until the model runs, PyTorch. It
computes exactly what torchvision's transforms do to a PIL photo (tests/test_transforms.py
compares the two): Pillow resizes in both.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass, fields

from foodvit.errors import ConfigError
from foodvit.settings.run import INTERPOLATIONS, RESIZE_MODES

MAX_SIDE = 4096  # the largest image_size or resize_size a preprocessing may name: a photo resized beyond it is no input


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
        # numbers of any kind (numpy's included) are kept as Python's, as the JSON it is stored in has them
        for name in ("image_size", "resize_size"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= int(value) <= MAX_SIDE:
                raise ConfigError(f"preprocessing's {name} must be a whole number from 1 to {MAX_SIDE}, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, 3) or not all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values
            ):
                raise ConfigError(
                    f"preprocessing's {name} must be a number a channel (3, or 1 for all), got {list(values)!r}"
                )
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if not all(v > 0 for v in self.std):
            raise ConfigError(f"preprocessing's std must be above 0 for every channel, got {list(self.std)!r}")
        if self.mode not in RESIZE_MODES:
            raise ConfigError(f"preprocessing mode must be one of {', '.join(RESIZE_MODES)}, got {self.mode!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}")
        if self.image_size < 1:
            raise ConfigError(f"image size must be >= 1, got {self.image_size}")
        if self.mode == "crop" and self.resize_size < self.image_size:
            raise ConfigError(f"resize size {self.resize_size} is smaller than the crop {self.image_size}")

    @classmethod
    def from_dict(cls, d: dict) -> Preprocess:
        """The preprocessing a model card or a model file's metadata holds; ConfigError, naming what is wrong,
        for one that is not (a damaged or hand-edited file)."""
        needed = ("image_size", "resize_size", "mean", "std")  # mode and interpolation have their defaults
        if not isinstance(d, dict) or any(k not in d for k in needed) or set(d) - {f.name for f in fields(cls)}:
            raise ConfigError(
                f"the preprocessing must be an object with image_size, resize_size, mean and std (mode and "
                f"interpolation optional), got {json.dumps(d)[:200]}"
            )
        for name in ("mean", "std"):
            if not isinstance(d[name], (list, tuple)):
                raise ConfigError(f"preprocessing's {name} must be a number a channel, got {d[name]!r}")
        return cls(**{**d, "mean": tuple(d["mean"]), "std": tuple(d["std"])})

    def at_size(self, image_size: int) -> Preprocess:
        """The same preprocessing for another input size: with 'crop', the same crop share."""
        resize = image_size if self.mode == "square" else int(round(image_size * self.resize_size / self.image_size))
        return Preprocess(image_size, max(resize, image_size), self.mode, self.mean, self.std, self.interpolation)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def resize_for_crop(image_size: int, crop_pct: float) -> int:
    """The shorter side to resize to before a centre crop of image_size that keeps crop_pct of it
    (as timm: 224 / 0.875 = 256, rounded down)."""
    return int(math.floor(image_size / crop_pct + 1e-9))


def make_preprocess(
    image_size: int, mean, std, mode: str = "crop", crop_pct: float = 0.875, interpolation: str = "bilinear"
) -> Preprocess:
    resize = image_size if mode == "square" else resize_for_crop(image_size, crop_pct)
    return Preprocess(image_size, resize, mode, tuple(mean), tuple(std), interpolation)


def resample_filter(interpolation: str):
    """Pillow's filter for an interpolation name."""
    from PIL import Image

    return {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[interpolation]


def shorter_side_to(size: tuple[int, int], shorter: int) -> tuple[int, int]:
    """(width, height) with the shorter side at `shorter` px and the longer in proportion, rounded
    down (as torchvision computes it)."""
    w, h = size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(shorter * long / short)
    return (shorter, new_long) if w <= h else (new_long, shorter)


def crop_view(p: Preprocess, photo):
    """The part of a PIL photo the model sees, at the model's size (a PIL image).

    'crop': the shorter side resized to resize_size (the longer in proportion, rounded down), then
    the centre image_size x image_size; 'square': both sides resized to image_size.
    """
    if p.mode == "square":
        return photo.resize((p.image_size, p.image_size), resample=resample_filter(p.interpolation))
    size = shorter_side_to(photo.size, p.resize_size)
    if size != photo.size:
        photo = photo.resize(size, resample=resample_filter(p.interpolation))
    left = int(round((size[0] - p.image_size) / 2.0))
    top = int(round((size[1] - p.image_size) / 2.0))
    return photo.crop((left, top, left + p.image_size, top + p.image_size))


def to_array(p: Preprocess, photo):
    """A PIL RGB photo -> the model's input as a float32 NumPy array (3, S, S), normalised."""
    import numpy as np

    pixels = np.asarray(crop_view(p, photo), dtype=np.float32) / np.float32(255)  # (S, S, 3) in [0, 1]
    mean, std = np.asarray(p.mean, dtype=np.float32), np.asarray(p.std, dtype=np.float32)
    return np.ascontiguousarray(((pixels - mean) / std).transpose(2, 0, 1))  # (S, S, 3) -> (3, S, S)
