"""The data sets a run trains and evaluates on (PyTorch): a DataSource opened as train/test (and
validation) splits, the photos as tensors, and the in-memory cache of decoded photos.

The rest of the data layer, one concern a module: datasource.py (a source parsed once),
sources.py (download, unzip, Food-101), folders.py (a split's files listed, subset and checked),
photos.py (decoding one photo safely), preprocess.py (a photo at evaluation, Pillow + NumPy),
transforms.py (augmentation), sampling.py (which photos each step and each process sees).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, get_worker_info

from foodvit.data.datasource import DataSource, Listed
from foodvit.data.folders import Split, check, split_validation
from foodvit.data.photos import decodes_whole, load_or_explain
from foodvit.data.validation import Pool, shared_photos


@dataclass(frozen=True)
class DataSet:
    """A source resolved to its train and test splits (and an optional validation split)."""

    root: Path
    train: Split
    test: Split
    val: Split | None = None
    pool: Pool | None = None  # where val comes from when it is a validation source (--validate-on)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train.classes


def open_dataset(
    source: DataSource | Listed | str | os.PathLike | None = None,
    *,
    strict: bool = False,
    val_fraction: float = 0.0,
    seed: int = 0,
    train_fraction: float = 1.0,
    train_cache: PhotoCache | None = None,
    eval_cache: PhotoCache | None = None,
    quiet: bool = False,
    pool: Pool | None = None,
) -> DataSet:
    """Check a source's train and test splits (a DataSource, its text, or what DataSource.listed made
    of it), filling the caches if given (which also fully decodes the photos they keep, so unreadable
    ones are found before training starts). With a text, train_fraction keeps that share of each
    training class (a DataSource carries its own). pool: a validation source's photos (data/validation.py),
    checked as the test split is, as the validation split."""
    if not isinstance(source, (DataSource, Listed)):
        source = DataSource.parse(source, train_fraction)
    listed = source if isinstance(source, Listed) else source.listed(seed=seed, quiet=quiet)
    # every photo decoded whole once: kept by a cache, or checked alone (the same photos skipped, cache on or off)
    train_check = train_cache.prefill if train_cache else decodes_whole
    train = check(listed.train, strict=strict, decode=train_check, quiet=quiet)
    test = check(listed.test, strict=strict, decode=eval_cache.prefill if eval_cache else decodes_whole, quiet=quiet)
    val = None
    if val_fraction > 0:
        train, val = split_validation(train, val_fraction, seed)
    if pool is not None:
        decode = eval_cache.prefill if eval_cache else decodes_whole
        val = check(pool.listing, strict=strict, decode=decode, quiet=quiet, every_class=False)
    return DataSet(listed.root, train, test, val, pool)


def leaked_test_photos(data: DataSet) -> set[Path]:
    """The test photos whose bytes are those of a training photo (data/validation.shared_photos): the test
    accuracy counts them as photos the model never saw."""
    return shared_photos([path for path, _ in data.test.samples], [path for path, _ in data.train.samples])


# ---------------------------------------------------------------------------------------- datasets


class PhotoDataset(Dataset):
    """(image tensor, label) for each photo of a Split.

    Without a cache each photo is decoded and transformed on every access. With a PhotoCache the
    cache's value is transformed (train: a downsized decoded photo, augmented anew each time) or,
    when `transform` is None, used as is (eval: the finished tensor, computed once).
    """

    def __init__(self, split: Split, transform=None, cache: PhotoCache | None = None) -> None:
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


class MemoryBudget:
    """Bytes the caches may keep, shared between them (train and evaluation photos)."""

    def __init__(self, gib: float) -> None:
        self.left = int(min(gib, 2.0**40) * 2**30)  # past any machine's memory (1e300 GiB overflowed int())

    def take(self, nbytes: int) -> bool:
        if nbytes > self.left:
            return False
        self.left -= nbytes
        return True


class PhotoCache:
    """Each photo processed once by `make` and, with keep=True, kept in memory (keyed by path) for as
    long as the memory budget lasts; photos past it are processed anew each time they are used.

    decoded(size, interpolation): uint8 (C, H, W) with the shorter side at most `size` px, for
    training, where the augmentation runs anew each epoch. transformed(transform): the finished
    input tensor, for evaluation, where the transform is deterministic. JPEG decoding dominates CPU
    time on small data sets; keeping pays it once per run. With keep=False every get() computes
    the same value anew: the cache on or off (or full) is the same experiment.
    """

    def __init__(self, make, keep: bool = True, budget: MemoryBudget | None = None) -> None:
        self.make, self.keep, self.budget = make, keep, budget
        self.items: dict[Path, torch.Tensor] = {}
        self.full = not keep

    @classmethod
    def decoded(
        cls, size: int, interpolation: str = "bilinear", keep: bool = True, budget: MemoryBudget | None = None
    ) -> PhotoCache:
        return cls(DecodeDownsized(size, interpolation), keep, budget)

    @classmethod
    def transformed(cls, transform, keep: bool = True, budget: MemoryBudget | None = None) -> PhotoCache:
        return cls(Transformed(transform), keep, budget)

    def get(self, path: Path) -> torch.Tensor:
        value = self.items.get(path)
        if value is None:
            value = self.make(path)
            if not self.full:
                if self.budget is None or self.budget.take(value.numel() * value.element_size()):
                    self.items[path] = value
                else:
                    self.full = True
        return value

    def prefill(self, path: Path) -> None:
        """Process and keep a photo while there is room (the scan's pass over the photos). Past it, or with
        keep=False, the photo is only checked (photos.decodes_whole): one that cannot be decoded is skipped by the
        scan as a kept one is, not met in the middle of an epoch, which it would end."""
        if not self.full:
            self.get(path)
        else:
            decodes_whole(path)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.items.values())


class DecodeDownsized:
    """A photo decoded (fully: truncated files fail here) and, if its shorter side is over `size`,
    resized down to it with the run's interpolation (Pillow): uint8 (C, H, W)."""

    def __init__(self, size: int, interpolation: str = "bilinear") -> None:
        self.size, self.interpolation = size, interpolation

    def __call__(self, path: Path) -> torch.Tensor:
        import numpy as np

        from foodvit.data.preprocess import resample_filter, shorter_side_to

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
