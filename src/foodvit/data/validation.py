"""A validation source: photos of the run's classes from somewhere else than its own data, to judge and
choose by without reading the test split (`foodvit train --validate-on`, `foodvit cv --validate-on`).

    validation_pool("../photos/pizza_steak_sushi_validation", listed)   a folder of class folders
    validation_pool("../photos/pizza_steak_sushi_20_percent", listed)   a set with train/ and test/: both splits
    validation_pool("../photos/other/test:pizza,sushi", listed)         some of a folder's classes

A photo whose bytes are also in the run's data, in either of its splits, is dropped and counted: a larger
set that contains the training set (the course's 20% set holds FoodVision Mini's photos) can be given
whole, and what is left is what the model never saw. Only files of a size some training file has are
read to compare (a hash of their bytes), so a large training set costs little. No PyTorch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from foodvit.data.datasource import DataSource, Listed
from foodvit.data.folders import Listing, is_food101, list_folder, list_split
from foodvit.errors import DataError

POOL_LAYOUT = (
    "a folder of class folders (<root>/<class>/*.jpg), a set with train/ and test/ class folders, a .zip of either, "
    "a URL of one, or food101"
)


@dataclass(frozen=True)
class Pool:
    """The photos of a validation source the run may be judged on, labelled with the run's class indices,
    and those left out because their bytes are also in the run's data."""

    source: str  # as given
    listing: Listing  # classes: the run's (all of them, in its order); files of the source's classes only
    dropped: tuple[Path, ...]  # photos whose content is also in the run's data (either split)

    def keys(self) -> dict[Path, str]:
        """Each photo's name in a study or a run's validation.jsonl, 'class/file': the same photo has the same name
        whether the source was given as a folder of class folders or as the set it came from (two files of one
        name in a class, from two splits, keep their split's name in front: 'class/split__file')."""
        named: dict[Path, str] = {}
        taken: set[str] = set()
        for path, label in self.listing.files:
            key = f"{self.listing.classes[label]}/{path.name}"
            if key in taken:
                key = f"{self.listing.classes[label]}/" + "__".join(path.relative_to(self.listing.root).parts)
            named[path] = key
            taken.add(key)
        return named

    def line(self) -> str:
        """What the pool holds, for a log line and a report."""
        kept = len(self.listing.files)
        dropped = f"; {len(self.dropped)} dropped, their content also in the training data" if self.dropped else ""
        return f"{kept} photos of {self.source}{dropped}"


def validation_pool(text: str, listed: Listed) -> Pool:
    """The validation source `text` (a data source: a folder of class folders, a set with train/ and test/,
    whose photos of both splits count, or Food-101, optionally `:class,class`) as a Pool for the run whose data
    is `listed`: only the run's classes (another class is refused), its photos that are not in the run's data."""
    source = DataSource.parse(text)
    if source.is_missing():
        raise DataError(f"the validation source {text} does not exist; expected {POOL_LAYOUT}")
    root = source.root(quiet=True)
    if is_food101(root) or (root / "train").is_dir() or (root / "test").is_dir():
        parts = [list_split(root, split) for split in ("train", "test") if is_food101(root) or (root / split).is_dir()]
    elif not any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir()):
        raise DataError(f"the validation source {text} has no class folders; expected {POOL_LAYOUT}")
    else:
        parts = [list_folder(root)]
    wanted = set(source.classes or ())
    names = sorted({c for part in parts for c in part.classes if not wanted or c in wanted})
    unknown = sorted((set(names) | wanted) - set(listed.classes))
    if unknown:
        raise DataError(
            f"the validation source {text} has class(es) {', '.join(unknown)} that the training data has not "
            f"({', '.join(listed.classes)}); give a source of those classes, or name some after a colon "
            f"({source.location}:{','.join(c for c in names if c in listed.classes) or 'CLASS'})"
        )
    index = {name: i for i, name in enumerate(listed.classes)}
    # only the classes asked for (SOURCE:pizza,steak leaves the source's others out, the run's classes or not)
    files = [
        (path, index[part.classes[label]])
        for part in parts
        for path, label in part.files
        if part.classes[label] in names
    ]
    if not files:
        raise DataError(f"the validation source {text} holds no photos; give a folder with a folder of photos a class")
    dropped = shared_photos([path for path, _ in files], _all_files(listed))
    kept = tuple((path, label) for path, label in files if path not in dropped)
    if not kept:
        raise DataError(
            f"every photo of the validation source {text} is also in the training data ({len(dropped)} photos): "
            "give photos the model is not trained on"
        )
    return Pool(text, Listing(root, listed.classes, kept), tuple(path for path, _ in files if path in dropped))


def shared_photos(ours: Iterable[Path], theirs: Iterable[Path]) -> set[Path]:
    """The files of `ours` whose bytes are those of a file of `theirs`. A file is compared by its size first, then, if
    a file of the other side has that size, by its last TAIL bytes (JPEGs of one size often share their first
    kilobytes, a camera's header, but not their last ones), and read whole only when both match: a large data set,
    where sizes collide by the thousand, costs a look at its sizes and a few kilobytes of some files."""
    sizes, others = {path: _size(path) for path in ours}, {path: _size(path) for path in theirs}
    common = set(sizes.values()) & set(others.values())
    tails = {path: (size, _tail(path, size)) for path, size in sizes.items() if size in common}
    other_tails = {path: (size, _tail(path, size)) for path, size in others.items() if size in common}
    both = set(tails.values()) & set(other_tails.values())
    seen = {_digest(path) for path, key in other_tails.items() if key in both} - {""}
    return {path for path, key in tails.items() if key in both and _digest(path) in seen}


def _all_files(listed: Listed) -> Iterable[Path]:
    """The run's data, both splits, every file whatever its class (a class left out of the run is still its data)."""
    for split in ("train", "test"):
        try:
            yield from (path for path, _ in list_split(listed.root, split).files)
        except DataError:
            pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


TAIL = 4096  # bytes: what shared_photos reads of a file whose size another file has


def _tail(path: Path, size: int) -> bytes:
    """The last TAIL bytes of a file of `size` bytes (b'' when it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, size - TAIL))
            return f.read(TAIL)
    except OSError:
        return b""


def _digest(path: Path) -> str:
    """SHA-256 of a file's bytes ('' when it cannot be read: such a photo is left to the photo checks)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""
