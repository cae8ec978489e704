"""Where photos come from: a URL of a zip, a local zip, a folder in torchvision's ImageFolder
layout, or Food-101 (`food101`, `food101:pizza,steak,sushi`); downloads and unpacks once into a
cache. No PyTorch (Food-101's download alone uses torchvision, imported then)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from foodvit.errors import DataError
from foodvit.files import address_scheme, atomic_folder, exclusive, read_json
from foodvit.files import download as download_file

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://github.com/mrdbourke/pytorch-deep-learning/raw/main/data/pizza_steak_sushi.zip"
LAYOUT = "<root>/train/<class>/*.jpg and <root>/test/<class>/*.jpg (torchvision's ImageFolder layout)"


def cache_dir() -> Path:
    """Where downloads and unpacked zips go: $FOODVIT_CACHE, else ~/.cache/foodvit."""
    return Path(os.environ.get("FOODVIT_CACHE") or Path.home() / ".cache" / "foodvit")


FOOD101 = "food101"


def food101(*, quiet: bool = False) -> Path:
    """Food-101 (Bossard et al. 2014: 101 classes, 750 train and 250 test photos each, 5 GB) in the
    cache, downloaded and checked by torchvision the first time."""
    root = food101_root()
    base = root.parent
    if (root / "images").is_dir() and (root / "meta").is_dir():
        return root
    if not quiet:
        logger.info("downloading Food-101 (5 GB) into %s (once)", base)
    try:
        from torchvision.datasets import Food101

        Food101(str(base), split="train", download=True)
    except (urllib.error.URLError, OSError, RuntimeError, TimeoutError) as err:
        raise DataError(
            f"could not download Food-101 ({getattr(err, 'reason', err)}); with it downloaded elsewhere, "
            f"unpack it into {base} (so that {root / 'meta'} exists) or pass --data /path/to/food-101"
        ) from err
    return root


def food101_root() -> Path:
    """Where Food-101 lies in the cache once downloaded."""
    return cache_dir() / "food101" / "food-101"


def is_download(source: str) -> bool:
    """Whether a source is fetched: an http(s) address, its scheme in any case (HTTPS://host/x.zip)."""
    return address_scheme(source) in ("http", "https")


def default_source() -> str:
    return os.environ.get("FOODVIT_DATA") or DEFAULT_URL


def resolve(source: str | os.PathLike | None = None, *, timeout: float = 20.0, quiet: bool = False) -> Path:
    """A local folder for a source: downloads and unzips as needed, skipping what is cached."""
    source = str(source or default_source())
    if source == FOOD101:
        return food101(quiet=quiet)
    if is_download(source):
        return extract_download(source, download(source, timeout=timeout, quiet=quiet))
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"data source {path} does not exist; expected a folder laid out as {LAYOUT}, a .zip of one, or a URL"
        )
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise DataError(
                f"{path} is a file but not a zip (a download cut short?); expected a folder laid out as {LAYOUT}, "
                "or a .zip of one: download it again, or pass the folder"
            )
        return extract(path)
    return path


def _download_target(url: str) -> Path:
    name = PurePosixPath(urllib.parse.urlparse(url).path).name or "download"
    return cache_dir() / "downloads" / f"{hashlib.sha1(url.encode()).hexdigest()[:10]}-{name}"


def cached_download(url: str) -> Path | None:
    """The cached copy of url, if it was downloaded before; None otherwise (nothing is fetched)."""
    target = _download_target(url)
    return target if target.is_file() else None


def download(url: str, *, timeout: float = 20.0, quiet: bool = False) -> Path:
    """Download into the cache once. The file appears only when complete (temporary name, then rename)."""
    target = _download_target(url)
    if target.is_file():
        return target
    try:
        return download_file(url, target, timeout=timeout, quiet=quiet)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise DataError(
            f"could not download {url} ({reason}). Without internet, point at local data instead: "
            f"--data /path/to/folder_or.zip, or set FOODVIT_DATA"
        ) from err


class DamagedZip(DataError):
    """A zip that is not one, or whose content is damaged: worth fetching again, unlike one of another layout."""


def extract_download(url: str, zip_path: Path) -> Path:
    """extract() of the cached download of url; a download that is no zip, or a damaged one (a web page served in
    the zip's place, a transfer damaged on the way), is removed from the cache, so that the next run fetches it
    again rather than failing on the same copy for good."""
    try:
        return extract(zip_path)
    except DamagedZip as err:
        zip_path.unlink(missing_ok=True)
        raise DataError(f"{err} (the copy downloaded from {url} is removed: the next run downloads it again)") from None


