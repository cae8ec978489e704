"""The attention heat map laid over the crop the model saw, in NumPy alone: no PyTorch and no
matplotlib, so that the demo page draws it for an exported .onnx model too, in a Space that installs
neither. viz/figures.py draws the same picture in its figures."""

from __future__ import annotations

import numpy as np

# matplotlib's 'jet' (matplotlib/_cm.py): per channel, (x, value) points joined linearly
_JET = {
    "red": ((0.0, 0.0), (0.35, 0.0), (0.66, 1.0), (0.89, 1.0), (1.0, 0.5)),
    "green": ((0.0, 0.0), (0.125, 0.0), (0.375, 1.0), (0.64, 1.0), (0.91, 0.0), (1.0, 0.0)),
    "blue": ((0.0, 0.5), (0.11, 1.0), (0.34, 1.0), (0.65, 0.0), (1.0, 0.0)),
}
_LEVELS = 256  # matplotlib's colour maps are tables of 256 colours


def jet(x: np.ndarray) -> np.ndarray:
    """matplotlib's colormaps["jet"](x)[..., :3] for x in [0, 1], without matplotlib: (..., 3) in [0, 1]."""
    grid = np.linspace(0.0, 1.0, _LEVELS)
    table = np.stack([np.interp(grid, *np.asarray(_JET[c]).T) for c in ("red", "green", "blue")], axis=-1)  # (256, 3)
    # as matplotlib indexes it
    index = np.clip((np.asarray(x, dtype=np.float64) * _LEVELS).astype(np.int64), 0, _LEVELS - 1)
    return table[index]


def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in): 1-D linear interpolation as PyTorch's F.interpolate(mode='bilinear',
    align_corners=False) computes it (source index (i + 0.5) * n_in / n_out - 0.5, clamped)."""
    source = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    left = np.minimum(source.astype(np.int64), n_in - 1)
    right = np.minimum(left + 1, n_in - 1)
    weight = source - left
    matrix = np.zeros((n_out, n_in))
    np.add.at(matrix, (np.arange(n_out), left), 1 - weight)
    np.add.at(matrix, (np.arange(n_out), right), weight)
    return matrix


def upsample(heat: np.ndarray, size: int) -> np.ndarray:
    """A (g, g) map -> (size, size), bilinear (as F.interpolate, align_corners=False)."""
    heat = np.asarray(heat, dtype=np.float64)
    return _bilinear_matrix(heat.shape[0], size) @ heat @ _bilinear_matrix(heat.shape[1], size).T


def overlay_array(image: np.ndarray, heat: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """image: uint8 (3, S, S) or (S, S, 3), the model's view; heat: (g, g). The heat map, scaled to
    [0, 1] and coloured with 'jet', mixed over the image: an RGB uint8 array (S, S, 3). No figure,
    no pyplot, so it is safe in a server's threads."""
    image = np.asarray(image)
    if image.shape[0] == 3 and image.shape[-1] != 3:
        image = image.transpose(1, 2, 0)  # (3, S, S) -> (S, S, 3)
    up = upsample(heat, image.shape[0])
    up = (up - up.min()) / (up.max() - up.min() + 1e-12)
    colours = jet(up)  # (S, S, 3) in [0, 1]
    mixed = (1 - alpha) * image / 255.0 + alpha * colours
    return (np.clip(mixed, 0, 1) * 255).round().astype(np.uint8)
