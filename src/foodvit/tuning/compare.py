"""Two studies side by side, photo by photo (`foodvit cv --compare A B`): two cross-validations of the same folds, or
two studies on the same validation pool (`foodvit cv --validate-on`).

Both studies scored the same held-out photos with the same folds, so each held-out prediction (a photo under one
seed) pairs with the other study's: the difference of the accuracies is the mean of the per-prediction differences
(each -1, 0 or +1). The photo is the unit of the standard error: a photo's predictions under several seeds are not
independent draws (the same photo, often the same answer), so each photo's differences are averaged over its seeds
first, and the standard error is that of the mean over photos. Repeating the same photos under more seeds with the
same answers leaves it where it was; treating every prediction as independent would shrink it by the square root of
the number of seeds. A finished study is read from its cv.json, which is all a study kept under results/cv holds; no
PyTorch is imported, so a comparison answers at once. A study still running (or stopped) has no cv.json yet; two such
studies, or one and a finished one, are paired over the runs both have finished (their results), and a study grown
by more seeds (cv.py) pairs with one of fewer over the seeds both hold; the line says which.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from foodvit.errors import FoodVitError, StudyError
from foodvit.files import read_json
from foodvit.recipes import load_recipe
from foodvit.rundir.compare import differences
from foodvit.settings.run import settings_sectioned


def prediction_key(seed: int, photo: str) -> str:
    """How a study keys one held-out prediction: the photo under one seed of folds."""
    return f"s{seed}/{photo}"


def photo_of(key: str) -> str:
    """The photo a prediction key names (its seed prefix dropped): the unit the standard error counts."""
    return key.split("/", 1)[1] if "/" in key else key


def clustered_standard_error(diffs: dict[str, float]) -> tuple[float, int]:
    """The standard error of the mean of per-prediction values with the photo as the unit: each photo's
    values averaged over its seeds, then the standard error of the mean over photos. Returns it and the
    number of photos (NaN under two photos)."""
    by_photo: dict[str, list[float]] = {}
    for key, value in diffs.items():
        by_photo.setdefault(photo_of(key), []).append(value)
    means = [statistics.mean(values) for values in by_photo.values()]
    se = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    return se, len(means)


def by_seed(diffs: dict[str, float]) -> dict[int, float]:
    """Each training seed's own mean difference (keys as prediction_key makes them; {} for keys without a seed).
    Beside the pooled difference it shows whether one seed carries a lead: the difference can vary from seed to seed
    by more than one seed's paired standard error, and a lead of one seed alone has vanished over three."""
    seeds: dict[int, list[float]] = {}
    for key, value in diffs.items():
        seed = seed_of(key)
        if seed is None:
            return {}
        seeds.setdefault(seed, []).append(value)
    return {seed: statistics.mean(values) for seed, values in sorted(seeds.items())}


def seed_of(key: str) -> int | None:
    """The training seed a prediction key names (prediction_key's 's42/...'); None for a key without one."""
    head, slash, _ = key.partition("/")
    return int(head[1:]) if slash and head.startswith("s") and head[1:].isdigit() else None


def paired(a: dict[str, bool], b: dict[str, bool]) -> dict:
    """B - A photo by photo (the same photos, seeds and folds): the mean difference, its standard
    error with the photo as the unit, the numbers of predictions and photos, and the predictions only
    one of them got right."""
    if set(a) != set(b):
        raise StudyError(
            f"the two studies do not hold the same photos ({len(set(a) ^ set(b))} differ): compare studies of the "
            "same data, folds and seeds"
        )
    if not a:  # a cv.json whose photos were emptied: statistics' own error on an empty mean
        raise StudyError("the two studies hold no photos to pair; run `foodvit cv` on them again to finish them")
    diffs = {k: float(int(b[k]) - int(a[k])) for k in sorted(a)}
    se, photos = clustered_standard_error(diffs)
    return {
        "difference": statistics.mean(diffs.values()),
        "standard_error": se,
        "n": len(diffs),
        "photos": photos,
        "by_seed": by_seed(diffs),
        "only_a": sorted(k for k in a if a[k] and not b[k]),
        "only_b": sorted(k for k in a if b[k] and not a[k]),
    }


def _result_file(path: Path, keys: tuple[str, ...]) -> dict:
    """A study's JSON result file holding `keys`, or a one-line error naming the damaged file."""
    try:
        result = read_json(path)
    except (OSError, ValueError) as e:
        raise StudyError(
            f"{path} is damaged ({type(e).__name__}); remove it and run `foodvit cv` on its study again "
            "to redo that part"
        ) from None
    if not isinstance(result, dict) or any(key not in result for key in keys):
        raise StudyError(
            f"{path} is damaged (not a result with {', '.join(keys)}); remove it and run `foodvit cv` on "
            "its study again to redo that part"
        )
    return result


