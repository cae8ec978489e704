"""Photos: opening one safely and decoding it to RGB, from a file, from bytes or from a PIL image.

Everything that reads a photo goes through here: training and evaluation (datasets.py), `predict`,
the server's uploads and the ONNX path. It needs Pillow and NumPy only, never PyTorch. Every way a
photo can fail (not an image, empty, truncated, a format Pillow cannot read, a decompression bomb)
becomes a PhotoError that names the photo and says what is wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import math
import os
import re
import threading
import warnings
from collections.abc import Callable
from typing import Literal

from PIL import Image, ImageOps, UnidentifiedImageError

from foodvit.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
ACCEPTED = "a JPEG, PNG, WebP, BMP, GIF or TIFF photo"


def named_as_photo(name: str | os.PathLike) -> bool:
    """Whether a file's name says it is a photo (its suffix, any case, is one of IMAGE_EXTENSIONS)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


# Pillow's own default, named and enforced here: a photo over this many pixels is refused before it
# is decoded (a "decompression bomb": a small file that decodes to gigabytes).
MAX_PIXELS = 89_478_485
# The one limit of a photo's pixels for every command that opens photos (predict, explain, evaluate,
# training's data, serve's default --max-megapixels): 50 megapixels lets the full photos of 48- and
# 50-megapixel phone cameras through, and the model needs a few hundred pixels a side. MAX_PIXELS
# stays the ceiling a server may raise it to.
PHOTO_LIMIT = 50_000_000
MAX_ASPECT = 20  # the longest side at most this many times the shortest: a panorama is 4-12, a strip of pixels more

# Reduced decoding (decode(..., reduce_to=N)): a photo is decoded at an integer fraction of its size
# only when its shorter side stays at least REDUCE_MARGIN x N and at least REDUCE_FLOOR px, so that
# the model's own resize still shrinks it several times over (what it sees changes by no more than
# rounding) and photos up to REDUCE_FLOOR px on the shorter side are decoded exactly as before.
REDUCE_MARGIN = 4
REDUCE_FLOOR = 1024
# Decodes that needed this many bytes or more give the freed memory back to the system afterwards.
TRIM_AFTER_BYTES = 32 * 2**20


class PhotoError(DataError):
    """One photo that cannot be used: `path`, `reason` (the message is the two together) and `kind`:
    'unreadable' (not an image, damaged, a format Pillow cannot read), 'empty' or 'too large'."""

    def __init__(self, path, reason: str, kind: str = "unreadable") -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.kind = path, reason, kind


def megapixels(pixels: float) -> str:
    """A pixel count for people: 90, 89.5, 0.3 (megapixels, one decimal at most)."""
    return f"{round(pixels / 1e6, 1):g}"


def too_large(name, pixels: int, limit: int, size: tuple[int, int] | None = None) -> PhotoError:
    """The one message for a photo over the pixel limit: its size and the limit, both in megapixels."""
    dims = f"{size[0]} x {size[1]} = " if size else ""
    return PhotoError(
        name,
        f"is {dims}{megapixels(pixels)} megapixels, over the limit of {megapixels(limit)} megapixels "
        "(a decompression bomb?); if it is a real photo, resize it below the limit and try again",
        "too large",
    )


def too_long(name, size: tuple[int, int]) -> PhotoError:
    """The one message for a photo far longer than it is wide: scaled so that its short side fits a model, its long
    side would need gigabytes (a 1,000,000 x 1 strip of 3 kB, say)."""
    w, h = size
    return PhotoError(
        name,
        f"is {w} x {h} px, {max(w, h) / max(min(w, h), 1):.0f} times as long as it is wide (at most {MAX_ASPECT}); "
        "crop it closer to what it shows and try again",
        "too large",
    )


