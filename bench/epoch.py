"""Is the data pipeline the bottleneck? One FoodVision Mini training epoch end to end (decoding,
augmentation, batching, step) against the model-only time for the same batches held in memory.

    python bench/epoch.py --recipes tiny default --data ../shared/data/pizza_steak_sushi
    python bench/epoch.py --recipes tiny --no-cache-too      # also with the decode cache off

share = model-only seconds / end-to-end seconds: the part of an epoch spent in the model step
(goal: >= 90%). Rounds alternate end-to-end and model-only epochs; figures are medians.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from foodvit.config import load_recipe
from foodvit.engine import train_one_epoch
from foodvit.trainer import Trainer


def epoch_seconds(trainer: Trainer, batches, state) -> float:
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    torch.manual_seed(0)
    started = time.perf_counter()
    train_one_epoch(trainer.model, batches, trainer.optimizer, None, trainer.settings)
    return time.perf_counter() - started


def measure(recipe: str, data: str | None, cache: bool, rounds: int) -> dict:
    config = load_recipe(recipe)
    config = replace(config, data=replace(config.data, source=data or config.data.source, cache=cache))
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        trainer = Trainer(config, Path(out), quiet=True)
        setup = time.perf_counter() - started
        state = copy.deepcopy({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()})
        trainer._before_epoch(0)
        held = list(trainer.train_loader)  # the same epoch's batches, already decoded and augmented
        e2e, model_only = [], []
        for r in range(rounds):
            trainer._before_epoch(0)
            e2e.append(epoch_seconds(trainer, trainer.train_loader, state))
            model_only.append(epoch_seconds(trainer, held, state))
    e, m = statistics.median(e2e), statistics.median(model_only)
    return {"recipe": recipe, "cache": cache, "images": sum(len(b[1]) for b in held), "setup_s": setup,
            "epoch_s": e, "model_s": m, "share": m / e}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["tiny", "default"])
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-cache-too", action="store_true", help="also measure with the decode cache off")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from accuracy import machine

    print(f"{machine()} | {time.strftime('%Y-%m-%d')}")
    print(f"{'recipe':<10} {'cache':<5} {'images':>6} {'setup s':>8} {'epoch s':>8} {'model s':>8} {'model share':>12}")
    for recipe in args.recipes:
        for cache in ([True, False] if args.no_cache_too else [True]):
            r = measure(recipe, args.data, cache, args.rounds)
            print(f"{recipe:<10} {str(cache):<5} {r['images']:>6} {r['setup_s']:>8.1f} {r['epoch_s']:>8.2f} {r['model_s']:>8.2f} "
                  f"{r['share']:>11.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