def is_run_result(result) -> bool:
    """Whether a run's written result (fold-K.json, seed-S.json) has the shape a study writes: its seed and fold whole
    numbers, and its predictions a list of each photo's name and answer, right or not."""
    return (
        isinstance(result, dict)
        and all(isinstance(result.get(key), int) and not isinstance(result[key], bool) for key in ("seed", "fold"))
        and isinstance(result.get("predictions"), list)
        and all(
            isinstance(p, dict) and isinstance(p.get("photo"), str) and isinstance(p.get("right"), bool)
            for p in result["predictions"]
        )
    )


def read_study(study: str | Path) -> dict:
    """A finished study's cv.json (accuracy, folds, and each held-out photo right or wrong), or a one-line error."""
    path = Path(study) / "cv.json"
    if not path.exists():
        raise StudyError(
            f"{study} holds no finished cross-validation (no cv.json); run `foodvit cv --out {study}` to finish it"
        )
    found = _result_file(path, ("photos",))
    photos, folds = found["photos"], found.get("folds", [])
    if not isinstance(photos, dict) or not all(isinstance(right, bool) for right in photos.values()):
        raise StudyError(
            f"{path} is damaged (its photos are not each photo's answer, right or not); remove it and run "
            f"`foodvit cv --out {study}` to write it again from its runs"
        )
    if not isinstance(folds, list) or not all(
        isinstance(f, dict) and ("seed" not in f or (type(f["seed"]) is int and type(f.get("fold")) is int))
        for f in folds
    ):
        raise StudyError(
            f"{path} is damaged (its folds are not the list of runs a study writes); remove it and run "
            f"`foodvit cv --out {study}` to write it again from its runs"
        )
    return found


def finished_results(study: str | Path) -> dict[tuple[int, int], dict]:
    """The runs a study has finished so far, (seed, fold) -> its written result (fold-K.json, seed-S/fold-K.json,
    seed-S.json); or a one-line error when the folder is no study or a result is damaged."""
    folder = Path(study)
    if not (folder / "study.json").is_file():
        raise StudyError(
            f"{study} is no cross-validation study (no study.json); give a folder `foodvit cv --out` wrote"
        )
    found = {}
    for path in result_files(folder):
        result = _result_file(path, ("seed", "fold", "predictions"))
        if not is_run_result(result):
            raise StudyError(
                f"{path} is damaged (its seed, fold or predictions are not as a study writes them); remove it and run "
                "`foodvit cv` on its study again to redo that part"
            )
        found[(result["seed"], result["fold"])] = result
    return found


def result_files(study: str | Path) -> list[Path]:
    """Every run result a study folder holds: fold-K.json (one seed of folds), seed-S/fold-K.json (several), seed-S.json
    (a pool study's), as tuning/folds.py names the runs."""
    folder = Path(study)
    return sorted([*folder.glob("fold-*.json"), *folder.glob("seed-*/fold-*.json"), *folder.glob("seed-*.json")])


def finished_folds(study: str | Path) -> dict[tuple[int, int], dict[str, bool]]:
    """The folds a study has finished so far, (seed, fold) -> each held-out photo right or wrong, keyed
    as cv.json keys them; or a one-line error when the folder is no cross-validation study."""
    return {
        unit: {prediction_key(result["seed"], p["photo"]): p["right"] for p in result["predictions"]}
        for unit, result in finished_results(study).items()
    }


def compare_line(result: dict, name_a: str, name_b: str, folds: str = "") -> str:
    """paired()'s result as the one line `foodvit cv --compare` prints (folds: which folds, when not all)."""
    over = f"{result['photos']} photos"
    if result["n"] != result["photos"]:
        over += f" ({result['n']} predictions, each photo's averaged over its seeds first)"
    return (
        f"{name_b} - {name_a} = {result['difference']:+.3f} +- {result['standard_error']:.3f} "
        f"(paired standard error over {over}{folds}; {len(result['only_b'])} right only in {name_b}, "
        f"{len(result['only_a'])} only in {name_a}{seeds_alone(result.get('by_seed', {}))})"
    )


def seeds_alone(by_seed: dict[int, float], sign: float = 1.0) -> str:
    """'; seeds 0 / 1 / 2 alone: +0.038 / -0.015 / +0.013' (each seed's difference times `sign`; -1 gives a removed
    component's worth), or '' under two seeds."""
    if len(by_seed) < 2:
        return ""
    differences = " / ".join(f"{0.0 + sign * d:+.3f}" for d in by_seed.values())  # 0.0 +: never -0.000
    return f"; seeds {' / '.join(map(str, by_seed))} alone: {differences}"


