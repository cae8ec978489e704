"""A data source, parsed once: where the photos are, which classes are kept, and which share of
each training class. Every command that reads photos takes one (training, evaluate, data,
inspect, export's parity photos, the server's examples), so the rules live here once.

    DataSource.parse("food101:pizza,steak,sushi")     Food-101 (downloaded once), three classes
    DataSource.parse("/data/food-101:pizza,steak")    a local Food-101 folder, two classes
    DataSource.parse("/data/photos")                  a folder with train/<class>/ and test/<class>/
    DataSource.parse("photos.zip"), DataSource.parse("https://.../pizza_steak_sushi.zip")
    DataSource.parse(None)                            $FOODVIT_DATA, else the course's zip

No PyTorch (Food-101's download alone uses torchvision, imported then).
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from foodvit.data.folders import (
    Listing,
    Split,
    check,
    check_layout,
    is_food101,
    keep_classes,
    learnable,
    list_folder,
    list_split,
    subsample,
)
from foodvit.data.photos import named_as_photo
from foodvit.data.sources import (
    FOOD101,
    LAYOUT,
    cached_download,
    default_source,
    extract_download,
    food101_root,
    is_download,
    resolve,
)
from foodvit.errors import DataError
from foodvit.files import address_scheme


@dataclass(frozen=True)
class Listed:
    """A source's train and test files, listed but not yet checked or decoded (the classes are
    known from here on: the model's head can be built before any photo is read)."""

    root: Path
    train: Listing
    test: Listing

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train.classes


