"""`foodvit train` (or `foodvit cv`) of the working tree against a commit's, side by side on this machine: wall time
and what each learns.

    python -m bench.speed.versus_commit --epochs 1 --threads 1
    python -m bench.speed.versus_commit --commit 6149773 --threads 2   # each tree's default recipe, whole
    python -m bench.speed.versus_commit --commit 6149773 --threads 2 --keep runs/versus   # and keep both runs
    python -m bench.speed.versus_commit --commit 55963f1 --cv 5 --epochs 4   # `foodvit cv --folds 5 --jobs 2` instead

The commit is checked out into a temporary git worktree and run with the same interpreter and packages
(PYTHONPATH at its src/), the working tree likewise; the two alternate (baseline first in odd rounds, second
in even ones) so that a drift in the machine's speed falls on both. Every run is the same recipe name, seed
and threads (OMP_NUM_THREADS), for the same --epochs or, without it, each tree's recipe as it stands, its
photos decoded by itself. The ratio is the baseline's wall time over the working tree's, the median over
rounds. The metrics.csv of the two are compared column by column, the timing columns aside and the evaluation
columns in the epochs both evaluated: identical, or the largest difference; with --cv, every held-out photo's class
probabilities. Rows go to results/speed-versus.csv. On a CPU that multiplies bf16 natively, a tree that trains under
bf16 autocast against one that trains every CPU in float32 differs in arithmetic: the ratio includes bf16's speed-up
and the metrics differ (`-- --amp false` runs both in float32 where both trees know the option).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import record
from bench.speed import DATA

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("seconds", "images_per_s", "model_share")  # what a run's speed changes in metrics.csv
EVALUATION = ("val_", "test_")  # the columns an epoch fills only when it evaluates


def checkout(commit: str, where: Path) -> Path:
    """A detached worktree of `commit` at `where`."""
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(where), commit], cwd=ROOT, check=True)
    return where


def timed_train(tree: Path, out: Path, args: argparse.Namespace) -> float:
    """Seconds of one `foodvit train` (with --cv: `foodvit cv`) from `tree`'s source."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "src"),
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
    }
    study = ["cv", "--folds", str(args.cv), "--jobs", str(args.jobs)] if args.cv else ["train"]
    command = [
        sys.executable,
        "-m",
        "foodvit",
        *study,
        "--recipe",
        args.recipe,
        "--data",
        args.data,
        *(["--epochs", str(args.epochs)] if args.epochs else []),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        "--quiet",
        *args.extra,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"versus_commit: {' '.join(command)} in {tree} failed:\n{done.stderr[-2000:]}")
    return seconds


def study_difference(a: Path, b: Path) -> str:
    """'identical' when two `foodvit cv` studies gave every held-out photo of every seed the same class
    probabilities (their predictions.jsonl), else how many photos differ and by how much."""

    def probabilities(study: Path) -> dict:
        path = study / "predictions.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        return {(p["seed"], p["photo"]): p["probabilities"] for p in map(json.loads, lines)}

    first, second = probabilities(a), probabilities(b)
    if not first or first.keys() != second.keys():
        return f"{len(first)} held-out predictions against {len(second)}, not of the same photos"
    gaps = [max(abs(x[c] - second[k].get(c, float("inf"))) for c in x) for k, x in first.items()]
    moved = sum(not g == 0 for g in gaps)
    return "identical" if not moved else f"{moved} of {len(gaps)} photos differ, by up to {max(gaps):.3g}"


