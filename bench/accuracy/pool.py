"""A change to a recipe judged on the validation pool, as the adoption rule reads it: the pool study of the change
paired photo by photo with the pool study of the recipe it changes (`foodvit cv --validate-on POOL`), its row kept in
results/studies.csv (table "pool") and both studies' results (cv.json with every photo's answer, study.json) under
results/cv/, where `foodvit cv --compare` pairs them again without training.

    foodvit cv --validate-on ../shared/data/pizza_steak_sushi_validation --seed 0 --seeds 2 --jobs 2 --out BASE
    foodvit cv --validate-on ../shared/data/pizza_steak_sushi_validation --seed 0 --seeds 2 --jobs 2 --out NO-MASKED
        (the same command with --masked 0, the change, added)
    python -m bench.accuracy.pool BASE NO-MASKED --idea "masked-patch reconstruction" --options "--masked 0" --removes

The rule (the Results page): a change joins the default when its paired difference on the pool, over at least two
training seeds, is at least two standard errors; a component of the default stays when removing it loses at least two
standard errors, and leaves it where its removal saves time and the pool shows no loss. `--removes` says STUDY is BASE
without the component, so the component's worth is BASE - STUDY; the row keeps STUDY - BASE, as every row of
studies.csv keeps the idea against the recipe it changes.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from foodvit.tuning.compare import check_comparable, compare_studies, read_study, seeds_alone, study_identity

RESULTS = Path(__file__).resolve().parents[2] / "results"
DATA = "FoodVision Mini train split, 225 photos"


def keep(study: Path) -> Path:
    """The study's results under results/cv/<name>/: cv.json, study.json, cv.md and each seed's result (seed-S.json,
    every pool photo's probabilities), no models. With its seeds' results a kept study grows by more seeds
    (`foodvit cv --seeds N --out results/cv/<name>` trains only the new ones), as a study kept without them cannot."""
    where = RESULTS / "cv" / study.name
    where.mkdir(parents=True, exist_ok=True)
    for name in ("cv.json", "study.json", "cv.md"):
        shutil.copy(study / name, where / name)
    for result in sorted(study.glob("seed-*.json")):
        shutil.copy(result, where / result.name)
    return where


def protocol(identity: dict, found: dict) -> str:
    """How a pool study scored, as studies.csv's protocol column says it: the pool's photos and the seeds."""
    seeds = " ".join(map(str, identity.get("seeds", [])))
    return f"validation pool, {found['n']} photos ({identity.get('dropped', 0)} dropped), training seeds {seeds}"


def row(base: Path, study: Path, idea: str, options: str, removes: bool) -> dict:
    """The studies.csv row of STUDY against BASE on the pool: B - A, its paired standard error (the photo the unit,
    each photo's answers averaged over the seeds first) and the answers (a photo under each seed) right only in one."""
    identity = study_identity(study)
    if study_identity(base).get("seeds") != identity.get("seeds"):
        raise SystemExit(
            f"{base} and {study} hold other seeds ({study_identity(base).get('seeds')} and {identity.get('seeds')}): a "
            "row pairs studies of the same seeds; grow the one of fewer (`foodvit cv` with a larger --seeds)"
        )
    result, _ = compare_studies(base, study)
    found = read_study(study)
    difference, se = result["difference"], result["standard_error"]
    # the component's (or the change's) worth; 0.0 - x, never -0.000
    worth = 0.0 - difference if removes else difference
    return {
        "table": "pool",
        "idea": idea,
        "overrides": options or check_comparable(base, study),
        "recipe": "default",
        "data": DATA,
        "protocol": protocol(identity, found),
        "accuracy": round(found["accuracy"], 4),
        "difference": f"{difference:+.4f}",
        "difference_se": f"{se:.4f}",
        "se_unit": "photo (its answers averaged over the seeds first)",
        "only_b": len(result["only_b"]),
        "only_a": len(result["only_a"]),
        "adopted": "",
        "reason": f"{'the component' if removes else 'the change'} is worth {worth:+.3f} ({worth / se:+.1f} SE)"
        + seeds_alone(result["by_seed"], -1.0 if removes else 1.0)  # what each seed alone says it is worth
        if se
        else "",
        "figures_as_recorded": f"{found['accuracy']:.3f} +- {found['standard_error']:.3f} | "
        f"{difference:+.3f} +- {se:.3f} vs {base.name} ({read_study(base)['accuracy']:.3f})",
    }


def baseline(base: Path, idea: str) -> dict:
    """The studies.csv row of the recipe the changes are made to, on the pool: its accuracy, nothing paired."""
    identity, found = study_identity(base), read_study(base)
    return {
        "table": "pool",
        "idea": idea,
        "overrides": "",
        "recipe": "default",
        "data": DATA,
        "protocol": protocol(identity, found),
        "accuracy": round(found["accuracy"], 4),
        "difference": "",
        "difference_se": "",
        "se_unit": "photo (its answers averaged over the seeds first)",
        "only_b": "",
        "only_a": "",
        "adopted": "reference",
        "reason": "",
        "figures_as_recorded": f"{found['accuracy']:.3f} +- {found['standard_error']:.3f}",
    }


def headline(base: Path) -> dict:
    """The headline row of the recipe's pool accuracy (key vit-pool), from its study's own files."""
    identity, found = study_identity(base), read_study(base)
    per_class = ", ".join(f"{name} {value:.2f}" for name, value in found.get("per_class", {}).items())
    seeds = identity.get("seeds", [])
    each = " / ".join(f"{f['accuracy']:.3f}" for f in sorted(found.get("folds", []), key=lambda f: f["seed"]))
    return {
        "key": "vit-pool",
        "model": "default recipe: ViT from scratch",
        "metric": f"validation pool accuracy, {len(seeds)} seeds",
        "value": f"{found['accuracy']:.3f}",
        "standard_error": f"{found['standard_error']:.3f}",
        "detail": f"seeds {' / '.join(map(str, seeds))}: {each}; per class {per_class}; SE with the photo as the unit",
        "data": f"trained on FoodVision Mini's 225 training photos; {found['n']} pool photos "
        f"({identity.get('dropped', 0)} dropped as also in the training data)",
        "protocol": "the validation pool (photos in neither split), each seed trained on every training photo",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="the pool study of the recipe the change is made to")
    parser.add_argument("study", type=Path, nargs="?", help="the pool study of the change (none: BASE's own row)")
    parser.add_argument("--idea", required=True, help="what the change is, in words")
    parser.add_argument(
        "--options", default="", help="the options STUDY added to BASE's command (default: the settings it changes)"
    )
    parser.add_argument("--removes", action="store_true", help="STUDY is BASE without the component")
    parser.add_argument("--adopted", default="", help="the decision (yes, no, kept, removed) for the row")
    parser.add_argument("--reason", default="", help="why, in words (after the component's worth)")
    parser.add_argument(
        "--record", action="store_true", help="append the row to results/studies.csv and keep both studies"
    )
    parser.add_argument(
        "--headline",
        action="store_true",
        help="with --record and no STUDY: BASE is the default recipe, and its pool accuracy the headline row vit-pool",
    )
    args = parser.parse_args(argv)
    if args.headline and (args.study or not args.record):
        parser.error("--headline records the default recipe's own row: give BASE alone, with --record")
    if args.removes and not args.study:
        parser.error("--removes says STUDY is BASE without a component: give STUDY too")
    for study in (args.base, args.study):
        if study is not None and not (study / "cv.json").is_file():
            parser.error(
                f"{study} holds no finished study (cv.json): give a folder `foodvit cv --validate-on` finished"
            )
    found = (
        row(args.base, args.study, args.idea, args.options, args.removes)
        if args.study
        else baseline(args.base, args.idea)
    )
    found["adopted"] = args.adopted or found["adopted"]
    found["reason"] = "; ".join(part for part in (found["reason"], args.reason) if part)
    print(json.dumps(found, indent=1))
    if args.record:
        from bench.results import record

        studied = args.study or args.base
        for study in {args.base, studied}:
            keep(study)
        seeds = len(study_identity(studied).get("seeds", [])) or 1
        study_command = f"foodvit cv --validate-on POOL --seed 0 --seeds {seeds} --jobs 2 --out {studied.name}"
        command = (
            f"{study_command} {found['overrides']}".strip()
            + (f"; python -m bench.accuracy.pool {args.base.name} {studied.name}" if args.study else "")
            + (" --removes" if args.removes else "")
        )
        record("studies", found, command=command, folder=RESULTS)
        if args.headline and not args.study:
            record("headline", headline(args.base), command=command, folder=RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
