"""The recipe search on FoodVision Mini under a time budget, then the test split, once, at the end.

    python -m bench.accuracy.tune --budget 60m                 # the default recipe as the starting point
    python -m bench.accuracy.tune --budget 2h --recipe tiny --folds 5 --data ../shared/data/pizza_steak_sushi
    python -m bench.accuracy.tune --budget 60m -- --epochs 30  # any train option after -- (the fixed starting point)

1. `foodvit tune` searches from the recipe for --budget, every trial a k-fold CV over the training
   photos (the test split is not read).
2. Only then are the best recipe (STUDY/best.toml) and the starting recipe each trained on all the
   training photos with --seeds seeds (default 3) and tested, once, so the table says whether the
   choice made on the training photos carries over to photos it never saw (mean +- standard error
   over the seeds). Rerunning continues the study and reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from foodvit.cli.main import main as foodvit


def test_accuracy(runs: Path, recipe: str, data: str | None, extra: list[str], seeds: int) -> dict:
    """The recipe's test accuracy over `seeds` seeds (0, 1, ...): each run trained now unless it is
    already there, with its training time."""
    accs, minutes = [], []
    for seed in range(seeds):
        run = runs / f"seed-{seed}"
        if not (run / "model.json").is_file():
            args = ["train", "--recipe", recipe, "--out", str(run), "--quiet", *extra, "--seed", str(seed)] + (
                ["--data", data] if data else []
            )
            started = time.perf_counter()
            if foodvit(args) != 0:
                raise SystemExit(f"training {recipe} (seed {seed}) failed")
            (run / "bench-seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")
        accs.append(json.loads((run / "model.json").read_text())["metrics"]["test_acc"])
        timed = run / "bench-seconds.txt"
        minutes.append(float(timed.read_text()) / 60 if timed.is_file() else float("nan"))
    sem = statistics.stdev(accs) / len(accs) ** 0.5 if len(accs) > 1 else float("nan")
    return {"recipe": recipe, "test_acc": accs, "mean": statistics.fmean(accs), "sem": sem, "train_minutes": minutes}


def _best_is_start(study: Path) -> bool:
    """Whether the study's best trial is its first, the starting recipe (tune.md says so)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{study / 'study.db'}")
    return bool(trials.best_trial.user_attrs.get("baseline"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", required=True, help="the search's wall-clock time, e.g. 60m, 2h")
    parser.add_argument("--recipe", default="default", help="the starting recipe (default: default)")
    parser.add_argument("--folds", type=int, default=3, help="folds per trial (default 3)")
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--out", default="runs/bench-tune")
    parser.add_argument("--seeds", type=int, default=3, help="seeds for the final test of each recipe (default 3)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--record", action="store_true", help="append the result to results/tune.csv")
    parser.add_argument(
        "--search-only", action="store_true", help="stop after the search (test later with --test-only)"
    )
    parser.add_argument("--test-only", action="store_true", help="the test of a finished search only")
    args = parser.parse_args(argv)
    out = Path(args.out)
    timing = out / "search-seconds.txt"
    if not args.test_only:
        started = time.perf_counter()
        search = [
            "tune",
            "--recipe",
            args.recipe,
            "--out",
            str(out / "study"),
            "--budget",
            args.budget,
            "--folds",
            str(args.folds),
            *extra,
        ] + (["--data", args.data] if args.data else [])
        if foodvit(search) != 0:
            return 1
        timing.write_text(f"{time.perf_counter() - started:.1f}\n")
    if args.search_only:
        return 0
    searched = float(timing.read_text())
    start = test_accuracy(out / "start", args.recipe, args.data, extra, args.seeds)
    if _best_is_start(out / "study"):
        best = start  # the search found nothing better: the starting recipe's runs are the best's
    else:
        best = test_accuracy(out / "best", str(out / "study" / "best.toml"), args.data, [], args.seeds)
    print(
        f"search: {searched / 60:.0f} min ({args.budget} budget), {args.folds}-fold CV per trial; "
        f"see {out / 'study' / 'tune.md'}"
    )
    for name, r in (("starting recipe", start), ("best found", best)):
        each = " ".join(f"{a:.3f}" for a in r["test_acc"])
        print(
            f"{name:<16} test accuracy {r['mean']:.3f} +- {r['sem']:.3f} over {args.seeds} seeds ({each}); "
            f"training {statistics.fmean(r['train_minutes']):.1f} min a run"
        )
    if args.record:
        import optuna

        from bench.results import record

        study = optuna.load_study(study_name="foodvit", storage=f"sqlite:///{out / 'study' / 'study.db'}")
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        first = next(t for t in study.trials if t.user_attrs.get("baseline"))
        pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
        record(
            "tune",
            {
                "budget": args.budget,
                "trials": len(study.trials),
                "pruned": pruned,
                "best_cv": f"{study.best_value:.3f}",
                "default_cv": f"{first.value:.3f}" if first.value is not None else "",
                "difference": f"{study.best_value - first.value:+.3f}" if first.value is not None and done else "",
                "difference_se": "",
                "best_test": f"{best['mean']:.3f}",
                "default_test": f"{start['mean']:.3f}",
                "protocol": f"{args.folds}-fold CV, fold seed 0; test photos read once, {args.seeds} seeds",
            },
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "budget": args.budget,
                    "folds": args.folds,
                    "search_seconds": searched,
                    "start": start,
                    "best": best,
                    "extra": extra,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