def check_shape(name, size: tuple[int, int], limit: int) -> None:
    """A PhotoError for a photo over the pixel limit or of an aspect past MAX_ASPECT; nothing for any other."""
    w, h = size
    if min(w, h) < 1:  # a PIL image made empty: nothing to resize or crop
        raise PhotoError(name, f"has no pixels ({w} x {h}); expected {ACCEPTED}")
    if w * h > limit:
        raise too_large(name, w * h, limit, (w, h))
    if max(w, h) > MAX_ASPECT * max(min(w, h), 1):
        raise too_long(name, (w, h))


def empty(name) -> PhotoError:
    return PhotoError(name, f"is empty (0 bytes); expected {ACCEPTED}", "empty")


def limit_pixels() -> None:
    """Pillow's pixel limit set explicitly to MAX_PIXELS, and its bomb warning (between the limit
    and twice it) turned into a refusal, for every decoder in this process (Gradio's included).
    A process-wide policy, so the entry points call it once at start (the command line, a Space's
    app.py); open_photo
    refuses oversized photos from their header whether it was called or not."""
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def quiet_exif_warnings() -> None:
    """Pillow's warnings about a photo's damaged EXIF block ("Truncated File Read", "Corrupt EXIF data", from its
    TIFF parser, which reads the block) silenced for the whole process: the photo itself decodes, its orientation
    read where the block allows. A process-wide policy, set once by the command line, as limit_pixels is."""
    warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.TiffImagePlugin")


@contextlib.contextmanager
def open_photo(source: str | os.PathLike | io.BytesIO, name=None, max_pixels: int = PHOTO_LIMIT):
    """Image.open with the pixel limit (max_pixels, at most MAX_PIXELS) enforced from the header,
    before any decoding; every way a file can fail to open becomes a PhotoError that names the
    photo (`name`, else the path) and what is wrong. (No warnings.catch_warnings here: it changes
    process-wide state and is not safe in a server's threads; see limit_pixels.)"""
    name = source if name is None else name
    limit = min(max_pixels, MAX_PIXELS)
    if _is_empty(source):  # Pillow would call it "not an image": say what it is
        raise empty(name)
    try:
        image = Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        # Pillow refuses before foodvit sees the header; its message holds the pixel count
        found = re.search(r"\((\d+) pixels\)", str(err))
        raise too_large(name, int(found.group(1)) if found else 2 * MAX_PIXELS + 1, limit) from None
    except UnidentifiedImageError:
        raise PhotoError(name, f"is not an image Pillow can read; expected {ACCEPTED}") from None
    except FileNotFoundError:
        raise PhotoError(name, "does not exist") from None
    except (IsADirectoryError, PermissionError) as err:  # a folder is the second on Windows
        if not (isinstance(source, (str, os.PathLike)) and os.path.isdir(source)):
            raise PhotoError(name, f"cannot be read ({err.strerror})") from None
        raise PhotoError(name, "is a folder, not a photo file") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise PhotoError(
            name,
            f"cannot be read as an image, damaged or truncated? ({type(err).__name__}: {err}); "
            f"expected a complete image file: {ACCEPTED}",
        ) from None
    with image:
        check_shape(name, image.size, limit)
        yield image


def _is_empty(source) -> bool:
    if isinstance(source, io.BytesIO):
        return source.getbuffer().nbytes == 0
    try:
        return os.path.getsize(source) == 0
    except (OSError, TypeError):  # missing or not a path: Image.open says what is wrong
        return False