@dataclass(frozen=True)
class DataSource:
    location: str  # a URL of a zip, a local zip or folder, or "food101"
    classes: tuple[str, ...] | None = None  # the classes kept (all when None)
    train_fraction: float = 1.0  # the share of each training class used (drawn with the run's seed)
    _roots: dict = field(default_factory=dict, compare=False, repr=False)  # the resolved folder, once

    @classmethod
    def parse(cls, text: str | os.PathLike | None, train_fraction: float = 1.0) -> DataSource:
        """`LOCATION` or `LOCATION:class,class` (Food-101, downloaded or a local folder laid out as it);
        empty or None: the default source."""
        text = str(text or "") or default_source()
        scheme = address_scheme(text)
        if scheme and scheme not in ("http", "https"):
            where = urllib.parse.unquote(urllib.parse.urlparse(text).path) if scheme == "file" else ""
            raise DataError(
                f"{text}: only http:// and https:// addresses are downloaded; "
                + (f"for a file on this machine give its path: {where}" if where else "give a local path or such a URL")
            )
        head, sep, tail = text.rpartition(":")
        # a class list follows the last colon, after food101 or an existing path (never a URL's "//host")
        if (
            sep
            and head
            and "/" not in tail
            and "\\" not in tail
            and (head == FOOD101 or Path(head).expanduser().exists())
        ):
            names = tuple(n.strip() for n in tail.split(",") if n.strip())
            if not names:
                raise DataError(
                    f"{text!r} names no classes after the colon; write {head}:pizza,steak,sushi (or {head} for all)"
                )
            return cls(head, names, train_fraction)
        return cls(text, None, train_fraction)

    @classmethod
    def default(cls) -> DataSource:
        return cls.parse(None)

    def absolute(self) -> DataSource:
        """The same source with a path on this machine made absolute (against the working folder, its links kept):
        a run that stores it finds its photos again from any folder. An address and Food-101 stay as they are."""
        if self.location == FOOD101 or is_download(self.location):
            return self
        return DataSource(os.path.abspath(os.path.expanduser(self.location)), self.classes, self.train_fraction)

    def __str__(self) -> str:
        return self.location + (":" + ",".join(self.classes) if self.classes else "")

    @property
    def name(self) -> str:
        """The data set's name for people (a model card, a page), never a machine path:
        'pizza_steak_sushi' for a folder, zip or URL of that name, 'food101:pizza,steak'."""
        stem = PurePosixPath(self.location.replace("\\", "/").split("?")[0].rstrip("/")).name
        for suffix in (".zip", ".tar.gz", ".tgz", ".tar"):
            if stem.lower().endswith(suffix):
                stem = stem[: -len(suffix)]
        return stem + (":" + ",".join(self.classes) if self.classes else "")

    # ------------------------------------------------------------------ where the folder is

    def root(self, *, quiet: bool = False, timeout: float = 20.0) -> Path:
        """The local folder, downloading or unpacking it the first time."""
        if "root" not in self._roots:
            self._roots["root"] = resolve(self.location, timeout=timeout, quiet=quiet)
        return self._roots["root"]

    def is_missing(self) -> bool:
        """Whether the source names a local folder or zip that is not there (Food-101 and URLs are fetched when
        needed, never missing): a caller can then say what the source was for, before resolving it says only that
        a path does not exist."""
        return (
            self.location != FOOD101
            and not is_download(self.location)
            and not Path(self.location).expanduser().exists()
        )

    def root_at_hand(self) -> Path | None:
        """The local folder when no download is needed (a folder, a zip, a download or Food-101
        already in the cache), else None."""
        if "root" in self._roots:
            return self._roots["root"]
        if self.location == FOOD101:
            root = food101_root()
            return root if root.is_dir() else None
        if is_download(self.location):
            downloaded = cached_download(self.location)
            return extract_download(self.location, downloaded) if downloaded is not None else None
        path = Path(self.location).expanduser()
        return self.root() if path.exists() else None

    # ------------------------------------------------------------------ what it holds

    def listed(self, *, seed: int = 0, quiet: bool = False) -> Listed:
        """The train and test splits' files (the same classes in both), the class subset kept and
        train_fraction of each training class drawn with the seed."""
        root = self.root(quiet=quiet)
        try:
            check_layout(root)
        except DataError:
            if self.location != FOOD101 and (is_download(self.location) or Path(self.location).expanduser().is_file()):
                raise DataError(  # not the cache's folder it was unpacked into: the zip the user gave
                    f"{self.location} holds no train/ and test/ folders; expected a zip of {LAYOUT}"
                ) from None
            raise
        train, test = list_split(root, "train"), list_split(root, "test")
        if self.classes:  # the classes asked for alone: another class in one split only is no matter
            train, test = keep_classes(train, self.classes), keep_classes(test, self.classes)
        if train.classes != test.classes:
            only_train = sorted(set(train.classes) - set(test.classes))
            only_test = sorted(set(test.classes) - set(train.classes))
            raise DataError(
                f"train and test classes differ in {root}: only in train/: {only_train or 'none'}; only in test/: "
                f"{only_test or 'none'}; give both splits the same class folders"
            )
        learnable(train, root, self.classes)
        if self.train_fraction < 1:
            train = subsample(train, self.train_fraction, seed)
        return Listed(root, train, test)

    def listing(self, split: str = "test", root: Path | None = None) -> Listing:
        """One split's files, the class subset kept: <root>/<split>/<class>/..., Food-101's split, or,
        for a folder without train/ and test/, its class folders themselves."""
        root = root or self.root()
        if is_food101(root) or (root / split).is_dir():
            listing = list_split(root, split)
        elif (root / "train").is_dir() or (root / "test").is_dir():
            raise DataError(
                f"{root} has no {split}/ folder; expected {LAYOUT}, or a folder whose subfolders are the classes"
            )
        else:
            listing = list_folder(root)
        return keep_classes(listing, self.classes) if self.classes else listing

    def open_split(self, split: str = "test", *, strict: bool = False, quiet: bool = True) -> Split:
        """One split for evaluation, every photo checked (unreadable ones skipped, or refused with strict)."""
        return check(self.listing(split), strict=strict, quiet=quiet)

    def first_photos(self, per_class: int, split: str = "test", classes=None) -> list[Path]:
        """The first `per_class` photos (by name) of each class of a split (of `classes`, in their
        order, when given: [] unless the source has every one of them), when the source is at hand
        without a download; [] otherwise. For a page's examples and an export's parity check."""
        return [photo for photos in self.photos_by_class(per_class, split, classes).values() for photo in photos]

    def photos_by_class(self, per_class: int, split: str = "test", classes=None) -> dict[str, list[Path]]:
        """first_photos by class name: {class: its first photos}, {} where first_photos gives []. A photo's class is
        its class folder's name, which is not its parent's where the class keeps its photos in subfolders."""
        root = self.root_at_hand()
        if root is None:
            return {}
        try:
            listing = self.listing(split, root)
        except DataError:
            return {}
        wanted = list(classes) if classes is not None else list(listing.classes)
        if not set(wanted) <= set(listing.classes):
            return {}
        found = {}
        for name in wanted:
            label = listing.classes.index(name)
            photos = sorted(p for p, y in listing.files if y == label and named_as_photo(p))
            found[name] = photos[:per_class]
        return found
