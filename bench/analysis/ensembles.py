"""Would averaging models help? Ensembles of finished `foodvit cv` studies on the same folds, scored
after the fact: each held-out photo's class probabilities averaged over the studies.

    python -m bench.analysis.ensembles runs/r10/default runs/r12/strong runs/r12/lsa ...
        [--json ensembles.json] [--plot errors.png]
    python -m bench.analysis.ensembles results/cv/bf16-seeds-0-11 --members 2

Prints each study alone (as its cv.json says), the first averaged with each other one (paired photo by
photo with each of the two alone), all of them averaged, and the photos every study gets wrong: errors
the models share, which averaging rarely mends (how many of them the average of all gets right is
printed too). With --members K and one study, each K of its seeds are averaged instead (seeds 0..K-1,
K..2K-1, ...), paired with the seeds alone: what training K models and averaging them would buy.

The class probabilities come from each study's predictions.jsonl, or, for a study kept without it
(results/cv/), from its runs' results; a ViT study written before they were kept is scored again from
its saved fold models, as `foodvit cv` scores them (nothing trained).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foodvit.errors import FoodVitError
from foodvit.tuning.compare import compare_line, finished_results, paired, prediction_key, read_study, seed_of
from foodvit.tuning.fold import held_out_predictions
from foodvit.tuning.folds import fold_folder, fold_name

SHOWN = 20  # photos named on the screen at most; --json keeps them all


def probabilities(study: Path, result: dict | None = None) -> dict[str, tuple[dict[str, float], str]]:
    """'s{seed}/{photo}' -> (every class's probability, the label), for each held-out photo of the study
    (result: its cv.json, when already read)."""
    folds = (result or read_study(study))["folds"]
    if (study / "predictions.jsonl").is_file():
        rows = [json.loads(line) for line in (study / "predictions.jsonl").read_text().splitlines()]
    else:  # a study kept without its runs (results/cv/): each run's result holds its predictions
        kept = finished_results(study)
        if not kept:
            raise SystemExit(
                f"{study} keeps no predictions (no predictions.jsonl, no run results): give the folder `foodvit cv` "
                "wrote, or one kept with its runs' results"
            )
        rows = [{"seed": r["seed"], **p} for r in kept.values() for p in r["predictions"]]
    if not all("probabilities" in r for r in rows):
        seeds = len({f["seed"] for f in folds})
        rows = []
        for f in folds:
            run = study / fold_name(f["seed"], f["fold"], seeds)
            if not (run / "model.json").is_file():
                raise SystemExit(
                    f"{study}'s predictions keep no class probabilities and {run} holds no model to score again "
                    "(a study written before they were kept, of CNN teachers?): score the study again "
                    "(bench/accuracy/teachers.py, bench/accuracy/curve.py)"
                )
            rows += [
                {"seed": f["seed"], **p}
                for p in held_out_predictions(run, fold_folder(study / "folds", f["seed"], f["fold"]))
            ]
    return {f"s{r['seed']}/{r['photo']}": (r["probabilities"], r["label"]) for r in rows}


def check_alike(studies: list[Path], scored: list[dict]) -> None:
    """The same photos (seeds, folds) and classes in every study, else a one-line refusal."""
    photos, classes = set(scored[0]), set(next(iter(scored[0].values()))[0])
    for study, these in zip(studies[1:], scored[1:], strict=False):
        if set(these) != photos:
            raise SystemExit(
                f"{study} does not hold {studies[0]}'s held-out photos ({len(set(these) ^ photos)} differ): "
                "average studies of the same data, folds and seeds"
            )
        if set(next(iter(these.values()))[0]) != classes:
            raise SystemExit(
                f"{study} does not predict {studies[0]}'s classes ({', '.join(sorted(classes))}): "
                "average studies of the same data"
            )


def averaged(members: list[dict]) -> dict[str, bool]:
    """Right or wrong per photo, for the class whose probability averaged over the members is largest."""
    right = {}
    for key, (_, label) in members[0].items():
        mean = {c: sum(m[key][0][c] for m in members) / len(members) for c in members[0][key][0]}
        right[key] = max(mean, key=mean.get) == label
    return right


def accuracy(right: dict[str, bool]) -> float:
    return sum(right.values()) / len(right)


def plot(alone: list[dict[str, bool]], path: Path) -> None:
    """Held-out predictions by how many of the studies got them wrong, stacked by class (up to ten
    classes): errors every study shares stand at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = {key: sum(not r[key] for r in alone) for key in alone[0]}
    classes = sorted({key.split("/")[1] for key in counts})
    groups = (
        [(c, lambda key, c=c: key.split("/")[1] == c) for c in classes]
        if len(classes) <= 10
        else [(None, lambda key: True)]
    )
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    below = [0] * (len(alone) + 1)
    for name, member in groups:
        heights = [sum(1 for key, n in counts.items() if n == k and member(key)) for k in range(len(alone) + 1)]
        ax.bar(range(len(alone) + 1), heights, bottom=below, label=name)
        below = [b + h for b, h in zip(below, heights, strict=False)]
    ax.set(
        xlabel=f"studies (of {len(alone)}) that got it wrong",
        ylabel="held-out predictions",
        xticks=range(len(alone) + 1),
        title="Held-out photos by how many studies got them wrong",
    )
    if len(groups) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(studies: list[Path]) -> tuple[dict, list[dict[str, bool]]]:
    """The figures, printed as they come, and each study's right or wrong per photo."""
    results = [read_study(s) for s in studies]
    scored = [probabilities(s, r) for s, r in zip(studies, results, strict=False)]
    check_alike(studies, scored)
    alone = [{key: r["photos"][key] for key in scored[0]} for r in results]
    out = {"studies": [str(s) for s in studies], "alone": [accuracy(r) for r in alone], "with_first": []}
    for study, right in zip(studies, alone, strict=False):
        print(f"{study}: {accuracy(right):.3f} alone")
    for study, member, right in zip(studies[1:], scored[1:], alone[1:], strict=False):
        both = averaged([scored[0], member])
        first, second = paired(alone[0], both), paired(right, both)
        out["with_first"].append(
            {
                "study": str(study),
                "accuracy": accuracy(both),
                "difference": first["difference"],
                "standard_error": first["standard_error"],
                "difference_to_it": second["difference"],
                "standard_error_to_it": second["standard_error"],
            }
        )
        print(f"{studies[0]} and {study} averaged: {accuracy(both):.3f}")
        print("    " + compare_line(first, f"{studies[0]} alone", "the two"))
        print("    " + compare_line(second, f"{study} alone", "the two"))
    everything = averaged(scored)
    pair = paired(alone[0], everything)
    out["all"] = {
        "accuracy": accuracy(everything),
        "difference": pair["difference"],
        "standard_error": pair["standard_error"],
    }
    if len(studies) > 2:
        print(
            f"all {len(studies)} averaged: {accuracy(everything):.3f}; "
            + compare_line(pair, f"{studies[0]} alone", f"all {len(studies)}")
        )
    shared = sorted(k for k in alone[0] if not any(r[k] for r in alone))
    out["wrong_in_all"], out["wrong_in_all_mended"] = shared, sorted(k for k in shared if everything[k])
    named = ", ".join(shared[:SHOWN]) + (
        f" and {len(shared) - SHOWN} more (--json lists them)" if len(shared) > SHOWN else ""
    )
    print(
        f"{len(shared)} of {len(alone[0])} held-out predictions wrong in every study"
        + (f": {named}" if shared else "")
        + f"; the average of all gets {len(out['wrong_in_all_mended'])} of them right"
    )
    return out, alone


def members(study: Path, k: int) -> dict:
    """Each k of one study's seeds averaged (in seed order, k at a time), paired photo by photo with the
    seeds alone: what training k models and averaging them would buy, at k times the training."""
    result = read_study(study)
    scored = probabilities(study, result)
    found = {seed_of(key) for key in scored}
    if None in found or len(found) % k:
        raise SystemExit(
            f"--members {k} needs a study whose seeds it divides, and {study} has {len(found)}: give a study of "
            f"{k}, {2 * k}, ... seeds"
        )
    seeds = sorted(found)
    alone = {key: result["photos"][key] for key in scored}
    together, groups = {}, []
    for first in range(0, len(seeds), k):
        group = seeds[first : first + k]
        by_photo = [{key.partition("/")[2]: v for key, v in scored.items() if seed_of(key) == s} for s in group]
        right = averaged(by_photo)
        together |= {prediction_key(s, photo): r for s in group for photo, r in right.items()}
        groups.append({"seeds": group, "accuracy": accuracy(right)})
        print(f"seeds {', '.join(map(str, group))} averaged: {accuracy(right):.3f}")
    pair = paired(alone, together)
    print(
        f"{study}: {len(seeds)} seeds alone {accuracy(alone):.3f}; {k} at a time averaged {accuracy(together):.3f}; "
        + compare_line(pair, "one model", f"{k} averaged")
    )
    return {
        "study": str(study),
        "members": k,
        "alone": accuracy(alone),
        "averaged": accuracy(together),
        "groups": groups,
        "difference": pair["difference"],
        "standard_error": pair["standard_error"],
    }


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Ensembles of finished cv studies on the same folds, scored after the fact."
    )
    parser.add_argument(
        "studies", type=Path, nargs="+", help="finished `foodvit cv` studies of the same photos, folds and seeds"
    )
    parser.add_argument(
        "--members",
        type=int,
        metavar="K",
        help="one study: average each K of its seeds (in seed order) and pair that with the seeds alone",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--plot", type=Path, help="write the chart of held-out photos by how many studies got them wrong here"
    )
    args = parser.parse_args(argv)
    if args.members is not None and (len(args.studies) != 1 or args.members < 2 or args.plot):
        parser.error("--members K averages the seeds of one study, K at least 2 (and draws no plot)")
    if args.members is None and len(args.studies) < 2:
        parser.error("give at least two studies to average")
    try:
        if args.members is None:
            out, alone = report(args.studies)
        else:
            out = members(args.studies[0], args.members)
    except FoodVitError as err:
        raise SystemExit(str(err)) from None
    for path in (args.json, args.plot):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(alone, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
