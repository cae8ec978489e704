"""Would a per-class offset on the model's scores help? Scored after the fact on a finished `foodvit cv`
study, honestly: nested over its folds.

    python -m bench.analysis.offsets runs/r15/scale025 [--json offsets.json]

A model that under-predicts a class (the default ViT gives sushi a 0.24 share of its probability on
photos a third of which are sushi) might gain from adding an offset to that class's log-probability
before the argmax (a prior correction). Chosen on the same predictions it is scored on, an offset can
only look good, so each fold's offsets are chosen on the other folds' held-out predictions (the first
class fixed at 0, the others on a grid of -2 to 2 in steps of 0.1; of equal accuracies the smallest
offsets win) and applied to that fold alone. Printed: each fold's offsets and the nested accuracy,
paired photo by photo against the study as it is.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

from foodvit.errors import StudyError
from foodvit.tuning.compare import compare_line, paired, read_study

GRID = [step / 10 for step in range(-20, 21)]


def log_probabilities(row: dict) -> dict[str, float]:
    """A prediction's class probabilities as log-probabilities (floored, so a 0 stays finite)."""
    return {c: math.log(max(p, 1e-12)) for c, p in row["probabilities"].items()}


def predicted(scores: dict[str, float], offsets: dict[str, float]) -> str:
    """The class whose log-probability plus its offset is largest."""
    return max(scores, key=lambda c: scores[c] + offsets[c])


def best_offsets(rows: list[tuple[dict[str, float], str]], classes: list[str]) -> dict[str, float]:
    """The offsets (the first class at 0) that classify the most of rows (log-probabilities, label) right;
    of equal counts the smallest in sum."""
    best = None
    for values in itertools.product(GRID, repeat=len(classes) - 1):
        offsets = dict(zip(classes, (0.0, *values), strict=False))
        right = sum(predicted(scores, offsets) == label for scores, label in rows)
        key = (right, -sum(abs(v) for v in values))
        if best is None or key > best[0]:
            best = (key, offsets)
    return best[1]


def nested(rows: list[dict]) -> tuple[dict[str, bool], list[dict]]:
    """Each fold (of each seed) scored with the offsets chosen on the other folds of its seed:
    's{seed}/{photo}' -> right, and the offsets of each fold."""
    classes = sorted(rows[0]["probabilities"])
    scored = [
        (r["seed"], r["fold"], f"s{r['seed']}/{r['photo']}", log_probabilities(r), r["label"]) for r in rows
    ]  # the logs once
    right, chosen = {}, []
    for seed, fold in sorted({(r["seed"], r["fold"]) for r in rows}):
        offsets = best_offsets(
            [(scores, label) for s, f, _, scores, label in scored if s == seed and f != fold], classes
        )
        chosen.append({"seed": seed, "fold": fold, "offsets": offsets})
        right.update(
            {key: predicted(scores, offsets) == label for s, f, key, scores, label in scored if s == seed and f == fold}
        )
    return right, chosen


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="A per-class offset on a finished cv study's scores, chosen and scored nested over its folds."
    )
    parser.add_argument("study", type=Path, help="a finished `foodvit cv` study")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        result = read_study(args.study)
    except StudyError as err:
        raise SystemExit(str(err)) from None
    rows = [json.loads(line) for line in (args.study / "predictions.jsonl").read_text().splitlines()]
    if not rows or not all("probabilities" in r for r in rows):
        raise SystemExit(
            f"{args.study}'s predictions keep no class probabilities: give a study written since they are kept"
        )
    if len(rows[0]["probabilities"]) > 4:
        raise SystemExit(
            f"{args.study} has {len(rows[0]['probabilities'])} classes: the offsets are searched on a full grid "
            f"({len(GRID)} values a class), which is for a few classes only (4 at most)"
        )
    if len({r["fold"] for r in rows}) < 2:
        raise SystemExit(f"{args.study} has one fold: offsets chosen on the other folds need two or more")
    right, chosen = nested(rows)
    for c in chosen:
        print(f"seed {c['seed']} fold {c['fold']}: " + ", ".join(f"{k} {v:+.1f}" for k, v in c["offsets"].items()))
    try:
        comparison = paired(result["photos"], right)
    except StudyError as err:
        raise SystemExit(f"{args.study}: its predictions.jsonl and cv.json disagree ({err})") from None
    accuracy = sum(right.values()) / len(right)
    print(
        f"nested offsets: {accuracy:.3f} (the study as it is: {result['accuracy']:.3f}); "
        + compare_line(comparison, str(args.study), "with offsets")
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "study": str(args.study),
                    "accuracy": accuracy,
                    "offsets": chosen,
                    "difference": comparison["difference"],
                    "standard_error": comparison["standard_error"],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
