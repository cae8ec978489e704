"""A folder of labelled photos as splits: the classes (subfolders), their photos checked one by
one (unreadable files skipped or, strict, refused). No PyTorch: evaluation with an exported model
scans folders without it."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from foodvit.data.photos import PhotoError, check_image, named_as_photo
from foodvit.data.sources import LAYOUT
from foodvit.errors import DataError
from foodvit.files import read_json
from foodvit.seeds import derive_seed


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
        more = (
            ""
            if len(self.skipped) == 1
            else f" and {len(self.skipped) - 1} more" + ("" if verbose else " (--verbose lists them)")
        )
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
    # hidden folders, and __MACOSX/ (the resource forks a zip made on a Mac holds beside its folders), are no classes
    classes = tuple(
        sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "__MACOSX")
    )
    if not classes:
        raise DataError(f"{folder} has no class folders; expected {LAYOUT}")
    for name in classes:  # a class name goes into model.json, the figures, the page: text, never raw bytes
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise DataError(
                f"the class folder {folder / shown} is named in bytes that are not UTF-8; rename it in UTF-8 "
                "(e.g. convmv -f latin1 -t utf-8)"
            ) from None
    return classes


@dataclass(frozen=True)
class Listing:
    """The files of one split and their class indices, not yet checked (a folder of class folders,
    or Food-101's meta/<split>.json)."""

    root: Path
    classes: tuple[str, ...]
    files: tuple[tuple[Path, int], ...]


def list_folder(folder: Path) -> Listing:
    """The classes (subfolders, sorted) of a folder and every file in them. A class is named by its folder's name in
    Unicode's composed form (NFC): a Mac's file system gives `crème` decomposed (NFD), a zip made elsewhere composed,
    and the two splits of one data set are one class each, as their reader sees them."""
    folder = Path(folder)
    on_disk: dict[str, str] = {}
    for name in class_names(folder):
        if (other := on_disk.setdefault(unicodedata.normalize("NFC", name), name)) != name:
            raise DataError(
                f"{folder} holds two class folders named {name!r} and {other!r}, which differ only in how their "
                "accents are written (decomposed and composed); merge them into one"
            )
    classes = tuple(sorted(on_disk))
    return Listing(
        folder,
        classes,
        tuple((path, index) for index, name in enumerate(classes) for path in _photo_files(folder / on_disk[name])),
    )


def is_food101(root: Path) -> bool:
    """Whether root is laid out as Food-101: images/<class>/<id>.jpg with meta/train.json and meta/test.json."""
    return (
        (root / "images").is_dir()
        and (root / "meta" / "train.json").is_file()
        and (root / "meta" / "test.json").is_file()
    )


def list_food101(root: Path, split: str) -> Listing:
    """A Food-101 split: meta/<split>.json maps each class to its photos' ids ("<class>/<id>"),
    the photos are images/<id>.jpg (the dataset's official split)."""
    meta = root / "meta" / f"{split}.json"
    try:
        entries = read_json(meta)
        if not isinstance(entries, dict) or not all(isinstance(v, list) for v in entries.values()):
            raise ValueError("expected an object of class -> list of photo ids")
    except (OSError, ValueError) as err:
        raise DataError(f"{meta} is not Food-101's split file ({err}); download the data set again") from None
    classes = tuple(sorted(entries))
    files = tuple(
        (root / "images" / f"{entry}.jpg", index) for index, name in enumerate(classes) for entry in entries[name]
    )
    return Listing(root / "images", classes, files)


def list_split(root: Path, split: str) -> Listing:
    """<root>/<split>/<class>/..., or Food-101's split when root is laid out as Food-101."""
    return list_food101(root, split) if is_food101(root) else list_folder(root / split)


def learnable(listing: Listing, root: Path, selected: tuple[str, ...] | None = None) -> Listing:
    """The training listing, if it has the two classes or more that a classifier needs; else a DataError that says
    what to change: the classes named after the data's colon (`selected`), or the class folders."""
    if len(listing.classes) >= 2:
        return listing
    held = f"one class ({listing.classes[0]})" if listing.classes else "no class"
    if selected:
        raise DataError(
            f"the data names {held} of {root}: a classifier learns to tell classes apart, so name two or more after "
            "the colon (e.g. food101:pizza,steak)"
        )
    raise DataError(
        f"{root} holds {held}: a classifier learns to tell classes apart, so give train/ and test/ a folder for each "
        "of at least two classes"
    )


def keep_classes(listing: Listing, names: tuple[str, ...]) -> Listing:
    """Only the named classes (re-indexed in sorted order), e.g. pizza, steak and sushi of Food-101."""
    unknown = [n for n in names if n not in listing.classes]
    if unknown:
        shown = ", ".join(listing.classes[:8]) + (
            f" ... ({len(listing.classes)} in all)" if len(listing.classes) > 8 else ""
        )
        raise DataError(f"no class {', '.join(unknown)} in {listing.root}; its classes are {shown}")
    kept = tuple(sorted(set(names)))
    index = {listing.classes.index(name): i for i, name in enumerate(kept)}
    return Listing(listing.root, kept, tuple((path, index[label]) for path, label in listing.files if label in index))


def shuffled_by_class(items, num_classes: int, seed: int, purpose: str, *keys: int) -> list[list[int]]:
    """For each class, the positions of its items ((path, label) pairs) in a seeded random order: the
    one rule behind every per-class draw (the training subset, the validation split, the folds)."""
    import numpy as np

    rng = np.random.default_rng(derive_seed(seed, purpose, *keys))
    orders = []
    for label in range(num_classes):
        positions = [i for i, (_, y) in enumerate(items) if y == label]
        orders.append([positions[i] for i in rng.permutation(len(positions))])
    return orders


def subsample(listing: Listing, fraction: float, seed: int) -> Listing:
    """A reproducible `fraction` of each class's photos (at least one), in the listing's order. The draw is among the
    files named as photos (IMAGE_EXTENSIONS); the others stay, for the check to name them as skipped (a class of six
    photos and six notes drew its share among all twelve, and could draw notes alone)."""
    if not 0 < fraction <= 1:
        raise DataError(f"the training fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return listing
    photos = [f for f in listing.files if named_as_photo(f[0])]
    chosen: set[tuple[Path, int]] = set()
    for order in shuffled_by_class(photos, len(listing.classes), seed, "subset"):
        chosen.update(photos[i] for i in order[: max(1, round(fraction * len(order))) if order else 0])
    kept = (f for f in listing.files if f in chosen or not named_as_photo(f[0]))
    return Listing(listing.root, listing.classes, tuple(kept))


def split_validation(train: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """Hold out `fraction` of each class (at least one photo) as a validation split, reproducibly."""
    if not 0 < fraction < 1:
        raise DataError(f"val_fraction must be between 0 and 1, got {fraction}")
    keep, held = [], []
    for label, order in enumerate(shuffled_by_class(train.samples, len(train.classes), seed, "validation")):
        n_val = max(1, round(fraction * len(order)))
        if n_val >= len(order):
            raise DataError(
                f"class {train.classes[label]} has {len(order)} photo(s): too few to hold out a validation share"
            )
        held += [train.samples[i] for i in order[:n_val]]
        keep += [train.samples[i] for i in order[n_val:]]
    return Split(train.root, train.classes, tuple(sorted(keep))), Split(train.root, train.classes, tuple(sorted(held)))


PROGRESS_FROM = 2000  # photos: reading fewer takes a second or two, without a progress bar


def check(
    listing: Listing, *, strict: bool = False, decode=None, quiet: bool = True, every_class: bool = True
) -> Split:
    """Each file's header checked (and, with `decode`, e.g. the decode cache's prefill, the photo
    fully decoded, which catches truncated files and fills the cache in the same pass); unreadable
    files are skipped (or, strict, refused). A class with no readable photo is refused, unless not
    `every_class` (a validation source may hold some of the classes)."""
    samples, bad = [], []
    files = listing.files
    show = not quiet and (decode is not None or len(files) >= PROGRESS_FROM)
    for path, index in tqdm(files, desc=f"reading {listing.root.name}/", disable=not show, leave=False, unit="photo"):
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
    present = {label for _, label in samples}
    if not every_class and not samples:
        raise DataError(f"{listing.root} has no readable photos; give a folder with a folder of photos a class")
    for index, name in enumerate(listing.classes):
        if index not in present and every_class:
            raise DataError(
                f"class folder {listing.root / name} has no readable photos; add photos or remove the folder"
            )
    if bad and strict:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise DataError(f"unreadable file {bad[0]}{more}; --strict refuses them (without it they are skipped)")
    return Split(listing.root, listing.classes, tuple(samples), tuple(bad))


def scan(folder: Path, *, strict: bool = False, decode=None, quiet: bool = True) -> Split:
    """A folder of class folders, every photo checked (see check)."""
    return check(list_folder(folder), strict=strict, decode=decode, quiet=quiet)


def _photo_files(folder: Path) -> list[Path]:
    """Every file under folder (walk_files), for the check to read or name as skipped."""
    return list(walk_files(folder, lambda entry: True))


def walk_photos(folder: Path) -> Iterator[Path]:
    """The photos under folder (named as photos, as training reads them; walk_files), one at a time. A link named as
    a photo that leads to nothing is listed, for its error to be reported."""
    return walk_files(folder, lambda entry: named_as_photo(entry.name) and _file_or_dead_link(entry))


def walk_files(folder: Path, keep: Callable[[os.DirEntry], bool], _seen: set[str] | None = None) -> Iterator[Path]:
    """The files under folder that `keep` keeps, one at a time in sorted path order, leaving out hidden files and
    everything in hidden folders (.thumbs/, .ipynb_checkpoints/, ...). Links are followed, to files and to folders,
    as torchvision's ImageFolder follows them (a folder reached twice is read once, under its first name in that
    order, so a loop of links ends); a link that leads nowhere is a file here. Lazy: one directory's names are held
    at a time, so a folder of millions of photos costs no more memory than its largest directory."""
    seen = set() if _seen is None else _seen
    real = os.path.realpath(folder)
    if real in seen:  # reached again through a link
        return
    seen.add(real)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise DataError(f"cannot list {folder} ({err.strerror or err}); check that it exists and is readable") from None
    for entry in entries:  # sorted by name, folders in place: the same order as sorting the whole paths
        if entry.name.startswith("."):
            continue
        try:
            inside = entry.is_dir()
        except OSError:  # a loop of links: "Too many levels of symbolic links", a file here
            inside = False
        if inside:
            yield from walk_files(Path(entry.path), keep, seen)
        elif keep(entry):
            yield Path(entry.path)


def _file_or_dead_link(entry: os.DirEntry) -> bool:
    """Whether a folder's entry is a file, or a symbolic link that leads to nothing (to a file deleted since, or back
    to itself): such a link is listed as a photo too, so that the photo's error says what it is, never a silent gap."""
    try:
        if entry.is_file():
            return True
    except OSError:  # a loop of links: "Too many levels of symbolic links"
        return entry.is_symlink()
    return entry.is_symlink() and not os.path.exists(entry.path)


def check_layout(root: Path) -> Path:
    """root, if it holds train/ and test/ (or is laid out as Food-101); else a DataError that says what is expected."""
    if is_food101(root):
        return root
    missing = [name for name in ("train", "test") if not (root / name).is_dir()]
    if missing:
        raise DataError(f"{root} has no {' or '.join(f'{m}/' for m in missing)} folder; training expects {LAYOUT}")
    return root


def cv_folds(split: Split, k: int, seed: int) -> list[tuple[Split, Split]]:
    """k-fold cross-validation over a split: k (train, validation) pairs whose validation parts
    partition the photos (each photo validated exactly once), stratified by class (each class dealt
    round-robin over the folds in a seeded random order), reproducible from the seed."""
    if not 2 <= k <= len(split):
        raise DataError(f"cross-validation needs 2 <= folds <= photos ({len(split)}), got {k}")
    fold_of: dict[Path, int] = {}
    offset = 0
    for order in shuffled_by_class(split.samples, len(split.classes), seed, "validation", k):
        for rank, i in enumerate(order):
            # continue the rotation across classes: folds stay balanced in size
            fold_of[split.samples[i][0]] = (offset + rank) % k
        offset += len(order)
    folds = []
    for fold in range(k):
        held = tuple(s for s in split.samples if fold_of[s[0]] == fold)
        kept = tuple(s for s in split.samples if fold_of[s[0]] != fold)
        folds.append((Split(split.root, split.classes, kept), Split(split.root, split.classes, held)))
    return folds
