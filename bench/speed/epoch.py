"""Is the data pipeline the bottleneck? One FoodVision Mini training epoch end to end (decoding,
augmentation, batching, step), timing inside the same epoch how long the step waits for batches.

    python -m bench.speed.epoch --recipes tiny default --data ../shared/data/pizza_steak_sushi
    python -m bench.speed.epoch --recipes tiny --no-cache-too      # also with the decode cache off

share in the model step = 1 - (seconds spent fetching batches) / (epoch seconds), both from the
same epochs, so that drift in the machine's speed between epochs cannot move it (goal: >= 90%).
As a cross-check the model step alone is also timed on the same batches held in memory
(model-only epochs alternate with end-to-end ones). Figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from foodvit.recipes import load_recipe
from foodvit.training.engine import train_one_epoch
from foodvit.training.trainer import Trainer


class TimedBatches:
    """Iterates a loader, adding up the seconds spent waiting for each batch."""

    def __init__(self, loader) -> None:
        self.loader, self.seconds = loader, 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        started = time.perf_counter()
        batches = iter(self.loader)  # starts the worker processes, if any: part of fetching
        self.seconds += time.perf_counter() - started
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
            yield batch


def epoch_seconds(trainer: Trainer, batches, state) -> float:
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    torch.manual_seed(0)
    started = time.perf_counter()
    train_one_epoch(trainer.model, batches, trainer.optimizer, None, trainer.settings)
    return time.perf_counter() - started


def measure(recipe: str, data: str | None, cache: bool, rounds: int, workers: int | None = None) -> dict:
    config = load_recipe(recipe)
    workers = config.data.workers if workers is None else workers
    config = replace(config, data=replace(config.data, source=data or config.data.source, cache=cache, workers=workers))
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        trainer = Trainer(config, Path(out), quiet=True)
        setup = time.perf_counter() - started
        state = copy.deepcopy({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()})
        trainer._before_epoch(0)
        held = list(trainer.train_loader)  # the same epoch's batches, already decoded and augmented
        e2e, fetch, model_only = [], [], []
        for _ in range(rounds):
            trainer._before_epoch(0)
            timed = TimedBatches(trainer.train_loader)
            e2e.append(epoch_seconds(trainer, timed, state))
            fetch.append(timed.seconds)
            model_only.append(epoch_seconds(trainer, held, state))
    shares = [1 - f / e for f, e in zip(fetch, e2e, strict=False)]
    return {
        "recipe": recipe,
        "cache": cache,
        "workers": workers,
        "images": sum(len(b[1]) for b in held),
        "setup_s": setup,
        "epoch_s": statistics.median(e2e),
        "fetch_s": statistics.median(fetch),
        "model_s": statistics.median(model_only),
        "share": statistics.median(shares),
        "share_min": min(shares),
        "share_max": max(shares),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["tiny", "default"])
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-cache-too", action="store_true", help="also measure with the decode cache off")
    parser.add_argument(
        "--workers", nargs="+", type=int, help="DataLoader worker processes to try (default: the recipe's)"
    )
    args = parser.parse_args(argv)
    from bench.results import machine

    print(f"{machine()} | {time.strftime('%Y-%m-%d')}")
    print(
        f"{'recipe':<10} {'cache':<5} {'workers':>7} {'images':>6} {'setup s':>8} {'epoch s':>8} {'fetch s':>8} "
        f"{'model share (min-max)':>22} {'model-only s':>13}"
    )
    for recipe, cache, workers in itertools.product(
        args.recipes, [True, False] if args.no_cache_too else [True], args.workers or [None]
    ):
        r = measure(recipe, args.data, cache, args.rounds, workers)
        share = f"{r['share']:.1%} ({r['share_min']:.1%}-{r['share_max']:.1%})"
        print(
            f"{recipe:<10} {str(cache):<5} {r['workers']:>7} {r['images']:>6} {r['setup_s']:>8.1f} "
            f"{r['epoch_s']:>8.2f} {r['fetch_s']:>8.2f} {share:>22} {r['model_s']:>13.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