def study_identity(study: str | Path) -> dict:
    """What a study folder says it is (study.json, or a tune trial's trial.json): its kind, photos, folds, seeds,
    validation pool and settings; {} when it does not say (a folder from before studies said so: its photos are then
    paired as they are)."""
    for name in ("study.json", "trial.json"):
        path = Path(study) / name
        try:
            found = read_json(path)
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # absent or unreadable: the study's results say what they can
        if not isinstance(found, dict) or "data" not in found:
            continue
        if not isinstance(found.get("settings", {}), dict) or not isinstance(found.get("seeds", []), list):
            raise StudyError(
                f"{path} is damaged (its settings or seeds are not as foodvit writes them): the study cannot be "
                "compared; restore the file, or run the study again under a new --out"
            )
        if "seed" in found and "seeds" not in found:  # a trial: one seed of folds
            found["seeds"] = [found["seed"]]
        return found
    return {}


def _describe(identity: dict) -> str:
    """A study's design in words, e.g. '5-fold CV, seeds [0]', 'a study on validation pool 6a4f79a2, seeds [0, 1]'."""
    if identity.get("kind") == "pool":
        return f"a study on validation pool {str(identity.get('validation', '?'))[:8]}, seeds {identity.get('seeds')}"
    if identity.get("kind") == "test":
        return f"a study on a test split, seeds {identity.get('seeds')}"
    return f"{identity.get('folds')}-fold CV, seeds {identity.get('seeds')}"


def check_comparable(a: str | Path, b: str | Path) -> str:
    """Two studies pair photo by photo only when they scored the same photos the same way: the same training photos,
    the same design (k-fold CV with the same folds, or the same validation pool) and some of the same seeds (they pair
    on those); else a StudyError that says which differs. Returns the settings that differ, as the comparison's line
    names them ('' when none)."""
    ia, ib = study_identity(a), study_identity(b)
    if not ia or not ib:
        return ""
    kind_a, kind_b = ("cv" if i.get("kind") == "trial" else i.get("kind") for i in (ia, ib))  # a trial's folds: CV
    design = [key for key in ("folds", "validation") if ia.get(key) != ib.get(key)]
    if not set(ia.get("seeds") or []) & set(ib.get("seeds") or []):  # studies of some of the same seeds pair on those
        design.append("seeds")
    if kind_a != kind_b or design:
        raise StudyError(
            f"{a} is {_describe(ia)} and {b} is {_describe(ib)}: their photos are scored differently, so they do not "
            "pair; compare studies of the same data, folds (or validation pool) and seeds"
        )
    if ia.get("data") != ib.get("data"):
        raise StudyError(
            f"{a} and {b} trained on different photos (fingerprints {ia.get('data')} and {ib.get('data')}): compare "
            "studies of the same data, folds and seeds"
        )
    changed = differences(settings_sectioned(ia.get("settings", {})), settings_sectioned(ib.get("settings", {})))
    shown = ", ".join(f"{key} {x!r} -> {y!r}" for key, x, y in changed[:4])
    return shown + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def _answers(study: str | Path, identity: dict) -> tuple[dict[str, bool], dict[tuple[int, int], dict], bool]:
    """A study's answers (prediction key -> right), its runs that gave them ((seed, fold) -> the run's result, its
    predictions left out where cv.json is read) and whether they are the whole study: cv.json when it summarises the
    seeds study.json names (a study kept under results/cv holds nothing else), else the runs finished so far."""
    seeds = identity.get("seeds")
    if _summarised(study, seeds):
        found = read_study(study)
        runs = {(f["seed"], f["fold"]): f for f in found.get("folds", []) if isinstance(f, dict) and "seed" in f}
        if not runs and isinstance(seeds, list):  # a summary that does not list its runs: its design does
            runs = {(seed, fold): {} for seed in seeds for fold in range(_runs_a_seed(identity))}
        return found["photos"], runs, True
    results = finished_results(study)
    answers = {prediction_key(r["seed"], p["photo"]): p["right"] for r in results.values() for p in r["predictions"]}
    return answers, results, False


def _runs_a_seed(identity: dict) -> int:
    """How many runs a study trains a seed: its folds (1 for a pool study)."""
    folds = identity.get("folds")
    return folds if isinstance(folds, int) and folds > 0 else 1


