"""Data: where photos come from, how they are checked and decoded, and the loaders.

A source is a URL of a zip, a local zip, or a folder in torchvision's ImageFolder layout:
    <root>/train/<class>/<photo>, <root>/test/<class>/<photo>
(a folder whose subfolders are directly the classes is accepted for evaluation).
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info
from tqdm.auto import tqdm

from .errors import DataError  # noqa: F401  (re-exported: data.DataError)
from .files import atomic_folder
from .files import download as download_file
from .photos import (  # noqa: F401  (re-exported: the photo checks belong to the data layer's users too)
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    PhotoError,
    check_image,
    load_or_explain,
    load_rgb,
    open_photo,
)
from .seeds import derive_seed

DEFAULT_URL = "https://github.com/mrdbourke/pytorch-deep-learning/raw/main/data/pizza_steak_sushi.zip"
LAYOUT = "<root>/train/<class>/*.jpg and <root>/test/<class>/*.jpg (torchvision's ImageFolder layout)"


# ---------------------------------------------------------------------------------------- sources


def cache_dir() -> Path:
    """Where downloads and unpacked zips go: $FOODVIT_CACHE, else ~/.cache/foodvit."""
    return Path(os.environ.get("FOODVIT_CACHE") or Path.home() / ".cache" / "foodvit")


def default_source() -> str:
    return os.environ.get("FOODVIT_DATA") or DEFAULT_URL


def resolve(source: str | os.PathLike | None = None, *, timeout: float = 20.0, quiet: bool = False) -> Path:
    """A local folder for a source: downloads and unzips as needed, skipping what is cached."""
    source = str(source or default_source())
    if source.startswith(("http://", "https://")):
        return extract(download(source, timeout=timeout, quiet=quiet))
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data source {path} does not exist; expected a folder laid out as {LAYOUT}, a .zip of one, or a URL")
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise DataError(f"{path} is a file but not a zip; expected a folder laid out as {LAYOUT}, or a .zip of one")
        return extract(path)
    return path


def download(url: str, *, timeout: float = 20.0, quiet: bool = False) -> Path:
    """Download into the cache once. The file appears only when complete (temporary name, then rename)."""
    name = PurePosixPath(urllib.request.urlparse(url).path).name or "download"
    target = cache_dir() / "downloads" / f"{hashlib.sha1(url.encode()).hexdigest()[:10]}-{name}"
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


def extract(zip_path: Path) -> Path:
    """Unpack a zip into the cache (once) and return the folder holding train/ and test/.

    Members that would land outside the target (absolute paths, '..') are refused before anything
    is written; unpacking goes to a temporary folder that is renamed only when complete and laid
    out as expected, so a corrupt or wrongly laid out zip leaves nothing in the cache.
    """
    zip_path = Path(zip_path)
    stat = zip_path.stat()
    key = hashlib.sha1(f"{zip_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    target = cache_dir() / "data" / f"{zip_path.stem}-{key}"
    if target.is_dir():
        return _root_of(target, zip_path)
    try:
        with zipfile.ZipFile(zip_path) as archive:
            for member in archive.namelist():
                parts = PurePosixPath(member.replace("\\", "/")).parts
                if member.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    raise DataError(f"{zip_path} holds an unsafe member {member!r} (absolute or '..' path); refusing to unpack it")

            def unpack(tmp: Path) -> None:
                archive.extractall(tmp)
                _root_of(tmp, zip_path)  # laid out as expected, or nothing is kept

            atomic_folder(target, unpack)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError) as err:
        raise DataError(f"{zip_path} is a damaged zip ({type(err).__name__}: {err}); download it again or unpack it "
                        "yourself and pass the folder") from err
    return _root_of(target, zip_path)


def _root_of(folder: Path, origin: Path) -> Path:
    """The folder with train/ and test/ inside an unpacked zip (at the top or one level down)."""
    candidates = [folder] + sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    for candidate in candidates:
        if (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
    raise DataError(f"{origin} holds no train/ and test/ folders; expected a zip of {LAYOUT}")


# ---------------------------------------------------------------------------------------- photos


@dataclass(frozen=True)
class Split:
    """The photos of one split: (path, class index) pairs and the class names."""

    root: Path
    classes: tuple[str, ...]
    samples: tuple[tuple[Path, int], ...]
    skipped: tuple[str, ...] = ()  # "path: why" for each file left out as unreadable

    def __len__(self) -> int:
        return len(self.samples)

    def skipped_summary(self, verbose: bool = False) -> list[str]:
        """One line saying how many files were skipped (and, verbose, a line for each); [] if none."""
        if not self.skipped:
            return []
        first = self.skipped[0]
        more = "" if len(self.skipped) == 1 else f" and {len(self.skipped) - 1} more" + ("" if verbose else " (--verbose lists them)")
        lines = [f"skipped {len(self.skipped)} unreadable file(s) in {self.root}: {first}{more}"]
        return lines + [f"  {line}" for line in self.skipped[1:]] if verbose else lines

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(self.classes, 0)
        for _, label in self.samples:
            out[self.classes[label]] += 1
        return out


def class_names(folder: Path) -> tuple[str, ...]:
    """The class folders of a split, sorted (their index is the label)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder; expected {LAYOUT}")
    classes = tuple(sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not classes:
        raise DataError(f"{folder} has no class folders; expected {LAYOUT}")
    return classes


def scan(folder: Path, *, strict: bool = False, decode=None, quiet: bool = True) -> Split:
    """Find the classes (subfolders) and their photos; skip (or, strict, refuse) unreadable files.

    Each file's header is checked; with `decode` (the decode cache's get) each photo is also fully
    decoded, which catches truncated files and fills the cache in the same pass.
    """
    folder = Path(folder)
    classes = class_names(folder)
    files = [(path, index) for index, name in enumerate(classes) for path in _photo_files(folder / name)]
    samples, bad = [], []
    for path, index in tqdm(files, desc=f"reading {folder.name}/", disable=quiet or decode is None, leave=False):
        problem = check_image(path)
        if problem is None and decode is not None:
            try:
                decode(path)
            except PhotoError as err:  # the cache's loader says what it could not read
                problem = err.reason
        if problem:
            bad.append(f"{path}: {problem}")
        else:
            samples.append((path, index))
    for index, name in enumerate(classes):
        if not any(label == index for _, label in samples):
            raise DataError(f"class folder {folder / name} has no readable photos; add photos or remove the folder")
    if bad and strict:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise DataError(f"unreadable file {bad[0]}{more}; --strict refuses them (without it they are skipped)")
    return Split(folder, tuple(classes), tuple(samples), tuple(bad))


def _photo_files(folder: Path) -> list[Path]:
    """Every file under folder, sorted, leaving out hidden files and everything in hidden folders
    (.thumbs/, .ipynb_checkpoints/, ...)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


@dataclass(frozen=True)
class DataSet:
    """A source resolved to its train and test splits (and an optional validation split)."""

    root: Path
    train: Split
    test: Split
    val: Split | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train.classes


def open_dataset(source: str | os.PathLike | None = None, *, strict: bool = False, val_fraction: float = 0.0, seed: int = 0,
                 train_cache: "PhotoCache | None" = None, eval_cache: "PhotoCache | None" = None,
                 quiet: bool = False) -> DataSet:
    """Resolve a source and scan its train and test splits, filling the caches if given (which
    also fully decodes every photo, so unreadable ones are found before training starts)."""
    root = check_layout(resolve(source, quiet=quiet))
    train = scan(root / "train", strict=strict, decode=train_cache.get if train_cache else None, quiet=quiet)
    test = scan(root / "test", strict=strict, decode=eval_cache.get if eval_cache else None, quiet=quiet)
    if train.classes != test.classes:
        only_train = sorted(set(train.classes) - set(test.classes))
        only_test = sorted(set(test.classes) - set(train.classes))
        raise DataError(
            f"train and test classes differ in {root}: only in train/: {only_train or 'none'}; only in test/: {only_test or 'none'}; "
            "give both splits the same class folders"
        )
    val = None
    if val_fraction > 0:
        train, val = split_validation(train, val_fraction, seed)
    return DataSet(root, train, test, val)


def check_layout(root: Path) -> Path:
    """root, if it holds train/ and test/; else a DataError that says what is expected."""
    missing = [name for name in ("train", "test") if not (root / name).is_dir()]
    if missing:
        raise DataError(f"{root} has no {' or '.join(f'{m}/' for m in missing)} folder; training expects {LAYOUT}")
    return root


def open_split(source: str | None, split: str = "test", *, strict: bool = False) -> Split:
    """One split for evaluation: <root>/<split>/<class>/..., or a folder of class folders."""
    root = resolve(source)
    if (root / split).is_dir():
        return scan(root / split, strict=strict)
    if (root / "train").is_dir() or (root / "test").is_dir():
        raise DataError(f"{root} has no {split}/ folder; expected {LAYOUT}, or a folder whose subfolders are the classes")
    return scan(root, strict=strict)


def split_validation(train: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """Hold out `fraction` of each class (at least one photo) as a validation split, reproducibly."""
    if not 0 < fraction < 1:
        raise DataError(f"val_fraction must be between 0 and 1, got {fraction}")
    g = torch.Generator().manual_seed(derive_seed(seed, "validation"))
    keep, held = [], []
    for label in range(len(train.classes)):
        items = [s for s in train.samples if s[1] == label]
        order = torch.randperm(len(items), generator=g).tolist()
        n_val = max(1, round(fraction * len(items)))
        if n_val >= len(items):
            raise DataError(f"class {train.classes[label]} has {len(items)} photo(s): too few to hold out a validation share")
        held += [items[i] for i in order[:n_val]]
        keep += [items[i] for i in order[n_val:]]
    return Split(train.root, train.classes, tuple(sorted(keep))), Split(train.root, train.classes, tuple(sorted(held)))


# ---------------------------------------------------------------------------------------- datasets


class PhotoDataset(Dataset):
    """(image tensor, label) for each photo of a Split.

    Without a cache each photo is decoded and transformed on every access. With a PhotoCache the
    cache's value is transformed (train: a downsized decoded photo, augmented anew each time) or,
    when `transform` is None, used as is (eval: the finished tensor, computed once).
    """

    def __init__(self, split: Split, transform=None, cache: "PhotoCache | None" = None) -> None:
        if transform is None and cache is None:
            raise ValueError("PhotoDataset needs a transform, a cache, or both")
        self.split, self.transform, self.cache = split, transform, cache

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: int | tuple[int, int]):
        """item: an index, or (index, seed) from EpochSampler(per_sample_seeds=True): the photo's random
        augmentation is then drawn from that seed alone, whichever worker process runs it and
        whatever that worker did before."""
        index, seed = item if isinstance(item, tuple) else (item, None)
        path, label = self.split.samples[index]
        image = self.cache.get(path) if self.cache is not None else load_or_explain(path)
        if self.transform is None:
            return image, label
        if seed is None:
            return self.transform(image), label
        # In the training process, leave its random stream (dropout, ...) as it was. In a worker the
        # stream is reseeded for every photo, so what the collate function draws next (mixup, cutmix)
        # follows from the batch's last photo: deterministic too.
        # (The CPU generator alone: augmentation runs on the CPU, and torch.manual_seed, which also
        # seeds every accelerator, costs 100 times more, a third of a millisecond a photo.)
        cpu = torch.default_generator
        if get_worker_info() is not None:
            cpu.manual_seed(seed)
            return self.transform(image), label
        state = cpu.get_state()
        try:
            cpu.manual_seed(seed)
            return self.transform(image), label
        finally:
            cpu.set_state(state)


class PhotoCache:
    """Each photo processed once by `make` and, with keep=True, kept in memory, keyed by path.

    decoded(size, interpolation): uint8 (C, H, W) with the shorter side at most `size` px, for
    training, where the augmentation runs anew each epoch. transformed(transform): the finished
    input tensor, for evaluation, where the transform is deterministic. JPEG decoding dominates CPU
    time on small data sets; keeping pays it once per run. With keep=False every get() computes
    the same value anew: the cache on or off is the same experiment.
    """

    def __init__(self, make, keep: bool = True) -> None:
        self.make, self.keep = make, keep
        self.items: dict[Path, torch.Tensor] = {}

    @classmethod
    def decoded(cls, size: int, interpolation: str = "bilinear", keep: bool = True) -> "PhotoCache":
        return cls(DecodeDownsized(size, interpolation), keep)

    @classmethod
    def transformed(cls, transform, keep: bool = True) -> "PhotoCache":
        return cls(Transformed(transform), keep)

    def get(self, path: Path) -> torch.Tensor:
        value = self.items.get(path)
        if value is None:
            value = self.make(path)
            if self.keep:
                self.items[path] = value
        return value

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.items.values())


class DecodeDownsized:
    """A photo decoded (fully: truncated files fail here) and, if its shorter side is over `size`,
    resized down to it with the run's interpolation (Pillow): uint8 (C, H, W)."""

    def __init__(self, size: int, interpolation: str = "bilinear") -> None:
        self.size, self.interpolation = size, interpolation

    def __call__(self, path: Path) -> torch.Tensor:
        import numpy as np

        from .preprocess import resample_filter, shorter_side_to

        image = load_or_explain(path)
        if min(image.size) > self.size:
            image = image.resize(shorter_side_to(image.size, self.size), resample=resample_filter(self.interpolation))
        return torch.from_numpy(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).copy())