def extract(zip_path: Path) -> Path:
    """Unpack a zip into the cache (once) and return the folder holding train/ and test/, or, for a zip of class
    folders, the folder holding them (_root_of).

    Members that would land outside the target (absolute paths, '..') are refused before anything
    is written; unpacking goes to a temporary folder that is renamed only when complete and holding
    folders, so a damaged zip, or one of files alone, leaves nothing in the cache.
    """
    zip_path = Path(zip_path)
    stat = zip_path.stat()
    key = hashlib.sha1(f"{zip_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    target = cache_dir() / "data" / f"{zip_path.stem}-{key}"
    # one process at a time looks at, mends or unpacks a zip's folder (two runs, or torchrun's ranks on several
    # machines sharing a cache): else one could remove what another has just unpacked or is reading. The lock is
    # on the zip itself, so that nothing is left in the cache for it
    with exclusive(zip_path) as held:
        return _extract_locked(zip_path, held, target)


def _extract_locked(zip_path: Path, held, target: Path) -> Path:
    """extract() holding the lock on the zip, read through `held`, the locked handle."""
    if target.is_dir():
        if _unpacked_whole(target):
            with contextlib.suppress(DataError):
                return _root_of(target, zip_path)
        shutil.rmtree(target)  # files of it removed or changed since: unpacked again, not trained on as it is now
    try:
        with zipfile.ZipFile(held) as archive:
            for member in archive.namelist():
                parts = PurePosixPath(member.replace("\\", "/")).parts
                if member.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    raise DataError(
                        f"{zip_path} holds an unsafe member {member!r} (absolute or '..' path); refusing to unpack it"
                    )

            def unpack(tmp: Path) -> None:
                members = archive.infolist()
                for info in members:  # a zip written on Windows may name its folders with backslashes (as member
                    info.filename = info.filename.replace("\\", "/")  # names are refused above): read them as such
                archive.extractall(tmp, members)
                _root_of(tmp, zip_path)  # laid out as expected, or nothing is kept
                (tmp / UNPACKED).write_text(json.dumps(_files_of(tmp)) + "\n")

            atomic_folder(target, unpack)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError) as err:
        raise DamagedZip(
            f"{zip_path} is a damaged zip ({type(err).__name__}: {err}); download it again or unpack it "
            "yourself and pass the folder"
        ) from err
    except OSError as err:
        raise DataError(
            f"{zip_path} could not be unpacked ({type(err).__name__}: {err}); unpack it yourself and pass the folder"
        ) from err
    except (RuntimeError, NotImplementedError) as err:  # zipfile's words for a password, or Deflate64 and the like
        if (damage := _damage(held)) is not None:  # not the zip's method: its bytes, damaged on the way
            raise DamagedZip(
                f"{zip_path} is a damaged zip ({damage}); download it again or unpack it yourself and pass the folder"
            ) from err
        raise DataError(
            f"{zip_path} cannot be unpacked by Python's zipfile ({err}): a password-protected zip, or one compressed "
            "with a method it does not read (such as Deflate64); unpack it yourself and pass the folder"
        ) from err
    return _root_of(target, zip_path)


# a member's local file header (the zip format's APPNOTE, 4.3.7): signature, version needed, flags, compression
# method, time, date, CRC-32, compressed and uncompressed sizes, name and extra field lengths
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


def _damage(handle) -> str | None:
    """What shows a zip that zipfile calls one of a method, an encryption or a version it does not read to be damaged
    rather than stored so (a bit flipped in one of its two copies of a member's header), or None where nothing does.
    zipfile reads the central directory's copy (and the local one, but checks only the member's name there)."""
    try:
        archive = zipfile.ZipFile(handle)
    except NotImplementedError as err:  # its directory names a version past the zip format's own (6.3)
        return f"its directory says {err}"
    with archive:
        for info in archive.infolist():
            handle.seek(info.header_offset)
            header = handle.read(LOCAL_HEADER.size)
            fields = LOCAL_HEADER.unpack(header) if len(header) == LOCAL_HEADER.size else None
            if (
                fields is None
                or fields[0] != b"PK\x03\x04"
                or fields[3] != info.compress_type
                or (fields[2] ^ info.flag_bits) & 0x1  # bit 0 of the flags: encrypted
            ):
                return f"its directory and the header of {info.filename!r} disagree on how it is stored"
    return None


UNPACKED = ".foodvit-unpacked.json"  # in an unpacked zip's folder: its files' sizes when it was unpacked


def _files_of(folder: Path) -> dict[str, int]:
    """Every file under folder (the note itself left out), by its path there, with its size."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _unpacked_whole(folder: Path) -> bool:
    """Whether an unpacked zip's folder holds what was unpacked into it, file for file and size for size (a folder
    unpacked before the note was written counts as whole)."""
    try:
        noted = read_json(folder / UNPACKED)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    found = _files_of(folder)
    found.pop(UNPACKED, None)
    return noted == found


def _root_of(folder: Path, origin: Path) -> Path:
    """The folder with train/ and test/ inside an unpacked zip (at the top or one level down); else, for a zip of
    class folders (a validation source, photos to evaluate), the top, or the one folder there when it holds folders.
    Training's own check (folders.check_layout) names what it lacks."""
    folders = lambda p: sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(("_", ".")))  # noqa: E731
    top = folders(folder)
    for candidate in [folder, *top]:
        if (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
    if len(top) == 1 and folders(top[0]):
        return top[0]
    if top:
        return folder
    raise DataError(f"{origin} holds no folders; expected a zip of {LAYOUT}, or of class folders")
