"""The data layer for training: a source opened as train/test (and validation) splits, the
datasets, caches, sampling and loaders (PyTorch).

Its torch-free parts live beside it and are re-exported here: sources.py (download, unzip, the
cache), folders.py (a folder of class folders scanned into a Split), photos.py (decoding one
photo safely).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from .errors import DataError
from .folders import Split, check_layout, class_names, open_split, scan  # noqa: F401  (re-exported)
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
from .sources import DEFAULT_URL, LAYOUT, cache_dir, default_source, download, extract, resolve  # noqa: F401  (re-exported)


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
