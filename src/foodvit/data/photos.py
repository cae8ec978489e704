"""Photos: opening one safely and decoding it to RGB, from a file, from bytes or from a PIL image.

Everything that reads a photo goes through here: training and evaluation (datasets.py), `predict`,
the server's uploads and the ONNX path. It needs Pillow and NumPy only, never PyTorch. Every way a
photo can fail (not an image, empty, truncated, a format Pillow cannot read, a decompression bomb)
becomes a PhotoError that names the photo and says what is wrong.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from foodvit.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
ACCEPTED = "a JPEG, PNG, WebP, BMP, GIF or TIFF photo"

# Pillow's own default, named and enforced here: a photo over this many pixels is refused before it
# is decoded (a "decompression bomb": a small file that decodes to gigabytes).
MAX_PIXELS = 89_478_485


class PhotoError(DataError):
    """One photo that cannot be used: `path`, `reason` (the message is the two together) and `kind`:
    'unreadable' (not an image, damaged, a format Pillow cannot read), 'empty' or 'too large'."""

    def __init__(self, path, reason: str, kind: str = "unreadable") -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.kind = path, reason, kind


def limit_pixels() -> None:
    """Pillow's pixel limit set explicitly to MAX_PIXELS, and its bomb warning (between the limit
    and twice it) turned into a refusal, for every decoder in this process (Gradio's included).
    A process-wide policy: the command line and the server call it once at start; open_photo
    refuses oversized photos from their header whether it was called or not."""
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


@contextlib.contextmanager
def open_photo(source: str | os.PathLike | io.BytesIO, name=None):
    """Image.open with the pixel limit enforced from the header, before any decoding; every way a
    file can fail to open becomes a PhotoError that names the photo (`name`, else the path) and
    what is wrong. (No warnings.catch_warnings here: it changes process-wide state and is not
    safe in a server's threads; see limit_pixels.)"""
    name = source if name is None else name
    try:
        image = Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise PhotoError(name, f"is over the limit of {MAX_PIXELS / 1e6:.0f} megapixels ({err}); a decompression bomb? "
                         "resize it if it is a real photo", "too large") from None
    except UnidentifiedImageError:
        raise PhotoError(name, f"is not an image Pillow can read; expected {ACCEPTED}") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise PhotoError(name, f"cannot be read as an image, damaged or truncated? ({type(err).__name__}: {err}); "
                         f"expected a complete image file: {ACCEPTED}") from None
    with image:
        w, h = image.size
        if w * h > MAX_PIXELS:
            raise PhotoError(name, f"is {w} x {h} = {w * h / 1e6:.0f} megapixels, over the limit of {MAX_PIXELS / 1e6:.0f} "
                             "(a decompression bomb?); resize it if it is a real photo", "too large")
        yield image


def load_rgb(path: str | os.PathLike | io.BytesIO, name=None) -> Image.Image:
    """Open a photo as RGB whatever its mode, turned upright by its EXIF orientation.

    Transparent pixels (RGBA, LA, palette with transparency) are laid over white; 16- and 32-bit
    grayscale is rescaled to 8 bits; CMYK, grayscale and palette photos are converted. A photo
    over MAX_PIXELS is refused before decoding.
    """
    with open_photo(path, name) as image:
        return as_rgb(image)


def as_rgb(image: Image.Image) -> Image.Image:
    """A decoded RGB copy of an open PIL image (see load_rgb)."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        image = _to_8bit(image)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _to_8bit(image: Image.Image) -> Image.Image:
    import numpy as np

    array = np.asarray(image, dtype=np.float64)
    low, high = float(array.min()), float(array.max())
    scaled = (array - low) / (high - low) * 255 if high > low else np.zeros_like(array)
    return Image.fromarray(scaled.round().astype(np.uint8), mode="L")


def load_or_explain(path: str | os.PathLike) -> Image.Image:
    """load_rgb, with every failure a PhotoError that names the file and what is wrong."""
    try:
        return load_rgb(path)
    except PhotoError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        raise PhotoError(path, f"cannot be read ({err}); remove or replace it") from err


def decode(photo, name: str = "the photo") -> Image.Image:
    """An RGB PIL image from a PIL image, the bytes of an image file, or a file path; a PhotoError
    that says what is wrong and what is accepted otherwise (empty, truncated, not an image, ...)."""
    if isinstance(photo, Image.Image):
        if photo.width * photo.height > MAX_PIXELS:
            raise PhotoError(name, f"is {photo.width} x {photo.height}, over the limit of {MAX_PIXELS / 1e6:.0f} megapixels", "too large")
        return photo if photo.mode == "RGB" else as_rgb(photo)
    if isinstance(photo, (bytes, bytearray, memoryview)):
        if len(photo) == 0:
            raise PhotoError(name, f"is empty (0 bytes); expected {ACCEPTED}", "empty")
        try:
            return load_rgb(io.BytesIO(photo), name)
        except PhotoError:
            raise
        except (OSError, ValueError, SyntaxError) as err:  # raised while decoding: truncated or corrupt data
            raise PhotoError(name, f"is damaged or truncated ({err}); expected a complete image file: {ACCEPTED}") from None
    if isinstance(photo, (str, os.PathLike)):
        return load_or_explain(photo)
    raise PhotoError(name, f"is a {type(photo).__name__}; expected a PIL image, the bytes of an image file or a path")


def check_image(path) -> str | None:
    """None if the file looks like a readable photo (extension, header, size), else why not."""
    from pathlib import Path

    path = Path(path)
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        return f"not an image file (extension {path.suffix or 'none'})"
    try:
        with open_photo(path) as image:
            image.verify()
    except PhotoError as err:
        return err.reason
    except (OSError, SyntaxError, ValueError) as err:
        return f"cannot be read as an image ({type(err).__name__}: {err})"
    return None
