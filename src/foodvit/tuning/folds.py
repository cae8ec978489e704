"""A study's photos and what each of its runs trains on and is judged on: the training split of a config's
data (the test split never listed), each photo's key (the same in every study of the same photos, so two
studies pair photo by photo), the photos' fingerprint, and the folders of links its runs read:

    STUDY/folds/seed-S/fold-K/{train,test}/<class>/...   k-fold CV: train = the kept folds, test = the held-out one
    STUDY/fold-K/             the fold's run (STUDY/seed-S/fold-K/ with several seeds; fold_name)
    STUDY/folds/pool/{train,test}/<class>/...   a validation pool: train = every training photo, test = the pool
    STUDY/seed-S/             a run of the pool study, one a seed
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from foodvit.data.datasource import DataSource
from foodvit.data.folders import Split, check, cv_folds, keep_classes, learnable, list_split
from foodvit.data.validation import Pool, validation_pool
from foodvit.errors import StudyError
from foodvit.files import atomic_folder
from foodvit.settings.run import RunConfig


def training_photos(config: RunConfig) -> Split:
    """The training split of the config's data source (class subset kept), every photo checked;
    the test split is not touched, not even listed."""
    source = DataSource.parse(config.data.source)
    root = source.root(quiet=True)
    listing = list_split(root, "train")
    if source.classes:
        listing = keep_classes(listing, source.classes)
    split = check(learnable(listing, root, source.classes), strict=config.data.strict)
    named: dict[str, Path] = {}
    for path, _ in split.samples:  # a study knows a photo by its key, and links it under that name
        if (other := named.setdefault(photo_key(split, path), path)) != path:
            raise StudyError(
                f"{other} and {path} have one name in a study ({photo_key(split, path)}: a nested photo's folders "
                "are joined by '__'); rename one of them"
            )
    return split


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
    made once and reused by every run on the same seed (made again where the photos have moved: link_folder)."""
    folders = []
    for index, (kept, held) in enumerate(cv_folds(split, k, seed)):
        folder = fold_folder(where, seed, index)
        folders.append(folder)
        links = {
            Path(name) / photo_key(split, path): path
            for name, part in (("train", kept), ("test", held))
            for path, _ in part.samples
        }
        link_folder(folder, links)
    return folders


def link_folder(folder: Path, links: dict[Path, Path]) -> None:
    """`folder` holding a link at each relative path of `links` to its photo; made in a temporary folder renamed into
    place (a concurrent or killed maker leaves no half folder), kept where it already holds these links, and made
    again where it does not: the study's photos moved (cv --data NEW_PLACE), its links left pointing at the old
    place."""
    targets = {where: str(Path(photo).resolve()) for where, photo in links.items()}
    if folder.is_dir():
        if all((folder / where).is_symlink() and os.readlink(folder / where) == to for where, to in targets.items()):
            return
        shutil.rmtree(folder)

    def fill(tmp: Path) -> None:
        for where, to in targets.items():
            (tmp / where).parent.mkdir(parents=True, exist_ok=True)
            (tmp / where).symlink_to(to)

    try:
        atomic_folder(folder, fill)  # a killed or failed maker leaves nothing behind
    except OSError:  # another process made it first: theirs holds the same links
        if not folder.is_dir():
            raise


def fold_name(seed: int, fold: int, seeds: int) -> str:
    """The run of one fold inside a study of `seeds` seeds (its result beside it, NAME.json)."""
    return f"fold-{fold}" if seeds == 1 else f"seed-{seed}/fold-{fold}"


def run_name(seed: int, fold: int, seeds: int, pool: bool) -> str:
    """A run of a study of `seeds` seeds: a pool study's seed-S (one run a seed), else its fold's (fold_name)."""
    return f"seed-{seed}" if pool else fold_name(seed, fold, seeds)


@dataclass(frozen=True)
class Unit:
    """One run of a study: its seed, its fold (0 in a pool study), the folder of links it trains and is judged on,
    and its run's name in the study (its result beside it, NAME.json)."""

    seed: int
    fold: int
    folder: Path
    name: str


def study_units(
    split: Split, folds: int, seeds: list[int], folds_dir: Path, pool: tuple[Pool, Split] | None = None
) -> list[Unit]:
    """The runs of a study, seed by seed: k folds each (CV), or, with a pool (pool_photos), one run a seed on every
    training photo, judged on the pool. folds_dir: the study's folder of folders of links (STUDY/folds)."""
    if pool is not None:
        folder = pool_folder(split, pool[1], folds_dir / "pool", pool[0].keys())
        return [Unit(seed, 0, folder, run_name(seed, 0, len(seeds), pool=True)) for seed in seeds]
    return [
        Unit(seed, index, folder, run_name(seed, index, len(seeds), pool=False))
        for seed in seeds
        for index, folder in enumerate(fold_folders(split, folds, seed, folds_dir))
    ]


def pool_photos(config: RunConfig, split: Split) -> tuple[Pool, Split]:
    """The config's validation source (data.validate_on) as a pool study judges on it: the Pool (its photos also in
    the training data dropped and counted) and its photos, checked, keyed as Pool.keys names them."""
    source = DataSource.parse(config.data.source)
    pool = validation_pool(config.data.validate_on, source.listed(quiet=True))
    checked = check(pool.listing, strict=config.data.strict, every_class=False)
    return pool, checked


def pool_fingerprint(pool: Pool, checked: Split) -> str:
    """Which photos a pool study is judged on: their names and sizes."""
    keys = pool.keys()
    digest = hashlib.sha256()
    for path, _ in sorted(checked.samples, key=lambda sample: keys[sample[0]]):
        digest.update(f"{keys[path]}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def pool_folder(split: Split, pool: Split, where: Path, keys: dict[Path, str]) -> Path:
    """The folder of links a pool study's runs read: train/ every training photo, test/ every photo of the pool
    (named by `keys`, 'class/file'); made once, as fold_folders makes a fold's."""
    links = {Path("train") / photo_key(split, path): path for path, _ in split.samples}
    links |= {Path("test") / keys[path]: path for path, _ in pool.samples}
    link_folder(where, links)
    return where

    def fill(tmp: Path) -> None:
        for path, _ in split.samples:
            link = tmp / "train" / photo_key(split, path)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path(path).resolve())
        for path, _ in pool.samples:
            link = tmp / "test" / keys[path]
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path(path).resolve())

    try:
        atomic_folder(where, fill)
    except OSError:  # another process made it first: theirs holds the same links
        if not where.is_dir():
            raise
    return where
