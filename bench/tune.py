"""The recipe search on FoodVision Mini under a time budget, then the test split, once, at the end.

    python bench/tune.py --budget 60m                        # the default recipe as the starting point
    python bench/tune.py --budget 2h --recipe tiny --folds 5 --data ../shared/data/pizza_steak_sushi
    python bench/tune.py --budget 60m -- --epochs 30         # any train option after -- (the fixed starting point)

1. `foodvit tune` searches from the recipe for --budget, every trial a k-fold CV over the training
   photos (the test split is not read).
2. Only then are the best recipe (STUDY/best.toml) and the starting recipe each trained on all the
   training photos and tested once, so the table says whether the choice made on the training
   photos carries over to photos it never saw. Rerunning continues the study and reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from foodvit.cli.main import main as foodvit


def test_accuracy(run: Path, recipe: str, data: str | None, extra: list[str]) -> dict:
    """A finished run's test result (trained now unless it is already there)."""
    if not (run / "model.json").is_file():
        args = ["train", "--recipe", recipe, "--out", str(run), "--quiet", *extra] + (["--data", data] if data else [])
        if foodvit(args) != 0:
            raise SystemExit(f"training {recipe} failed")
    metrics = json.loads((run / "model.json").read_text())["metrics"]
    return {"recipe": recipe, "test_acc": metrics["test_acc"], "test_n": metrics["test_n"]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", required=True, help="the search's wall-clock time, e.g. 60m, 2h")
    parser.add_argument("--recipe", default="default", help="the starting recipe (default: default)")
    parser.add_argument("--folds", type=int, default=3, help="folds per trial (default 3)")
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--out", default="runs/bench-tune")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    out = Path(args.out)
    started = time.perf_counter()
    search = ["tune", "--recipe", args.recipe, "--out", str(out / "study"), "--budget", args.budget, "--folds", str(args.folds),
              *extra] + (["--data", args.data] if args.data else [])
    if foodvit(search) != 0:
        return 1
    searched = time.perf_counter() - started
    best = test_accuracy(out / "best", str(out / "study" / "best.toml"), args.data, [])
    start = test_accuracy(out / "start", args.recipe, args.data, extra)
    print(f"search: {searched / 60:.0f} min ({args.budget} budget), {args.folds}-fold CV per trial; see {out / 'study' / 'tune.md'}")
    for name, r in (("starting recipe", start), ("best found", best)):
        print(f"{name:<16} test accuracy {r['test_acc']:.3f} ({round(r['test_acc'] * r['test_n'])}/{r['test_n']})")
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": args.budget, "folds": args.folds, "search_seconds": searched,
                                               "start": start, "best": best, "extra": extra}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
