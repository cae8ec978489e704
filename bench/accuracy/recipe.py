"""Per-image test accuracy of a recipe over several seeds: mean, spread, per class, wall time.

    python -m bench.accuracy.recipe --recipe default --seeds 3
    python -m bench.accuracy.recipe --recipe course --seeds 3 --data ../shared/data/pizza_steak_sushi
    # any train option after --
    python -m bench.accuracy.recipe --recipe default --seeds 3 -- --epochs 50 --augment strong

Each seed is a full `foodvit train` run in --out/<recipe>-s<seed>; nothing is chosen by test
accuracy (the runs report their last epoch). Prints a table, and --json writes the figures.

    python -m bench.accuracy.recipe --recipe default --seeds 2 --cv 5      # the tuning protocol: no test photo used

--cv K: K-fold cross-validation over the training photos alone, through `foodvit cv` (tuning/cv.py;
folders.cv_folds: stratified, every photo validated once per seed; the study folder is
--out/<recipe>-cv<K>[-<hash of the options>], resumed when rerun). Each fold trains on the other K-1
folds and is evaluated on its own; the K folds' predictions together cover every training photo.
Reported: accuracy over the photos (each photo's share right over the seeds) and its standard error.
The test split is never read. --test-sizes 72,80 also scores each fold's model rebuilt at those
sizes (what --test-size gives), --crop-pcts 0.8,1 with those centre-crop shares (what --crop-pct
gives); the JSON keeps every photo's result, and --paired A.json B.json compares two recipes photo
by photo.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench import results
from foodvit.cli.main import main as foodvit
from foodvit.data.datasource import DataSource
from foodvit.errors import StudyError
from foodvit.tuning.compare import compare_line, paired
from foodvit.tuning.folds import fold_folder, fold_name


def machine() -> str:
    """bench.results.machine of the device the runs use, with the torch version."""
    return f"{results.machine(torch.device('cuda') if torch.cuda.is_available() else None)}, torch {torch.__version__}"


def run_seeds(
    recipe: str, seeds: list[int], out: Path, data: str | None, extra: list[str], val_only: bool = False
) -> dict:
    rows = []
    for seed in seeds:
        run = out / f"{Path(recipe).stem}-s{seed}"
        args = ["train", "--recipe", recipe, "--seed", str(seed), "--out", str(run), "--quiet", *extra]
        if data:
            args += ["--data", data]
        if (run / "model.json").is_file():
            print(f"seed {seed}: reusing finished run {run}", file=sys.stderr)
        else:
            started = time.perf_counter()
            code = foodvit(args)
            if code != 0:
                raise SystemExit(f"seed {seed} failed (exit {code})")
            print(f"seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        card = json.loads((run / "model.json").read_text())
        metrics = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
        header, last = metrics[0], dict(zip(metrics[0], metrics[-1], strict=False))
        seconds = sum(float(dict(zip(header, m, strict=False))["seconds"]) for m in metrics[1:])
        per_class = _per_class(run) if not val_only else {}
        rows.append(
            {
                "seed": seed,
                "test_acc": None if val_only else card["metrics"]["test_acc"],
                "test_n": card["metrics"]["test_n"],
                "val_acc": float(last["val_acc"]) if last.get("val_acc") else None,
                "seconds": seconds,
                "per_class": per_class,
            }
        )
    accs = [r["val_acc"] if val_only else r["test_acc"] for r in rows]
    return {
        "recipe": recipe,
        "extra": extra,
        "data": data,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "seeds": rows,
        "mean": statistics.mean(accs),
        "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "min": min(accs),
        "max": max(accs),
        "mean_seconds": statistics.mean(r["seconds"] for r in rows),
    }


def _per_class(run: Path) -> dict[str, float]:
    from foodvit.deploy.inference import evaluate_split
    from foodvit.deploy.predictor import Predictor

    config = json.loads((run / "config.json").read_text())
    predictor = Predictor.from_run(run)
    return evaluate_split(predictor, DataSource.parse(config["data"]["source"] or None).open_split("test"))["per_class"]


def fold_predictions(
    run: Path, held: Path, test_sizes: list[int], crop_pcts: list[float] = ()
) -> dict[str, dict[str, bool]]:
    """Whether each held-out photo is classified right by the fold's saved model: at its own size and
    preprocessing ("0"), at each of test_sizes ("72", ...) and with each centre-crop share of crop_pcts
    ("crop 0.8", ...). Exactly what `foodvit train --test-size S` (the same model rebuilt at S, its
    preprocessing scaled) or `--crop-pct C` (the photo's shorter side resized to size / C before the
    centre crop) would have saved and tested: neither changes anything before the end of training
    (random resized crops do not read the crop share; training photos are decoded at twice the size,
    which a share of 0.5 or more never exceeds: main refuses smaller ones)."""
    from foodvit.data.preprocess import make_preprocess
    from foodvit.deploy.inference import predict
    from foodvit.deploy.predictor import Predictor
    from foodvit.model.weights import resize_model

    base = Predictor.from_run(run)
    split = DataSource.parse(str(held)).open_split("test")
    paths = [path for path, _ in split.samples]
    truths = [split.classes[label] for _, label in split.samples]
    p = base.preprocess
    if crop_pcts and p.mode != "crop":
        raise SystemExit(
            f"--crop-pcts varies the centre crop, and {run} resizes its photos to a square (resize mode {p.mode!r})"
        )
    predictors = {"0": base}
    predictors.update(
        {
            str(size): Predictor(resize_model(base.model, size).eval(), base.classes, p.at_size(size))
            for size in test_sizes
        }
    )
    predictors.update(
        {
            f"crop {pct:g}": Predictor(
                base.model, base.classes, make_preprocess(p.image_size, p.mean, p.std, p.mode, pct, p.interpolation)
            )
            for pct in crop_pcts
        }
    )
    return {
        key: {
            f"{Path(path).parent.name}/{Path(path).name}": result["label"] == truth
            for path, truth, result in zip(paths, truths, predict(predictor, paths), strict=False)
        }
        for key, predictor in predictors.items()
    }


def run_cv(
    recipe: str,
    seeds: list[int],
    k: int,
    out: Path,
    data: str | None,
    extra: list[str],
    test_sizes: list[int] = (),
    crop_pcts: list[float] = (),
) -> dict:
    """K-fold CV over the training photos for each seed: `foodvit cv` (tuning/cv.py: fold folders
    of links whose test/ is the held-out fold, so no run sees the real test photos; finished folds
    kept), plus what only this benchmark asks: each fold's model at other test sizes or crop shares and a distilled
    recipe's teachers."""
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise SystemExit(
            "--cv runs consecutive seeds (foodvit cv --seed S --seeds N): give --seeds N or consecutive --seed-list"
        )
    # one study folder per recipe and options: a rerun resumes it, other options get their own
    tag = "-" + hashlib.sha1(" ".join(extra).encode()).hexdigest()[:8] if extra else ""
    study = out / f"{Path(recipe).stem}-cv{k}{tag}"
    started = time.perf_counter()
    code = foodvit(
        [
            "cv",
            "--recipe",
            recipe,
            "--folds",
            str(k),
            "--seed",
            str(seeds[0]),
            "--seeds",
            str(len(seeds)),
            "--out",
            str(study),
            "--quiet",
            *extra,
        ]
        + (["--data", data] if data else [])
    )
    if code != 0:
        raise SystemExit(f"foodvit cv failed (exit {code})")
    result = json.loads((study / "cv.json").read_text())
    photos = {"0": result["photos"]}  # test size or "crop C" ("0": the run's own) -> "s<seed>/<class>/<photo>" -> right
    total = sum(f["n"] for f in result["folds"])
    teacher_correct = 0
    for f in result["folds"]:
        run = study / fold_name(f["seed"], f["fold"], len(seeds))
        metrics = json.loads((run / "model.json").read_text())["metrics"]
        teacher_correct += round(metrics.get("teacher_test_acc", 0) * metrics["test_n"])
        if test_sizes or crop_pcts:
            held = fold_folder(study / "folds", f["seed"], f["fold"])
            for key, right in fold_predictions(run, held, list(test_sizes), list(crop_pcts)).items():
                if key != "0":
                    photos.setdefault(key, {}).update({f"s{f['seed']}/{name}": r for name, r in right.items()})
    per_seed = [
        sum(f["correct"] for f in result["folds"] if f["seed"] == seed)
        / sum(f["n"] for f in result["folds"] if f["seed"] == seed)
        for seed in seeds
    ]
    for seed, acc in zip(seeds, per_seed, strict=False):
        print(f"seed {seed}: cv accuracy {acc:.3f}", file=sys.stderr)
    return {
        "recipe": recipe,
        "extra": extra,
        "folds": k,
        "seeds": seeds,
        "per_seed": per_seed,
        "accuracy": result["accuracy"],
        "accuracy_at_test_size": {size: sum(right.values()) / len(right) for size, right in photos.items()},
        "photos": photos,
        "teacher_accuracy": teacher_correct / total if "--distill" in extra or teacher_correct else None,
        "standard_error": result["standard_error"],
        "predictions": total,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - started,
    }


