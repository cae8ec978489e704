"""Would averaging models help? Ensembles of finished `foodvit cv` studies on the same folds, scored
after the fact: each held-out photo's class probabilities averaged over the studies.

    python bench/ensembles.py runs/r10/default runs/r12/strong runs/r12/lsa ... [--json ensembles.json]

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


def main(argv: list[str]) -> int:
    out = None
    if "--json" in argv:
        at = argv.index("--json")
        out, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2 :]
    if len(argv) < 2:
        raise SystemExit("usage: python bench/ensembles.py STUDY STUDY [STUDY ...] [--json OUT] (finished cv studies of the same folds)")
    studies = [Path(s) for s in argv]
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
        print(f"{studies[0]} + {study}: {report['with_first'][-1]['accuracy']:.3f}; " + compare_line(pair, "alone", "averaged"))
    everything = averaged(scored)
    pair = paired(alone[0], everything)
    report["all"] = {"accuracy": accuracy(everything), "difference": pair["difference"], "standard_error": pair["standard_error"]}
    print(f"all {len(studies)} averaged: {accuracy(everything):.3f}; " + compare_line(pair, "alone", "averaged"))
    shared = sorted(k for k in alone[0] if not any(r[k] for r in alone))
    report["wrong_in_all"] = shared
    print(f"{len(shared)} of {len(alone[0])} photos wrong in every study: " + ", ".join(k.split("/", 1)[1] for k in shared))
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
