"""A folder of labelled photos as splits: the classes (subfolders), their photos checked one by
one (unreadable files skipped or, strict, refused). No PyTorch: evaluation with an exported model
scans folders without it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from .errors import DataError
from .photos import IMAGE_EXTENSIONS, PhotoError, check_image
from .sources import LAYOUT, resolve


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


def cv_folds(split: Split, k: int, seed: int) -> list[tuple[Split, Split]]:
    """k-fold cross-validation over a split: k (train, validation) pairs whose validation parts
    partition the photos (each photo validated exactly once), stratified by class (each class dealt
    round-robin over the folds in a seeded random order), reproducible from the seed."""
    import numpy as np

    from .seeds import derive_seed

    if not 2 <= k <= len(split):
        raise DataError(f"cross-validation needs 2 <= folds <= photos ({len(split)}), got {k}")
    rng = np.random.default_rng(derive_seed(seed, "validation", k))
    fold_of: dict[Path, int] = {}
    offset = 0
    for label in range(len(split.classes)):
        items = [path for path, y in split.samples if y == label]
        for rank, i in enumerate(rng.permutation(len(items))):
            fold_of[items[i]] = (offset + rank) % k  # continue the rotation across classes: folds stay balanced in size
        offset += len(items)
    folds = []
    for fold in range(k):
        held = tuple(s for s in split.samples if fold_of[s[0]] == fold)
        kept = tuple(s for s in split.samples if fold_of[s[0]] != fold)
        folds.append((Split(split.root, split.classes, kept), Split(split.root, split.classes, held)))
    return folds


def first_photos(source: str | Path | None, classes, per_class: int, split: str = "test") -> list[Path]:
    """The first `per_class` photos (by name) of each class in <source>/<split>/, when the source
    is a local folder at hand; [] otherwise (nothing is downloaded). For examples and parity checks."""
    folder = Path(source) / split if source else None
    if folder is None or not folder.is_dir():
        return []
    found = []
    for name in classes:
        photos = sorted(p for p in (folder / name).glob("*") if p.suffix.lower() in IMAGE_EXTENSIONS) if (folder / name).is_dir() else []
        found += photos[:per_class]
    return found
