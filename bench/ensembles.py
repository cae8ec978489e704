"""Would averaging models help? Ensembles of finished `foodvit cv` studies on the same folds, scored
after the fact: each held-out photo's class probabilities averaged over the studies.

    python bench/ensembles.py runs/r10/default runs/r12/strong runs/r12/lsa ... [--json ensembles.json] [--plot errors.png]

Prints each study alone, the first averaged with each other one (paired photo by photo with the
first), all of them averaged, and how many photos every study gets wrong (errors all the models
share, which no average can mend). A study written before its predictions kept every class's
probability is scored again from its saved fold models, as `foodvit cv` scores them (nothing trained).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foodvit.tuning.cv import compare_line, held_out_predictions, paired, read_study


def probabilities(study: Path) -> dict[str, tuple[dict[str, float], str]]:
    """'s{seed}/{photo}' -> (every class's probability, the label), for each held-out photo of the study."""
    out = {}
    for fold in read_study(study)["folds"]:
        saved = json.loads((study / f"{fold['run']}.json").read_text())["predictions"]
        if not all("probabilities" in p for p in saved):
            saved = held_out_predictions(study / fold["run"], study / "folds" / f"seed-{fold['seed']}" / f"fold-{fold['fold']}")
        out.update({f"s{fold['seed']}/{p['photo']}": (p["probabilities"], p["label"]) for p in saved})
    return out


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
    """Photos by how many of the studies got them wrong, stacked by class: errors that every study
    shares stand at the right, where no average reaches them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = {key: sum(not r[key] for r in alone) for key in alone[0]}
    classes = sorted({key.split("/")[1] for key in counts})
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    below = [0] * (len(alone) + 1)
    for c in classes:
        heights = [sum(1 for key, n in counts.items() if n == k and key.split("/")[1] == c) for k in range(len(alone) + 1)]
        ax.bar(range(len(alone) + 1), heights, bottom=below, label=c)
        below = [b + h for b, h in zip(below, heights)]
    ax.set(xlabel=f"studies (of {len(alone)}) that got the photo wrong", ylabel="held-out photos", xticks=range(len(alone) + 1),
           title="Held-out photos by how many studies got them wrong")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Ensembles of finished cv studies on the same folds, scored after the fact.")
    parser.add_argument("studies", type=Path, nargs="+", help="finished `foodvit cv` studies of the same photos, folds and seeds")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, help="write the photos-by-errors chart here")
    args = parser.parse_args(argv)
    if len(args.studies) < 2:
        parser.error("give at least two studies to average")
    studies = args.studies
    scored = [probabilities(s) for s in studies]
    alone = [averaged([m]) for m in scored]
    report = {"studies": [str(s) for s in studies], "alone": [accuracy(r) for r in alone], "with_first": [], "all": None}
    for study, right in zip(studies, alone):
        print(f"{study}: {accuracy(right):.3f} alone")
    for study, member in zip(studies[1:], scored[1:]):
        both = averaged([scored[0], member])
        pair = paired(alone[0], both)
        report["with_first"].append({"study": str(study), "accuracy": accuracy(both), "difference": pair["difference"],
                                     "standard_error": pair["standard_error"]})
        print(f"{studies[0]} + {study}: {accuracy(both):.3f}; " + compare_line(pair, "alone", "averaged"))
    everything = averaged(scored)
    pair = paired(alone[0], everything)
    report["all"] = {"accuracy": accuracy(everything), "difference": pair["difference"], "standard_error": pair["standard_error"]}
    print(f"all {len(studies)} averaged: {accuracy(everything):.3f}; " + compare_line(pair, "alone", "averaged"))
    shared = sorted(k for k in alone[0] if not any(r[k] for r in alone))
    report["wrong_in_all"] = shared
    print(f"{len(shared)} of {len(alone[0])} photos wrong in every study: " + ", ".join(k.split("/", 1)[1] for k in shared))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(alone, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
