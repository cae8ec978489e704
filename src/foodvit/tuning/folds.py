"""A study's photos and their folds: the training split of a config's data (the test split never
listed), each photo's key (the same in every study of the same photos, so two studies pair photo by
photo), the photos' fingerprint, and the k folds of a seed as folders of links:

    STUDY/folds/seed-S/fold-K/{train,test}/<class>/...   train = the kept folds, test = the held-out one
    STUDY/fold-K/             the fold's run (STUDY/seed-S/fold-K/ with several seeds; fold_name)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from foodvit.config import RunConfig
from foodvit.data.datasource import DataSource
from foodvit.data.folders import Split, check, cv_folds, keep_classes, learnable, list_split
from foodvit.errors import StudyError
from foodvit.files import atomic_folder


def training_photos(config: RunConfig) -> Split:
    """The training split of the config's data source (class subset kept), every photo checked;
    the test split is not touched, not even listed."""
    source = DataSource.parse(config.data.source)
    root = source.root(quiet=True)
    listing = list_split(root, "train")
    if source.classes:
        listing = keep_classes(listing, source.classes)
    return check(learnable(listing, root, source.classes), strict=config.data.strict)


def photo_key(split: Split, path: Path) -> str:
    """A photo's name in a study, 'class/file' (a nested file's folders joined by '__'): the same
    photo has the same key in every study of the same data, so two studies pair photo by photo."""
    parts = Path(path).relative_to(split.root).parts
    return parts[0] + "/" + "__".join(parts[1:])


def fingerprint(split: Split) -> str:
    """Which photos a study is about: their keys and sizes (moving the folder changes nothing)."""
    digest = hashlib.sha256()
    for path, label in sorted(split.samples):
        digest.update(f"{split.classes[label]}:{photo_key(split, path)}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def check_folds(split: Split, k: int) -> None:
    """Every class must have a photo in every held-out fold, else a fold's run sees a class with no test photo."""
    if k < 2:
        raise StudyError(f"cross-validation needs at least 2 folds, got {k}")
    fewest = min(split.counts().values(), default=0)
    for name, n in split.counts().items():
        if n < 2:
            raise StudyError(
                f"class {name} has {n} training photo(s): every fold holds out at least one photo of each class, "
                f"so cross-validation needs at least 2 photos of each; add photos of {name}, or leave the class out"
            )
        if n < k:
            raise StudyError(
                f"class {name} has {n} training photo(s), fewer than the {k} folds: every fold holds out at "
                f"least one photo of each class; use --folds {fewest} or fewer, or add photos"
            )


def fold_folder(folds_dir: Path, seed: int, fold: int) -> Path:
    """The folder of links (train/, test/) of one fold of one seed, under a study's folds/."""
    return folds_dir / f"seed-{seed}" / f"fold-{fold}"


def fold_folders(split: Split, k: int, seed: int, where: Path) -> list[Path]:
    """One folder per fold, train/ = the other folds, test/ = this one, of links to the photos;
    made once (in a temporary folder renamed into place, so a concurrent or killed maker leaves
    no half folder) and reused by every run on the same seed."""
    folders = []
    for index, (kept, held) in enumerate(cv_folds(split, k, seed)):
        folder = fold_folder(where, seed, index)
        folders.append(folder)
        if folder.is_dir():
            continue

        def fill(tmp: Path, kept=kept, held=held) -> None:
            for name, part in (("train", kept), ("test", held)):
                for path, _ in part.samples:
                    link = tmp / name / photo_key(split, path)
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(Path(path).resolve())

        try:
            atomic_folder(folder, fill)  # a killed or failed maker leaves nothing behind
        except OSError:  # another process made it first: theirs holds the same links
            if not folder.is_dir():
                raise
    return folders


def fold_name(seed: int, fold: int, seeds: int) -> str:
    """The run of one fold inside a study of `seeds` seeds (its result beside it, NAME.json)."""
    return f"fold-{fold}" if seeds == 1 else f"seed-{seed}/fold-{fold}"