def metrics_difference(a: Path, b: Path) -> str:
    """'identical' when the two metrics.csv agree on every column but the timing ones, else the largest difference.
    An evaluation column (val_*, test_*) is compared in the epochs both evaluated: a tree that evaluates less often
    (train.eval_every) is identical when its model and its evaluations are; the counts are then said."""

    def rows(path: Path) -> list[dict]:
        with path.open(newline="") as f:
            return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]

    def evaluated(table: list[dict]) -> int:
        return sum(1 for row in table if row.get("test_acc"))

    first, second = rows(a), rows(b)
    if len(first) != len(second):
        return f"{len(first)} epochs against {len(second)}"
    worst, where = 0.0, ""
    for x, y in zip(first, second, strict=True):
        for key in x.keys() | y.keys():
            if x.get(key) == y.get(key) or (key.startswith(EVALUATION) and not (x.get(key) and y.get(key))):
                continue
            try:
                gap = abs(float(x.get(key) or "nan") - float(y.get(key) or "nan"))
            except ValueError:
                return f"epoch {x.get('epoch')}: {key} {x.get(key)!r} against {y.get(key)!r}"
            if not gap <= worst:
                worst, where = gap, f"{key} at epoch {x.get('epoch')}"
    if where:
        return f"largest difference {worst:.3g} ({where})"
    counts = evaluated(first), evaluated(second)
    if not (first and first[-1].get("test_acc") and second[-1].get("test_acc")):
        return f"not both tested at the last epoch (tested in {counts[0]} and {counts[1]} epochs)"
    return "identical" if counts[0] == counts[1] else f"identical (tested in {counts[0]} and {counts[1]} epochs)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="6149773", help="the baseline (default 6149773)")
    parser.add_argument("--recipe", default="default")
    parser.add_argument(
        "--epochs",
        type=int,
        default=0,
        help="epochs of both runs (default: each tree's recipe's own, as a user runs it)",
    )
    parser.add_argument("--threads", type=int, default=1, help="OMP threads (with --cv, the plan of --jobs sets them)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, alternating which goes first (default 1)")
    parser.add_argument("--data", default=DATA, help="the photos (default $FOODVIT_DATA)")
    parser.add_argument("--cv", type=int, default=0, metavar="FOLDS", help="time `foodvit cv --folds FOLDS` instead")
    parser.add_argument("--jobs", type=int, default=2, help="with --cv: its --jobs (default 2)")
    parser.add_argument("--no-record", action="store_true", help="print only, append no row to results/")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="copy every run directory (or study) into DIR, new, before cleaning up"
    )
    parser.add_argument("extra", nargs="*", help="after --: more `foodvit train` (or cv) options for both runs")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: it exists; give a new folder, so that nothing in it is overwritten")

    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", args.commit], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="versus-") as tmp:
        tmp = Path(tmp)
        baseline = checkout(commit, tmp / "baseline")
        try:
            trees = {commit: baseline, "working tree": ROOT}
            seconds: dict[str, list[float]] = {name: [] for name in trees}
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for name in order:
                    out = tmp / "runs" / f"{'baseline' if name == commit else 'working'}-{r}"
                    seconds[name].append(timed_train(trees[name], out, args))
                    print(f"round {r + 1}: {name} {seconds[name][-1]:.1f} s", file=sys.stderr)
            runs = tmp / "runs"
            metrics = (
                study_difference(runs / "baseline-0", runs / "working-0")
                if args.cv
                else metrics_difference(runs / "baseline-0" / "metrics.csv", runs / "working-0" / "metrics.csv")
            )
            if args.keep is not None:
                shutil.copytree(runs, args.keep)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    old, new = statistics.median(seconds[commit]), statistics.median(seconds["working tree"])
    ratio = old / new
    print(
        f"| tree | seconds (median of {args.rounds}) |\n|---|---:|\n"
        f"| {commit} | {old:.1f} |\n| working tree | {new:.1f} |\n"
    )
    print(
        f"{args.recipe} recipe, {args.epochs or 'its own'} epoch(s), seed {args.seed}, "
        f"{f'cv --folds {args.cv} --jobs {args.jobs}' if args.cv else f'{args.threads} thread(s)'}: "
        f"the working tree takes {new / old:.2f} of {commit}'s time ({ratio:.2f}x as fast); "
        f"{'held-out predictions' if args.cv else 'metrics.csv'}: {metrics}"
    )
    if not args.no_record:
        common = {
            "baseline": commit,
            "recipe": args.recipe,
            "epochs": args.epochs or "recipe's own",
            "seed": args.seed,
            "threads": "" if args.cv else args.threads,  # with --cv, its --jobs plan (in extra) sets them
            "extra": " ".join([*([f"cv --folds {args.cv} --jobs {args.jobs}"] if args.cv else []), *args.extra]),
        }
        for name, values in seconds.items():
            for r, s in enumerate(values):
                record(
                    "speed-versus",
                    {**common, "tree": name, "round": r + 1, "seconds": round(s, 2), "ratio": "", "metrics": ""},
                )
        record(
            "speed-versus",
            {**common, "tree": "ratio", "round": "", "seconds": "", "ratio": round(ratio, 3), "metrics": metrics},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