def load_rgb(path: str | os.PathLike | io.BytesIO, name=None) -> Image.Image:
    """Open a photo as RGB whatever its mode, turned upright by its EXIF orientation.

    Transparent pixels (RGBA, LA, palette with transparency) are laid over white; 16- and 32-bit
    grayscale is rescaled to 8 bits; CMYK, grayscale and palette photos are converted. A photo
    over PHOTO_LIMIT is refused before decoding.
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


BAND = 1 << 22  # values _to_8bit scales at a time (32 MB as float64)


def _to_8bit(image: Image.Image) -> Image.Image:
    """16- or 32-bit grayscale stretched to 8 bits, its darkest pixel 0 and its brightest 255; scaled a band of
    rows at a time, as a float64 copy of a whole 49-megapixel photo and its temporaries took over a gigabyte."""
    import numpy as np

    array = np.asarray(image)
    if array.dtype.kind == "f":  # a 32-bit float TIFF may hold NaN or an infinity: stretched over the other pixels
        finite = np.isfinite(array)
        low = float(np.min(array, where=finite, initial=np.inf))
        high = float(np.max(array, where=finite, initial=-np.inf))
    else:
        low, high = float(array.min()), float(array.max())
    out = np.zeros(array.shape, dtype=np.uint8)
    if high > low:
        rows = max(1, BAND // max(1, array.shape[1]))
        for top in range(0, array.shape[0], rows):
            band = np.nan_to_num(array[top : top + rows].astype(np.float64), nan=low, posinf=high, neginf=low)
            out[top : top + rows] = ((band - low) / (high - low) * 255).round()
    return Image.fromarray(out, mode="L")


def load_or_explain(path: str | os.PathLike) -> Image.Image:
    """load_rgb, with every failure a PhotoError that names the file and what is wrong."""
    try:
        return load_rgb(path)
    except PhotoError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        raise PhotoError(path, f"cannot be read ({err}); remove or replace it") from err


def decode(
    photo,
    name: str | os.PathLike = "the photo",
    *,
    max_pixels: int = PHOTO_LIMIT,
    reduce_to: int | None = None,
    budget: DecodeBudget | None = None,
) -> Image.Image:
    """An RGB PIL image from a PIL image, the bytes of an image file, or a file path; a PhotoError
    that says what is wrong and what is accepted otherwise (empty, truncated, not an image, over
    max_pixels, ...).

    reduce_to: the shortest side the user of the photo needs (a model's resize size); a photo far
    larger is decoded at an integer fraction of its size (see REDUCE_MARGIN), JPEGs by their
    decoder's own scaling, so that a large photo never exists at full size in memory. budget: a
    DecodeBudget that the decoding waits on, so that concurrent decodes share a memory bound.
    """
    if isinstance(photo, Image.Image):
        check_shape(name, photo.size, min(max_pixels, MAX_PIXELS))
        return photo if photo.mode == "RGB" else as_rgb(photo)
    source: io.BytesIO | str | os.PathLike
    if isinstance(photo, (bytes, bytearray, memoryview)):
        source = io.BytesIO(photo)
    elif isinstance(photo, (str, os.PathLike)):
        source, name = photo, (photo if name == "the photo" else name)
    else:
        raise PhotoError(
            name, f"is a {type(photo).__name__}; expected a PIL image, the bytes of an image file or a path"
        )
    with open_photo(source, name, max_pixels) as image:
        factor = reduction(image.size, reduce_to)
        if factor > 1 and image.format == "JPEG":  # the decoder scales by 1/2, 1/4 or 1/8 while decoding
            image.draft(None, (image.width // factor, image.height // factor))
            factor = reduction(image.size, reduce_to)  # what is left to do after the decoder's scaling
        cost = decode_cost(image, factor)
        with budget.reserve(cost) if budget is not None else contextlib.nullcontext():
            try:
                rgb = as_rgb(_reduced(image, factor))
            except (OSError, ValueError, SyntaxError) as err:  # raised while decoding: truncated or corrupt data
                raise PhotoError(
                    name, f"is damaged or truncated ({err}); expected a complete image file: {ACCEPTED}"
                ) from None
            finally:
                image.close()  # its full-size pixels go now, while the budget still counts them
    if cost >= TRIM_AFTER_BYTES:
        release_memory()
    return rgb


def decodes_whole(path: str | os.PathLike) -> None:
    """A PhotoError unless the photo decodes to its last byte: the check of a photo that is not kept in memory (the
    scan's pass when the decode cache is off or full), so that one cut short is skipped before training, not met in
    an epoch. A JPEG is decoded at 1/8 of its size (its decoder's own scaling, which reads every byte): about 0.7 ms
    a 512 px photo, against 3.5 ms whole."""
    with open_photo(path) as image:
        if image.format == "JPEG":
            image.draft(None, (max(1, image.width // 8), max(1, image.height // 8)))
        try:
            image.load()
        except (OSError, ValueError, SyntaxError) as err:
            raise PhotoError(
                path, f"is damaged or truncated ({err}); expected a complete image file: {ACCEPTED}"
            ) from None


def _reduced(image: Image.Image, factor: int) -> Image.Image:
    """The loaded image shrunk by an integer factor (box averages), in a mode Image.reduce takes;
    modes it does not take (16-bit grayscale) are left whole."""
    image.load()
    if factor <= 1:
        return image
    if image.mode == "1":
        image = image.convert("L")
    elif image.mode in ("P", "PA"):
        image = image.convert("RGBA")
    return image.reduce(factor) if image.mode in _REDUCIBLE else image


_REDUCIBLE = ("L", "LA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "I", "F", "La", "RGBa")


def reduction(size: tuple[int, int], reduce_to: int | None) -> int:
    """The integer factor a photo of `size` may be shrunk by for a user that needs `reduce_to` px
    on the shorter side: 1 (not at all) unless the photo is far larger (REDUCE_MARGIN, REDUCE_FLOOR)."""
    if not reduce_to:
        return 1
    keep = max(REDUCE_MARGIN * reduce_to, REDUCE_FLOOR)
    return max(1, min(size) // keep)


def decode_cost(image: Image.Image, factor: int = 1) -> int:
    """Bytes that decoding an opened (not yet loaded) photo takes at its peak: the decoded pixels
    (Pillow keeps 1 to 4 bytes a pixel by mode), a converted copy, and the RGB result."""
    stored = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "LA": 2, "PA": 2}.get(image.mode, 4)
    pixels = image.width * image.height
    return pixels * (stored + 4) + math.ceil(pixels / factor**2) * 4 * 2


class DecodeBudget:
    """A memory budget shared by concurrent decodes: a semaphore counted in bytes. reserve(n)
    waits until n bytes are free; a decode larger than the whole budget waits until it is alone."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.used = max(1, int(max_bytes)), 0
        self._free = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, n: int):
        n = min(int(n), self.max_bytes)
        with self._free:
            self._free.wait_for(lambda: self.used + n <= self.max_bytes)
            self.used += n
        try:
            yield
        finally:
            with self._free:
                self.used -= n
                self._free.notify_all()


def release_memory() -> bool:
    """Give memory freed after a large decode back to the system (glibc's malloc_trim): the C
    allocator otherwise keeps it for the process, and a server's resident size stays at its peak.
    False where there is no glibc (macOS, Windows, musl)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    return bool(_malloc_trim and _malloc_trim(0) is not None)


_malloc_trim: Callable[[int], object] | Literal[False] | None = None  # None: not looked up yet; False: no glibc


def check_image(path) -> str | None:
    """None if the file looks like a readable photo (extension, header, size), else why not."""
    from pathlib import Path

    path = Path(path)
    if not named_as_photo(path):
        return f"not an image file (extension {path.suffix or 'none'})"
    try:
        with open_photo(path) as image:
            image.verify()
    except PhotoError as err:
        return err.reason
    except (OSError, SyntaxError, ValueError) as err:
        return f"cannot be read as an image ({type(err).__name__}: {err})"
    return None


def safe_name(name: str | None) -> str:
    """An uploaded file's name fit for a message: printable characters, at most 60 of them."""
    text = "".join(c for c in (name or "") if c.isprintable())[:60]
    return text or "the upload"
