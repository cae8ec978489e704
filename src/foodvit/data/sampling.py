"""Which photos each step sees, and on which process: the epoch's order, the global batches cut
into one share per rank, and the loaders.

The order and each photo's augmentation seed follow from (run seed, epoch) alone (seeds.py), never
from the number of processes: the global batch of step i is the same photos, augmented the same
way, on 1 or N processes; rank r trains on the r-th contiguous share of it. Evaluation splits the
photos into one contiguous part per rank, without padding, so every photo counts exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from foodvit.seeds import derive_seed
from foodvit.torchrun import cores

logger = logging.getLogger(__name__)


class EpochSampler(Sampler[int]):
    """A fresh permutation each epoch, drawn from (seed, epoch) alone, so a resumed run sees the
    same order as an uninterrupted one. repeats > 1 is repeated augmentation: each index that many
    times an epoch (Hoffer et al. 2020). per_sample_seeds=True yields (index, seed) pairs instead,
    one augmentation seed per position in the epoch, and PhotoDataset augments each photo from its
    seed: then neither which loader worker or which process augments a photo nor how many there
    are changes it, and augmentation draws from a stream of its own (seeds.py)."""

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


def share(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous share of n items (shares differ in size by at most one)."""
    return n * rank // world_size, n * (rank + 1) // world_size


def single_photo_share(n: int, batch_size: int, world_size: int = 1) -> bool:
    """Whether an epoch of n items in global batches of batch_size gives some rank a share of
    exactly one photo in some step (ShardedBatchSampler's cut): batch norm cannot train on it where
    its feature map is 1 x 1."""
    full, last = divmod(n, batch_size)
    sizes = ([batch_size] if full else []) + ([last] if last else [])
    return any(
        stop - start == 1 for size in sizes for start, stop in (share(size, r, world_size) for r in range(world_size))
    )


class ShardedBatchSampler(Sampler[list]):
    """Global batches of `batch_size` from `sampler`, each cut into world_size contiguous shares;
    yields this rank's share of each. A share may be empty (a last batch smaller than the number of
    ranks): the rank still takes part in the step with no photos, and the collate function gives
    None for it."""

    def __init__(self, sampler: EpochSampler, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        self.sampler, self.batch_size, self.rank, self.world_size = sampler, batch_size, rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        batch = []
        for item in self.sampler:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self._mine(batch)
                batch = []
        if batch:
            yield self._mine(batch)

    def _mine(self, batch: list) -> list:
        start, stop = share(len(batch), self.rank, self.world_size)
        return batch[start:stop]


class Collate:
    """Stack a batch, then mix it (mixup, cutmix) if a mixer is given: in the worker that made the
    batch. An empty share becomes None. A class, not a closure, so that workers started by spawn or
    forkserver can receive it."""

    def __init__(self, mixer=None) -> None:
        self.mixer = mixer

    def __call__(self, batch):
        if not batch:
            return None
        stacked = default_collate(batch)
        return self.mixer(*stacked) if self.mixer is not None else stacked


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    train: bool,
    seed: int = 0,
    repeats: int = 1,
    workers: int = 0,
    mixer=None,
    pin_memory: bool = False,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """The loader of this rank. Training: `batch_size` is the global batch, of which this rank
    loads its share (ShardedBatchSampler). Evaluation: this rank's contiguous part of the photos,
    in order.

    Training augments each photo from its own seed (EpochSampler's per-sample seeds), so the
    workers stay up between epochs (starting them took longer than a whole epoch of a small model
    on a GPU), a resumed run sees the same batches, and 0, 1 or 8 workers give the same photos; so
    at most one a core is started (each is a process: --workers 100000 took the machine's memory)."""
    if workers > (here := cores()):
        logger.info("--workers %d: %d worker processes are started, one a core (more add only memory)", workers, here)
        workers = here
    common: dict[str, Any] = dict(num_workers=workers, pin_memory=pin_memory, collate_fn=Collate(mixer))
    n = len(cast(Sized, dataset))  # a map-style dataset has a length; torch's Dataset does not declare it
    if train:
        batches = ShardedBatchSampler(
            EpochSampler(n, seed, repeats, per_sample_seeds=True), batch_size, rank, world_size
        )
        return DataLoader(
            dataset,
            batch_sampler=batches,
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(derive_seed(seed, "augment")),
            **common,
        )
    start, stop = share(n, rank, world_size)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=range(start, stop), shuffle=False, drop_last=False, **common
    )