def compare_studies(a: str | Path, b: str | Path) -> tuple[dict, str]:
    """Study B against study A: paired()'s result and its line (with the settings B changes); over the runs both have
    finished when either is not finished yet, and over the seeds both hold when one holds more (a study grown by
    seeds). Studies of another design, of no seed in common or of other photos are refused."""
    changed = check_comparable(a, b)
    ia, ib = study_identity(a), study_identity(b)
    answers_a, runs_a, whole_a = _answers(a, ia)
    answers_b, runs_b, whole_b = _answers(b, ib)
    seeds_a, seeds_b = ia.get("seeds"), ib.get("seeds")
    label = ""
    both = sorted(runs_a.keys() & runs_b.keys())
    if whole_a and whole_b and (seeds_a == seeds_b or not ia or not ib):
        result = paired(answers_a, answers_b)
    else:
        if not both:
            unit = "seed" if ia.get("kind") == "pool" else "fold"
            raise StudyError(
                f"{a} and {b} have no finished {unit} in common yet ({len(runs_a)} and {len(runs_b)} finished): "
                f"compare them once a {unit} has run in both"
            )
        seeds = {seed for seed, _ in both}
        common = [key for key in answers_a.keys() & answers_b.keys() if seed_of(key) in seeds]
        result = paired({k: answers_a[k] for k in common}, {k: answers_b[k] for k in common})
        label = _paired_label(both, ia, seeds_a, seeds_b)
    suffix = (f"; {b} changes {changed}" if changed else "") + other_chips(
        a, b, runs_a, runs_b, both, ia.get("kind") == "pool"
    )
    return result, compare_line(result, str(a), str(b), label) + suffix


def _paired_label(both: list[tuple[int, int]], identity: dict, seeds_a, seeds_b) -> str:
    """Which runs a comparison of unfinished studies, or of studies of other seeds, paired, as its line says it: ' of
    seeds 0, 1, which both studies hold' when those seeds' runs all paired, else ' of the folds (the seeds of a pool
    study) both have finished, ...' naming each (its seed, and its fold in a CV study)."""
    pool = identity.get("kind") == "pool"
    shared = sorted(set(seeds_a or []) & set(seeds_b or []))
    if shared and both == [(seed, fold) for seed in shared for fold in range(_runs_a_seed(identity))]:
        return f" of seeds {', '.join(map(str, shared))}, which both studies hold" if seeds_a != seeds_b else ""
    several = len(set(seeds_a or []) | set(seeds_b or []) | {seed for seed, _ in both}) > 1
    if pool:
        names = ("seeds " if len(both) > 1 else "seed ") + ", ".join(str(seed) for seed, _ in both)
    elif several:
        names = ", ".join(f"seed {seed} fold {fold}" for seed, fold in both)
    else:
        names = ("folds " if len(both) > 1 else "fold ") + ", ".join(str(fold) for _, fold in both)
    return f" of the {'seeds' if pool else 'folds'} both have finished, {names}"


def other_chips(a, b, runs_a: dict, runs_b: dict, paired_runs: list[tuple[int, int]], pool: bool = False) -> str:
    """'; N of the M paired runs trained on other chips (...)' when runs that pair trained on different chips (each
    run's result names its chip, engine.processor), whose rounding alone moves photos between the two
    (results/studies.csv: the default on two CPU models from the same seeds, -0.003 +- 0.012 on the pool); '' when
    every pair trained on one chip, or a run does not say."""
    chips = [(unit, runs_a[unit].get("processor"), runs_b[unit].get("processor")) for unit in paired_runs]
    other = [(unit, x, y) for unit, x, y in chips if isinstance(x, str) and isinstance(y, str) and x != y]
    if not other:
        return ""
    (seed, fold), x, y = other[0]
    run = f"seed {seed}" + ("" if pool else f" fold {fold}")
    return (
        f"; {len(other)} of the {len(chips)} paired runs trained on other chips ({run}: {x} in {a}, {y} in {b}), "
        "whose rounding alone moves photos: pair runs trained on one"
    )


def _summarised(study: str | Path, seeds) -> bool:
    """Whether the study's cv.json summarises the seeds its study.json names (a study may grow by seeds; a summary of
    fewer, or none yet, leaves the pairing to its runs' results). A cv.json that does not name its seeds counts."""
    path = Path(study) / "cv.json"
    if not path.exists():
        return False
    try:
        named = read_json(path).get("study", {}).get("seeds")
    except (OSError, ValueError, AttributeError):
        return True  # read_study says what is wrong with it
    return named is None or seeds is None or named == seeds


# What a series of studies varies on purpose (the photos' share and where they are), left out of a study's recipe name.
VARIED = ("recipe", "data.source", "data.train_fraction")


def study_recipe(study: str | Path) -> str:
    """The recipe a finished study names in its own files: cv.json's recipe, and the settings of study.json that differ
    from that recipe as this version loads it, e.g. 'default' or 'default (masked.weight=0.0)'. The photos' share and
    folder are left out: studies of one recipe at several shares are one series."""
    name = read_study(study)["recipe"]
    stored = read_json(Path(study) / "study.json").get("settings", {})
    try:
        recipe = load_recipe(name).to_dict()
    except FoodVitError:  # a recipe file that is not here: the name alone
        return name
    changed = [
        (key, b)
        for key, _, b in differences(recipe, settings_sectioned(stored))
        if key not in VARIED and key.split(".")[0] not in VARIED
    ]
    return name + (" (" + ", ".join(f"{key}={value}" for key, value in changed) + ")" if changed else "")
