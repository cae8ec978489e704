"""Helpers shared by the tests."""

import torch


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values (reference libraries zero some, e.g. the head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_norm_scale = p.ndim == 1 and ("ln" in name or "norm" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_norm_scale else 0.05 * noise)
    return module


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


CLASSES = ("pizza", "steak", "sushi")
_COLOURS = {"pizza": (220, 60, 40), "steak": (110, 60, 30), "sushi": (240, 240, 235)}


def make_photo(path, colour, size=(40, 48), seed=0, mode="RGB", fmt=None):
    """A small photo: a class colour with a darker square somewhere and some noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    pixels = np.empty((h, w, 3), dtype=np.float64)
    pixels[:] = colour
    y, x = rng.integers(0, h // 2), rng.integers(0, w // 2)
    pixels[y : y + h // 3, x : x + w // 3] *= 0.5
    pixels += rng.normal(0, 12, pixels.shape)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    if mode != "RGB":
        image = image.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format=fmt)
    return path


def make_photo_folder(root, n_train=12, n_test=6, classes=CLASSES, size=(40, 48)):
    """A FoodVision-like ImageFolder tree of generated JPEGs: root/{train,test}/<class>/*.jpg."""
    for split, n in (("train", n_train), ("test", n_test)):
        for c, name in enumerate(classes):
            for i in range(n):
                seed = 1000 * c + i + (500 if split == "test" else 0)
                make_photo(root / split / name / f"{i:03d}.jpg", _COLOURS.get(name, (30 * c, 90, 160)), size, seed)
    return root