def print_validation(result: dict) -> None:
    """Tuning view: validation accuracy only, so that no choice is made on the test split."""
    vals = [r["val_acc"] for r in result["seeds"]]
    if any(v is None for v in vals):
        raise SystemExit("--val-only needs a validation split: add -- --val-fraction 0.2")
    spread = statistics.stdev(vals) if len(vals) > 1 else 0.0
    print(
        f"recipe {result['recipe']} {' '.join(result['extra'])}: val acc {statistics.mean(vals):.3f} +- {spread:.3f} "
        f"({', '.join(f'{v:.3f}' for v in vals)}); {result['mean_seconds']:.0f} s per run"
    )


def print_table(result: dict) -> None:
    print(f"recipe {result['recipe']} {' '.join(result['extra'])}  |  {result['machine']}  |  {result['date']}")
    classes = list(result["seeds"][0]["per_class"])
    print("seed  test_acc  " + "  ".join(f"{c:>8}" for c in classes) + "  val_acc  train_s")
    for r in result["seeds"]:
        val = f"{r['val_acc']:.3f}" if r["val_acc"] is not None else "   --"
        print(
            f"{r['seed']:>4}  {r['test_acc']:.3f}     "
            + "  ".join(f"{r['per_class'][c]:>8.3f}" for c in classes)
            + f"  {val:>7}  {r['seconds']:>7.0f}"
        )
    print(
        f"mean {result['mean']:.3f} +- {result['std']:.3f} (min {result['min']:.3f}, max {result['max']:.3f}) over "
        f"{len(result['seeds'])} seeds; {result['mean_seconds']:.0f} s per run"
    )


