"""Would test-time augmentation help? A finished study's saved models scored again on its held-out photos (a fold's,
or a pool study's pool), each photo's class probabilities averaged over views of it, written as a study of its own
that `foodvit cv --compare` pairs with the study itself, photo by photo.

    python -m bench.analysis.tta STUDY OUT --views flip       # the photo and its mirror image
    python -m bench.analysis.tta STUDY OUT --views flip,zoom  # and the photo zoomed to the resize side, mirrored
    foodvit cv --compare STUDY OUT

Views: `flip` mirrors the model's input (its centre crop is symmetric, so this is the mirrored photo's input);
`zoom` adds the photo resized to the model's side without the crop (the whole photo, squashed less than a crop
shows it), and its mirror with `flip`. Prints the seconds a photo costs with the views against without (the
prediction's cost at serving), and what each study scores. Nothing is trained; OUT holds only results.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from foodvit.data.folders import scan
from foodvit.data.photos import load_or_explain
from foodvit.data.preprocess import to_array
from foodvit.deploy.predictor import Predictor
from foodvit.recipes import load_recipe
from foodvit.tuning.compare import read_study
from foodvit.tuning.cv import summarise, write_study
from foodvit.tuning.fold import per_class, prediction_record
from foodvit.tuning.folds import fold_folder, fold_name, photo_key


def views(predictor: Predictor, image, kinds: list[str]) -> np.ndarray:
    """The model's inputs for one decoded photo: itself, then each asked view (V, 3, S, S)."""
    first = to_array(predictor.preprocess, image)
    out = [first]
    if "zoom" in kinds:
        whole = replace(predictor.preprocess, resize_mode="square")  # the whole photo at the model's side
        out.append(to_array(whole, image))
    if "flip" in kinds:
        out += [x[:, :, ::-1] for x in list(out)]
    return np.stack(out)


def score(run: Path, folder: Path, kinds: list[str]) -> tuple[list[dict], float, float]:
    """Each held-out photo's prediction with the views averaged, and the seconds a photo takes with and without."""
    predictor = Predictor.from_run(run)
    held = scan(folder / "test")
    records, plain_s, viewed_s = [], 0.0, 0.0
    for path, label in held.samples:
        image = predictor.decode(load_or_explain(path), str(path))
        batch = views(predictor, image, kinds)
        started = time.perf_counter()
        predictor.probabilities(batch[:1])
        plain_s += time.perf_counter() - started
        started = time.perf_counter()
        probabilities = predictor.probabilities(batch).mean(axis=0)
        viewed_s += time.perf_counter() - started
        records.append(prediction_record(photo_key(held, path), held.classes[label], probabilities, predictor.classes))
    n = max(len(held.samples), 1)
    return records, plain_s / n, viewed_s / n


def fold_result(fold: dict, records: list[dict], seconds: float) -> dict:
    """One seed's (or fold's) result from its photos' answers with the views: its own counts and classes, and the
    seconds its model took on them (nothing of the study it was scored from but which seed and fold it is)."""
    right = sum(r["right"] for r in records)
    return {
        **{key: fold[key] for key in ("seed", "fold", "run") if key in fold},
        "n": len(records),
        "correct": right,
        "accuracy": right / len(records),
        "per_class": per_class(records),
        "seconds": round(seconds, 2),
        "predictions": records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--views", default="flip", help="comma-separated: flip, zoom (default flip)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.views.split(",") if k.strip()]
    if not set(kinds) <= {"flip", "zoom"} or not kinds:
        raise SystemExit(f"--views takes flip and zoom, got {args.views}")
    study = args.study
    identity = json.loads((study / "study.json").read_text())
    found = read_study(study)
    seeds = len({f["seed"] for f in found["folds"]})
    results, plain, viewed = [], [], []
    for f in found["folds"]:
        pool = identity.get("kind") == "pool"
        run = study / (f"seed-{f['seed']}" if pool else fold_name(f["seed"], f["fold"], seeds))
        folder = study / "folds" / "pool" if pool else fold_folder(study / "folds", f["seed"], f["fold"])
        records, a, b = score(run, folder, kinds)
        results.append(fold_result(f, records, seconds=b * len(records)))
        plain.append(a)
        viewed.append(b)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "study.json").write_text(json.dumps(identity, indent=1))
    result = summarise(results)
    result = replace(result, pool=found.get("study", {}).get("pool", ""))
    write_study(args.out, load_recipe(found["recipe"]), result, results, identity)
    print(f"{study}: {found['accuracy']:.3f}; with {'+'.join(kinds)}: {result.accuracy:.3f}")
    print(f"model time a photo: {1000 * np.mean(plain):.1f} ms alone, {1000 * np.mean(viewed):.1f} ms with the views")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
