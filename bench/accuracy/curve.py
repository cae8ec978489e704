"""The data-efficiency curve: 5-fold cross-validation accuracy of the default ViT and of a ResNet-18
from scratch, at several numbers of training photos a class.

    # FoodVision Mini: 15, 30, 45, 75 a class
    python -m bench.accuracy.curve --out runs/curve
    # 150 a class
    python -m bench.accuracy.curve --out runs/curve-20 --fractions 1 --data ../shared/data/pizza_steak_sushi_20_percent
    # table and plot
    python -m bench.accuracy.curve --out runs/curve --plot docs/images/data-efficiency.png --extra runs/curve-20

A data set of n photos a class is --train-fraction n / (photos a class) of it: each fold of the
5-fold CV over the training photos (seed 0, the folds `foodvit cv --seed 0` makes) trains on that
share of its training part (drawn with the seed, the same photos for both models) and is scored on
its whole held-out fifth, so every point is judged on all the training photos and the two models
pair photo by photo. The ViT is `foodvit cv` with the default recipe (options this script does not
know go to it, and to it alone); the CNN is torchvision's
ResNet-18 from random initialisation, trained by foodvit's own teacher code (training/teacher.py)
with the recipe's photos, augmentation, optimiser, schedule and epochs: the CNN peer
(--cnn resnet34 scores a deeper one, e.g. the teachers of a `--teacher resnet34` study).
Studies are kept in --out (vit-f<share>, cnn-f<share>, each with cv.json as `foodvit cv` writes
it, so `foodvit cv --compare` pairs any two); finished folds are not trained again. Each ViT study's series is the
recipe it names in its own files (`foodvit.tuning.compare.study_recipe`: its recipe and the settings it changed).
`--record` appends each point of the default recipe's series to results/curve.csv.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from foodvit.cli.main import main as foodvit
from foodvit.errors import FoodVitError
from foodvit.recipes import load_recipe
from foodvit.rundir.directory import with_source
from foodvit.settings.run import TEACHERS, RunConfig
from foodvit.training.teacher import teacher_changes
from foodvit.tuning.compare import paired, read_study, study_recipe
from foodvit.tuning.cv import summarise, write_study
from foodvit.tuning.fold import prediction_record
from foodvit.tuning.folds import fingerprint, fold_folders, training_photos
from foodvit.tuning.study import study_settings

FOLDS, SEED = 5, 0


def vit_study(out: Path, share: float, data: str | None, extra: list[str]) -> Path:
    study = out / f"vit-f{share:g}"
    if not (study / "cv.json").is_file():
        args = [
            "cv",
            "--seed",
            str(SEED),
            "--folds",
            str(FOLDS),
            "--eval-every",
            "100",
            "--train-fraction",
            f"{share:g}",
            "--out",
            str(study),
            "--quiet",
            *extra,
        ] + (["--data", data] if data else [])
        if foodvit(args) != 0:
            raise SystemExit(f"foodvit cv at share {share:g} failed")
    return study


def cnn_fold(config, folder: Path, run: Path, fold: int, teachers: Path | None) -> dict:
    """One fold of the CNN: trained (or its teacher.pt reused from a guided or distilled study of the
    same fold, which trained the same network), then its held-out photos predicted."""
    from foodvit.training.trainer import Trainer

    result_file = run.with_name(run.name + ".json")
    if result_file.is_file():
        return json.loads(result_file.read_text())
    run.mkdir(parents=True, exist_ok=True)
    lent = teachers / f"fold-{fold}" / "teacher.pt" if teachers is not None else None
    trainer = Trainer(
        replace(config, data=replace(config.data, source=str(folder.resolve()))),
        run,
        quiet=True,
        teacher_file=lent if lent is not None and lent.is_file() else None,
    )
    teacher = trainer.teacher()
    # its training as recorded when it was trained (here or in the guided study), and this evaluation
    result = held_out_result(
        trainer, teacher.module, SEED, fold, run.name, sum(row["seconds"] for row in teacher.history)
    )
    result_file.write_text(json.dumps(result, indent=1))
    return result


def held_out_result(trainer, network, seed: int, fold: int, name: str, seconds: float = 0.0) -> dict:
    """A CNN's predictions on a fold's held-out photos (the trainer's test split), as `foodvit cv` writes a
    fold's result; `seconds` is added to the time the prediction takes."""
    from foodvit.training.engine import evaluate

    started = time.perf_counter()
    test = evaluate(
        network, trainer.test_loader, trainer.settings, num_classes=len(trainer.classes), keep_probabilities=True
    )
    predictions = [
        prediction_record(f"{Path(path).parent.name}/{Path(path).name}", trainer.classes[label], p, trainer.classes)
        for (path, label), p in zip(trainer.data.test.samples, test["probabilities"], strict=False)
    ]
    right = sum(p["right"] for p in predictions)
    return {
        "seed": seed,
        "fold": fold,
        "run": name,
        "n": len(predictions),
        "correct": right,
        "accuracy": right / len(predictions),
        "per_class": {c: statistics.mean(p["right"] for p in predictions if p["label"] == c) for c in trainer.classes},
        "seconds": round(seconds + time.perf_counter() - started, 2),
        "predictions": predictions,
    }


def cnn_study(
    out: Path, share: float, data: str | None, teachers: Path | None, epochs: int | None = None, cnn: str = "resnet18"
) -> Path:
    study = out / f"cnn-f{share:g}"
    if (study / "cv.json").is_file():
        return study
    config = load_recipe("default")
    config = replace(
        config,
        data=replace(config.data, source=data or "", train_fraction=share),
        train=replace(config.train, seed=SEED, epochs=epochs or config.train.epochs),
        distill=replace(config.distill, weight=1.0),
        teacher=replace(config.teacher, architecture=cnn),
    )
    config = with_source(config)
    split = training_photos(config)
    folders = fold_folders(split, FOLDS, SEED, study / "folds")
    if share != 1:
        teachers = None
    if teachers is not None and not lends_teachers(teachers, config):
        raise SystemExit(
            f"{teachers}: its {cnn}s were not trained as this study's would be (another recipe, epochs or "
            "photos): leave --teachers out"
        )
    if teachers is None and lends_teachers(out / f"vit-f{share:g}", config):
        teachers = out / f"vit-f{share:g}"
    results = [cnn_fold(config, folder, study / f"fold-{k}", k, teachers) for k, folder in enumerate(folders)]
    identity = {
        "kind": "cv",
        "data": fingerprint(split),
        "classes": list(split.classes),
        "folds": FOLDS,
        "seeds": [SEED],
        "settings": study_settings(config.to_dict()),
    }  # as the ViT's study of these folds says
    write_study(
        study, replace(config, recipe=f"{cnn} (default recipe's training)"), summarise(results), results, identity
    )
    return study


def guided(study: Path) -> bool:
    """Whether a ViT study trained with locality guidance (the default recipe's guidance; the
    curve's first points were measured without it): read from its first fold's saved config."""
    config = RunConfig.from_dict(json.loads((study / "fold-0" / "config.json").read_text()))  # either layout
    return config.guidance.weight > 0


def lends_teachers(vit: Path, config) -> bool:
    """Whether a ViT study's fold-K/teacher.pt are the ResNet-18s this CNN study would train: the study
    is guided, and its image size, photos' settings, optimiser, schedule, epochs and seed are the CNN's (a guided
    run trains the same network as distillation does, weight for weight: tests/test_guidance.py)."""
    if not (vit / "fold-0" / "config.json").is_file() or not guided(vit):
        return False
    saved = RunConfig.from_dict(json.loads((vit / "fold-0" / "config.json").read_text()))
    return not teacher_changes(saved, config)


def cnn_name(study: dict) -> str:
    """'ResNet-34' for a CNN study cnn_study wrote with --cnn resnet34
    (its recipe: 'resnet34 (default recipe's training)')."""
    return "ResNet-" + study["recipe"].split()[0].removeprefix("resnet")


def rows(out: Path, extra_dirs: list[Path]) -> list[dict]:
    """Every size with both studies finished: photos a class, each model's accuracy and SE, the paired difference."""
    found = []
    for folder in [out, *extra_dirs]:
        for vit in sorted(folder.glob("vit-f*")):
            cnn = folder / vit.name.replace("vit-", "cnn-")
            if not ((vit / "cv.json").is_file() and (cnn / "cv.json").is_file()):
                continue
            a, b = read_study(vit), read_study(cnn)
            per_class = len(a["photos"]) / len(a["per_class"])  # the data set's photos a class (all are held out once)
            share = float(vit.name.removeprefix("vit-f"))
            difference = paired(b["photos"], a["photos"])  # ViT - CNN, from the two files already read
            found.append(
                {
                    "only_vit": len(difference["only_b"]),
                    "only_cnn": len(difference["only_a"]),
                    "photos_per_class": round(per_class * share),
                    "share": share,
                    "folder": str(folder),
                    "recipe": study_recipe(vit),
                    "cnn_name": cnn_name(b),
                    "vit": a["accuracy"],
                    "vit_se": a["standard_error"],
                    "cnn": b["accuracy"],
                    "cnn_se": b["standard_error"],
                    "vit_minus_cnn": difference["difference"],
                    "paired_se": difference["standard_error"],
                }
            )
    return sorted(found, key=lambda r: (r["recipe"], r["photos_per_class"]))


def record_points(found: list[dict]) -> None:
    """Each point as a row of results/curve.csv (its provenance added by bench.results)."""
    from bench.results import record

    for r in found:
        record(
            "curve",
            {
                "photos_a_class": r["photos_per_class"],
                "data": r["folder"],
                "vit": f"{r['vit']:.3f}",
                "vit_se": f"{r['vit_se']:.3f}",
                "cnn": f"{r['cnn']:.3f}",
                "cnn_se": f"{r['cnn_se']:.3f}",
                "difference": f"{r['vit_minus_cnn']:+.3f}",
                "difference_se": f"{r['paired_se']:.3f}",
                "only_vit": r["only_vit"],
                "only_cnn": r["only_cnn"],
                "without_masked": "",
                "without_masked_difference": "",
                "protocol": f"{FOLDS}-fold CV, fold seed {SEED}; each fold trained on a share of its photos",
            },
        )


def plot(found: list[dict], path: Path, marks: list[tuple[str, Path]] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    x = sorted({r["photos_per_class"] for r in found})
    for recipe, style in zip(
        dict.fromkeys(r["recipe"] for r in found), itertools.cycle(["h-", "o-", "D-", "^-", "v-", "P-", "X-"])
    ):
        series = [r for r in found if r["recipe"] == recipe]
        ax.errorbar(
            [r["photos_per_class"] for r in series],
            [r["vit"] for r in series],
            yerr=[r["vit_se"] for r in series],
            fmt=style,
            capsize=3,
            label=f"ViT, {recipe}",
        )
    cnn = {
        r["photos_per_class"]: r for r in found
    }  # one CNN study a size (the guided studies' teachers) pairs with every ViT
    for r in found:
        if (r["cnn_name"], r["cnn"], r["cnn_se"]) != tuple(
            cnn[r["photos_per_class"]][k] for k in ("cnn_name", "cnn", "cnn_se")
        ):
            raise SystemExit(
                f"{r['folder']}: its {r['cnn_name']}s at {r['photos_per_class']} a class are not those of "
                f"{cnn[r['photos_per_class']]['folder']} (another CNN, image size or teacher): "
                "plot the two curves separately"
            )
    names = sorted({r["cnn_name"] for r in found})
    ax.errorbar(
        x,
        [cnn[n]["cnn"] for n in x],
        yerr=[cnn[n]["cnn_se"] for n in x],
        fmt="s--",
        capsize=3,
        label=f"{' / '.join(names)} from scratch, same training",
    )
    ax.set(
        xlabel="training photos a class (each fold trains on 4/5 of them)",
        ylabel="5-fold CV accuracy (+- SE)",
        title="Data efficiency: FoodVision Mini" + (" and its 20% set" if max(x) > 75 else ""),
    )
    ax.set_xticks(x, [str(v) for v in x])
    for label, study in marks:  # single studies on all the photos (share 1) of another recipe, at their photos a class
        result = read_study(study)
        ax.errorbar(
            [round(len(result["photos"]) / len(result["per_class"]))],
            [result["accuracy"]],
            yerr=[result["standard_error"]],
            fmt="*",
            markersize=11,
            capsize=3,
            label=label,
        )
    ax.axhline(1 / 3, color="grey", lw=0.8, ls=":")
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False
    )  # below the axes: long labels cover no point
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the studies")
    parser.add_argument("--data", help="the photos (default: $FOODVIT_DATA)")
    parser.add_argument("--fractions", default="0.2,0.4,0.6,1", help="shares of each class's training photos")
    parser.add_argument("--models", default="vit,cnn")
    parser.add_argument(
        "--teachers",
        type=Path,
        help="a guided or distilled default-recipe study whose fold-K/teacher.pt are this "
        "data's ResNet-18s at share 1 (reused, not trained again); a guided ViT study of --out lends its own",
    )
    parser.add_argument(
        "--cnn",
        default="resnet18",
        choices=TEACHERS,
        help="the CNN's torchvision architecture (default: ResNet-18, the peer)",
    )
    parser.add_argument("--epochs", type=int, help="both models' epochs (default: the recipe's; fewer for a quick try)")
    parser.add_argument(
        "--extra", type=Path, nargs="*", default=[], help="other curve folders to include in the table and plot"
    )
    parser.add_argument("--plot", type=Path, help="write the curve here")
    parser.add_argument("--record", action="store_true", help="append the default recipe's points to results/curve.csv")
    parser.add_argument(
        "--mark",
        action="append",
        default=[],
        metavar="LABEL=STUDY",
        help="also plot a finished study of all the photos as one point (e.g. another recipe)",
    )
    args, extra = parser.parse_known_args()
    if not args.plot:
        for share in (float(s) for s in args.fractions.split(",")):
            if "vit" in args.models:
                vit_study(args.out, share, args.data, extra + (["--epochs", str(args.epochs)] if args.epochs else []))
            if "cnn" in args.models:
                try:
                    cnn_study(args.out, share, args.data, args.teachers, args.epochs, args.cnn)
                except (
                    FoodVitError
                ) as err:  # e.g. lent teachers trained at another thread count: one line, as foodvit prints it
                    raise SystemExit(f"bench/accuracy/curve.py: {err}") from None
    found = rows(args.out, args.extra)
    print("| photos a class | ViT recipe | ViT | CNN | ViT - CNN, paired |\n|---|---|---|---|---|")
    for r in found:
        print(
            f"| {r['photos_per_class']} | {r['recipe']} | {r['vit']:.3f} +- {r['vit_se']:.3f} | "
            f"{r['cnn_name']} {r['cnn']:.3f} +- {r['cnn_se']:.3f} | "
            f"{r['vit_minus_cnn']:+.3f} +- {r['paired_se']:.3f} |"
        )
    if args.record:
        record_points([r for r in found if r["recipe"] == "default"])
    if args.plot and found:
        plot(found, args.plot, [(m.split("=", 1)[0], Path(m.split("=", 1)[1])) for m in args.mark])
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