class Transformed:
    """A photo decoded and passed through a transform (the evaluation preprocessing)."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, path: Path) -> torch.Tensor:
        return self.transform(load_or_explain(path))


class EpochSampler(Sampler[int]):
    """A fresh permutation each epoch, drawn from (seed, epoch) alone, so a resumed run sees the
    same order as an uninterrupted one. repeats > 1 is repeated augmentation: each index that many
    times an epoch (Hoffer et al. 2020). per_sample_seeds=True yields (index, seed) pairs instead,
    one augmentation seed per position in the epoch, and PhotoDataset augments each photo from its
    seed: then neither which loader worker augments a photo nor how many workers there are (none
    included) changes a batch, and augmentation draws from a stream of its own (seeds.py)."""

    def __init__(self, n: int, seed: int, repeats: int = 1, per_sample_seeds: bool = False) -> None:
        self.n, self.seed, self.repeats, self.epoch = n, seed, repeats, 0
        self.per_sample_seeds = per_sample_seeds

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n * self.repeats

    def __iter__(self):
        g = torch.Generator().manual_seed(derive_seed(self.seed, "order", self.epoch))
        indices = torch.arange(self.n).repeat_interleave(self.repeats)
        order = indices[torch.randperm(len(indices), generator=g)].tolist()
        if not self.per_sample_seeds:
            return iter(order)
        first = derive_seed(self.seed, "augment", self.epoch)
        return iter((index, (first + position) % 2**63) for position, index in enumerate(order))


class MixingCollate:
    """Stack a batch, then mix it (mixup, cutmix): in the worker that made the batch. A class, not a
    closure, so that workers started by spawn or forkserver can receive it."""

    def __init__(self, mixer) -> None:
        self.mixer = mixer

    def __call__(self, batch):
        return self.mixer(*default_collate(batch))


def make_loader(dataset: Dataset, batch_size: int, *, train: bool, seed: int = 0, repeats: int = 1, workers: int = 0,
                mixer=None, pin_memory: bool = False) -> DataLoader:
    # Training augments each photo from its own seed (EpochSampler's per-sample seeds), so the
    # workers can stay up between epochs (starting them took longer than a whole epoch of a small
    # model on a GPU), a resumed run sees the same batches, and 0, 1 or 8 workers give the same photos.
    sampler = EpochSampler(len(dataset), seed, repeats, per_sample_seeds=True) if train else None
    collate = MixingCollate(mixer) if mixer is not None else None
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, shuffle=False, num_workers=workers, collate_fn=collate,
        pin_memory=pin_memory, drop_last=False, persistent_workers=train and workers > 0,
        generator=torch.Generator().manual_seed(derive_seed(seed, "augment")) if train else None,
    )
