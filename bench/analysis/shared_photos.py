"""What more training photos would buy: two pool studies trained on different data (`foodvit cv --validate-on POOL
--data ...`), paired photo by photo on the pool photos both of them judged. A pool study drops the pool photos that
are in its own training data, so a study trained on a larger set (the 20% set's 450 photos) judges fewer of them
(the 136 of its test split); `foodvit cv --compare` refuses to pair studies of other data, and this pairs them on
what they share.

    foodvit cv --data DATA-450 --validate-on ../shared/data/pizza_steak_sushi_validation --seed 0 --seeds 4 --out MORE
    python -m bench.analysis.shared_photos results/cv/bf16-seeds-0-11 results/cv/more-photos-450

Prints B - A over the seeds both studies trained (each photo's answers averaged over the seeds first, the photo the
unit of the standard error, as `--compare` pairs), each seed's own difference, and each class's accuracy; then B
against every seed of A (each photo's mean over A's seeds against its mean over B's: unpaired in the seeds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from foodvit.errors import FoodVitError
from foodvit.tuning.compare import compare_line, finished_folds, paired, photo_of, seed_of


def answers(study: Path, photos: set[str] | None = None) -> dict[str, bool]:
    """'s{seed}/{photo}' -> right or wrong, for each photo of each finished seed of a pool study (those of
    `photos` alone, when given)."""
    return {
        key: right
        for run in finished_folds(study).values()
        for key, right in run.items()
        if photos is None or photo_of(key) in photos
    }


def accuracy(right: dict[str, bool]) -> float:
    return sum(right.values()) / len(right)


def by_class(right: dict[str, bool]) -> dict[str, float]:
    classes = sorted({photo_of(key).split("/")[0] for key in right})
    return {c: accuracy({k: v for k, v in right.items() if photo_of(k).split("/")[0] == c}) for c in classes}


def report(a: Path, b: Path) -> dict:
    """B - A on the pool photos both judged: paired over their shared seeds, then against every seed of A."""
    first, second = answers(a), answers(b)
    shared = {photo_of(k) for k in first} & {photo_of(k) for k in second}
    if not shared:
        raise SystemExit(f"{a} and {b} judged no pool photo in common: give pool studies of the same pool")
    first, second = answers(a, shared), answers(b, shared)
    seeds = sorted({seed_of(k) for k in first} & {seed_of(k) for k in second})
    if not seeds:
        raise SystemExit(f"{a} and {b} share no training seed: pair studies trained with the same seeds")
    in_seeds = {k: v for k, v in first.items() if seed_of(k) in seeds}
    mine = {k: v for k, v in second.items() if seed_of(k) in seeds}
    pair = paired(in_seeds, mine)
    print(f"{len(shared)} pool photos both judged; seeds {', '.join(map(str, seeds))}")
    print(f"{a}: {accuracy(in_seeds):.3f}; {b}: {accuracy(mine):.3f}")
    print("    " + compare_line(pair, str(a), str(b)))
    classes_a, classes_b = by_class(in_seeds), by_class(mine)
    for c in classes_a:
        print(f"    {c}: {classes_a[c]:.3f} -> {classes_b[c]:.3f}")
    mean_a = {p: statistics.mean(v for k, v in first.items() if photo_of(k) == p) for p in shared}
    mean_b = {p: statistics.mean(v for k, v in second.items() if photo_of(k) == p) for p in shared}
    diffs = [mean_b[p] - mean_a[p] for p in sorted(shared)]
    every = {
        "difference": statistics.mean(diffs),
        "standard_error": statistics.stdev(diffs) / len(diffs) ** 0.5,
        "a": statistics.mean(mean_a.values()),
        "a_seeds": sorted({seed_of(k) for k in first}),
    }
    print(
        f"against every seed of {a} ({len(every['a_seeds'])}: {every['a']:.3f}): "
        f"{every['difference']:+.3f} +- {every['standard_error']:.3f} (each photo's mean over each study's seeds)"
    )
    return {
        "photos": len(shared),
        "seeds": seeds,
        "a": accuracy(in_seeds),
        "b": accuracy(mine),
        "difference": pair["difference"],
        "standard_error": pair["standard_error"],
        "only_a": len(pair["only_a"]),
        "only_b": len(pair["only_b"]),
        "by_seed": pair["by_seed"],
        "classes_a": classes_a,
        "classes_b": classes_b,
        "every_seed_of_a": every,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="a pool study (the smaller training set)")
    parser.add_argument("b", type=Path, help="a pool study of other training data, on the same pool")
    args = parser.parse_args(argv)
    try:
        report(args.a, args.b)
    except FoodVitError as err:
        raise SystemExit(str(err)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
