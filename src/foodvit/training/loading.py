"""A run's photos as the trainer reads them: the data listed (the first process of each machine
fetches the source), the splits opened and checked, the decode caches, and this process's loaders
(its share of each global training batch, its part of each evaluation split)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from foodvit.data.datasets import MemoryBudget, PhotoCache, PhotoDataset, leaked_test_photos, open_dataset
from foodvit.data.datasource import DataSource, Listed
from foodvit.data.preprocess import Preprocess
from foodvit.data.sampling import make_loader
from foodvit.data.transforms import batch_mixer, eval_transform, train_transform
from foodvit.data.validation import validation_pool
from foodvit.settings.run import RunConfig
from foodvit.training.distributed import Context

logger = logging.getLogger(__name__)

EVAL_BATCH_SIZE = 64  # evaluation batches at least this large: no gradients, so memory allows it


@dataclass
class Caches:
    """The decoded training photos (kept or not, decoded the same way) and, with the cache on, the
    evaluation photos' finished tensors."""

    train_photos: PhotoCache
    eval_photos: PhotoCache | None


def train_decode_size(p: Preprocess) -> int:
    """The shorter side training photos are decoded to: enough for the eval resize and for random
    resized crops to zoom in twofold without upsampling."""
    return max(p.resize_size, 2 * p.image_size)


def list_data(config: RunConfig, quiet: bool = False) -> Listed:
    """The data's files and classes (downloaded or unpacked into the cache the first time)."""
    return DataSource.parse(config.data.source, config.data.train_fraction).listed(seed=config.train.seed, quiet=quiet)


def open_data(
    config: RunConfig, preprocess: Preprocess, listed: Listed, *, quiet: bool, verbose: bool, main: bool
) -> tuple[Any, Caches]:
    """The splits, checked (what was skipped said once, by the main process), and the caches: with the
    cache on, photos decoded once, as far as the memory budget goes. Training photos are decoded and
    downsized the same way with the cache on or off: the cache changes the time a run takes, never
    what it computes."""
    c, p = config, preprocess
    budget = MemoryBudget(c.data.cache_gb)
    caches = Caches(
        PhotoCache.decoded(train_decode_size(p), p.interpolation, keep=c.data.cache, budget=budget),
        PhotoCache.transformed(eval_transform(p), budget=budget) if c.data.cache else None,
    )
    pool = validation_pool(c.data.validate_on, listed) if c.data.validate_on else None
    if pool is not None and main and not quiet:
        logger.info("validating on %s", pool.line())
    data = open_dataset(
        listed,
        pool=pool,
        strict=c.data.strict,
        val_fraction=c.data.val_fraction,
        seed=c.train.seed,
        train_cache=caches.train_photos if c.data.cache else None,
        eval_cache=caches.eval_photos,
        quiet=quiet,
    )
    if main:
        for split in (data.train, data.test) + ((data.val,) if pool is not None and data.val is not None else ()):
            for line in split.skipped_summary(verbose):
                logger.warning(line)
        if leaked := leaked_test_photos(data):  # said, not mended: the photos are the user's to move
            logger.warning(
                f"{len(leaked)} of the {len(data.test)} test photos are also training photos, byte for byte (e.g. "
                f"{min(leaked)}): the test accuracy counts photos the model learnt; remove them from one of the splits"
            )
    return data, caches


def train_loader(config: RunConfig, preprocess: Preprocess, data: Any, caches: Caches, ctx: Context):
    """This process's share of each global training batch, augmented (and mixed) as the settings say."""
    c, p = config, preprocess
    augment = train_transform(p, c.data.augment, c.data.scale_min, c.data.random_erasing)
    mixer = batch_mixer(len(data.classes), c.data.mixup, c.data.cutmix, c.data.mix_prob)
    return make_loader(
        PhotoDataset(data.train, augment, caches.train_photos),
        c.train.batch_size,
        train=True,
        seed=c.train.seed,
        repeats=c.data.repeated_aug,
        workers=c.data.workers,
        mixer=mixer,
        pin_memory=ctx.device.type == "cuda",
        rank=ctx.rank,
        world_size=ctx.world_size,
    )


def eval_loader(config: RunConfig, split, preprocess: Preprocess, caches: Caches, ctx: Context, own: bool):
    """This process's part of an evaluation split; from the cache when it holds this preprocessing's
    tensors (`own`: the run's own preprocessing)."""
    cached = caches.eval_photos is not None and own
    ds = PhotoDataset(split, None, caches.eval_photos) if cached else PhotoDataset(split, eval_transform(preprocess))
    # cached photos are finished tensors: workers, started at every evaluation, would only cost time
    return make_loader(
        ds,
        max(config.train.batch_size, EVAL_BATCH_SIZE),
        train=False,
        workers=0 if cached else config.data.workers,
        pin_memory=ctx.device.type == "cuda",
        rank=ctx.rank,
        world_size=ctx.world_size,
    )