def variant_order(key: str) -> tuple:
    """The run's own preprocessing ("0"), the test sizes in order, then the crop shares ("crop 0.8") in order."""
    return (0, int(key)) if key.isdigit() else (1, float(key.split()[-1]))


def print_paired(a: dict, b: dict, names: list[str]) -> None:
    """B - A photo by photo (foodvit cv --compare's arithmetic), at every test size both scored."""
    for size in sorted(set(a["photos"]) & set(b["photos"]), key=variant_order):
        try:
            result = paired(a["photos"][size], b["photos"][size])
        except StudyError as err:
            raise SystemExit(str(err)) from None
        label = "own size" if size == "0" else f"test size {size}" if size.isdigit() else size
        print(f"{label}: " + compare_line(result, names[0], names[1]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="default")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, 2, ...)")
    parser.add_argument("--seed-list", help="explicit seeds, comma-separated")
    parser.add_argument("--data", help="data source (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--out", default="runs/bench-accuracy")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument(
        "--val-only", action="store_true", help="tuning: report validation accuracy only, never the test split"
    )
    parser.add_argument("--cv", type=int, metavar="K", help="tuning: K-fold cross-validation over the training photos")
    parser.add_argument(
        "--test-sizes",
        default="",
        help="with --cv: also score each fold's model at these test sizes (what "
        "--test-size would give), comma-separated",
    )
    parser.add_argument(
        "--crop-pcts",
        default="",
        help="with --cv: also score each fold's model with these centre-crop shares "
        "(what --crop-pct would give), comma-separated",
    )
    parser.add_argument(
        "--paired", nargs=2, metavar="JSON", help="compare two --cv results photo by photo (same folds and seeds)"
    )
    args = parser.parse_args(argv)
    if args.paired:
        print_paired(*(json.loads(Path(p).read_text()) for p in args.paired), args.paired)
        return 0
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    if args.cv:
        sizes = [int(x) for x in args.test_sizes.split(",") if x]
        crops = [float(x) for x in args.crop_pcts.split(",") if x]
        if not all(0.5 <= pct <= 1 for pct in crops):  # below 0.5 the training photos' decode size would change too
            raise SystemExit(
                "--crop-pcts takes centre-crop shares from 0.5 to 1 (what --crop-pct changes after training alone), "
                f"got {args.crop_pcts}"
            )
        result = run_cv(args.recipe, seeds, args.cv, Path(args.out), args.data, extra, sizes, crops)
        print(
            f"recipe {result['recipe']} {' '.join(extra)}: {args.cv}-fold CV accuracy {result['accuracy']:.3f} +- "
            f"{result['standard_error']:.3f} (standard error over {result['predictions']} predictions, "
            f"{len(seeds)} seeds: "
            f"{', '.join(f'{a:.3f}' for a in result['per_seed'])}); {result['seconds']:.0f} s"
        )
        shown = [(str(size), f"tested at {size} px (--test-size {size})") for size in sizes]
        shown += [(f"crop {pct:g}", f"tested with a centre crop of {pct:g} (--crop-pct {pct:g})") for pct in crops]
        for key, label in shown:
            print(
                f"  {label}: {result['accuracy_at_test_size'][key]:.3f}; "
                + compare_line(paired(result["photos"]["0"], result["photos"][key]), "its own preprocessing", key)
            )
        if result["teacher_accuracy"] is not None:
            print(f"  the distillation teachers on their own: {result['teacher_accuracy']:.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0
    result = run_seeds(args.recipe, seeds, Path(args.out), args.data, extra, args.val_only)
    print_validation(result) if args.val_only else print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
