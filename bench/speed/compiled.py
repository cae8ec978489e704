"""Does the step torch.compile builds with inductor learn what the eager step does, and how long does it take?
A recipe trained twice on the same photos and seed, once eager and once with --compile, each in a folder of its
own; every learning column of metrics.csv compared (losses, accuracies, learning rate). The localization loss is
set to weight 0.5 unless --set says otherwise, so that its wrapper and its random pairs are inside the compiled step.

    python -m bench.speed.compiled --data ../shared/data/pizza_steak_sushi
    python -m bench.speed.compiled --recipe default --epochs 3 --set guidance.weight=0

The suite traces the whole step through TorchDynamo and AOTAutograd and runs inductor on a small module
(tests/test_compiling.py); inductor's C++ for the whole step takes about half a minute of g++ on a cold cache,
so it is compared here. Exits 1 when a column differs beyond float noise (relative 1e-3, absolute 1e-4).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
from pathlib import Path

from bench.speed import DATA, settings

TIMING = ("seconds", "images_per_s", "model_share")


def learned(run: Path) -> list[dict[str, float]]:
    """metrics.csv's columns that say what the run learned (not how fast), one dict an epoch."""
    with (run / "metrics.csv").open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if k not in TIMING and v} for row in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DATA, help="a data source (default: $FOODVIT_DATA, else %(default)s)")
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.NAME=VALUE",
        help="a setting over the recipe and this script's own (drloc.weight=0.5, train.epochs=2), as JSON where "
        "it parses",
    )
    args = parser.parse_args(argv)
    import foodvit

    overrides: dict = {
        "data.source": args.data,
        "train.epochs": args.epochs,
        "train.seed": args.seed,
        "drloc.weight": 0.5,
        **settings(args.set),
    }
    runs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, compiled in (("eager", False), ("compiled", True)):
            start = time.perf_counter()
            foodvit.train(args.recipe, Path(tmp) / name, overrides={**overrides, "train.compile": compiled}, quiet=True)
            seconds[name] = time.perf_counter() - start
            runs[name] = learned(Path(tmp) / name)
    if [row.keys() for row in runs["eager"]] != [row.keys() for row in runs["compiled"]]:
        print(f"the two runs wrote other epochs or columns: eager {runs['eager']}, compiled {runs['compiled']}")
        return 1
    worst, where = 0.0, "every column equal as metrics.csv writes it"
    for epoch, (eager, compiled) in enumerate(zip(runs["eager"], runs["compiled"], strict=True), 1):
        for key in eager:
            gap = abs(compiled[key] - eager[key]) / max(abs(eager[key]) * 1e-3, 1e-4)  # 1 at the tolerance
            if not math.isfinite(gap):
                gap = math.inf
            if gap > worst:
                worst, where = gap, f"epoch {epoch} {key}: eager {eager[key]:.6g}, compiled {compiled[key]:.6g}"
    largest = "not finite" if math.isinf(worst) else f"{worst:.2f} of the tolerance"
    print(
        f"{args.recipe}, {len(runs['eager'])} epochs: eager {seconds['eager']:.1f} s, compiled "
        f"{seconds['compiled']:.1f} s (its first compilation included); largest difference {largest} ({where})"
    )
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
