"""Per-image test accuracy of a recipe over several seeds: mean, spread, per class, wall time.

    python bench/accuracy.py --recipe default --seeds 3
    python bench/accuracy.py --recipe course --seeds 3 --data ../shared/data/pizza_steak_sushi
    python bench/accuracy.py --recipe default --seeds 3 -- --epochs 50 --augment strong   # any train option after --

Each seed is a full `foodvit train` run in --out/<recipe>-s<seed>; nothing is chosen by test
accuracy (the runs report their last epoch). Prints a table, and --json writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from foodvit.cli import main as foodvit


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}"


def run_seeds(recipe: str, seeds: list[int], out: Path, data: str | None, extra: list[str], val_only: bool = False) -> dict:
    rows = []
    for seed in seeds:
        run = out / f"{Path(recipe).stem}-s{seed}"
        args = ["train", "--recipe", recipe, "--seed", str(seed), "--out", str(run), "--quiet", *extra]
        if data:
            args += ["--data", data]
        if (run / "model.json").is_file():
            print(f"seed {seed}: reusing finished run {run}", file=sys.stderr)
        else:
            started = time.perf_counter()
            code = foodvit(args)
            if code != 0:
                raise SystemExit(f"seed {seed} failed (exit {code})")
            print(f"seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        card = json.loads((run / "model.json").read_text())
        metrics = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
        header, last = metrics[0], dict(zip(metrics[0], metrics[-1]))
        seconds = sum(float(dict(zip(header, m))["seconds"]) for m in metrics[1:])
        per_class = _per_class(run) if not val_only else {}
        rows.append({"seed": seed, "test_acc": None if val_only else card["metrics"]["test_acc"], "test_n": card["metrics"]["test_n"],
                     "val_acc": float(last["val_acc"]) if last.get("val_acc") else None, "seconds": seconds, "per_class": per_class})
    accs = [r["val_acc"] if val_only else r["test_acc"] for r in rows]
    return {
        "recipe": recipe, "extra": extra, "data": data, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
        "seeds": rows, "mean": statistics.mean(accs), "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "min": min(accs), "max": max(accs), "mean_seconds": statistics.mean(r["seconds"] for r in rows),
    }


def _per_class(run: Path) -> dict[str, float]:
    from foodvit import data as D
    from foodvit.inference import evaluate_split
    from foodvit.predictor import Predictor

    config = json.loads((run / "config.json").read_text())
    predictor = Predictor.from_run(run)
    return evaluate_split(predictor, D.open_split(config["data"]["source"] or None, "test"))["per_class"]


def print_validation(result: dict) -> None:
    """Tuning view: validation accuracy only, so that no choice is made on the test split."""
    vals = [r["val_acc"] for r in result["seeds"]]
    if any(v is None for v in vals):
        raise SystemExit("--val-only needs a validation split: add -- --val-fraction 0.2")
    spread = statistics.stdev(vals) if len(vals) > 1 else 0.0
    print(f"recipe {result['recipe']} {' '.join(result['extra'])}: val acc {statistics.mean(vals):.3f} +- {spread:.3f} "
          f"({', '.join(f'{v:.3f}' for v in vals)}); {result['mean_seconds']:.0f} s per run")


def print_table(result: dict) -> None:
    print(f"recipe {result['recipe']} {' '.join(result['extra'])}  |  {result['machine']}  |  {result['date']}")
    classes = list(result["seeds"][0]["per_class"])
    print("seed  test_acc  " + "  ".join(f"{c:>8}" for c in classes) + "  val_acc  train_s")
    for r in result["seeds"]:
        val = f"{r['val_acc']:.3f}" if r["val_acc"] is not None else "   --"
        print(f"{r['seed']:>4}  {r['test_acc']:.3f}     " + "  ".join(f"{r['per_class'][c]:>8.3f}" for c in classes)
              + f"  {val:>7}  {r['seconds']:>7.0f}")
    print(f"mean {result['mean']:.3f} +- {result['std']:.3f} (min {result['min']:.3f}, max {result['max']:.3f}) over "
          f"{len(result['seeds'])} seeds; {result['mean_seconds']:.0f} s per run")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="default")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, 2, ...)")
    parser.add_argument("--seed-list", help="explicit seeds, comma-separated")
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--out", default="runs/bench-accuracy")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--val-only", action="store_true", help="tuning: report validation accuracy only, never the test split")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    result = run_seeds(args.recipe, seeds, Path(args.out), args.data, extra, args.val_only)
    print_validation(result) if args.val_only else print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
