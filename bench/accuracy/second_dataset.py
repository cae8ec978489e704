"""The default recipe, unchanged, on a second small data set, against a ResNet-18 from scratch on the ViT's schedule
(100 epochs at 96 px), several seeds, scored photo by photo on the set's test split.

    python -m bench.accuracy.second_dataset --data ../shared/data/food101_seven --seeds 0 1 2 --out runs/seven --jobs 2
    foodvit cv --compare runs/seven/cnn runs/seven/vit        # the same pairing, from the two studies it writes

Each seed trains the default recipe (its own CNN teacher included) and, apart, a ResNet-18 alone; both predict every
test photo. OUT/vit and OUT/cnn are written as studies of the test split (study.json, cv.json, one run a seed) that
`foodvit cv --compare` pairs with the photo as the unit (each photo's answers averaged over the seeds first); the
table per class is printed and, with --record, kept in results/second-dataset.csv. The test photos are read once a
model, after every choice of the recipe was made on FoodVision Mini: nothing here chooses anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

CNN_EPOCHS, CNN_SIZE = 100, 96  # the ViT's schedule: its epochs, at its final side


SETTINGS: dict = {}  # --set KEY=VALUE: settings over the default recipe (a quick check of this script), both models


def default_config(data: Path, seed: int):
    from foodvit.recipes import load_recipe
    from foodvit.settings.overrides import with_settings

    config = with_settings(load_recipe("default"), SETTINGS)
    return replace(
        config, data=replace(config.data, source=str(data.resolve())), train=replace(config.train, seed=seed)
    )


def vit_task(data: str, out: str, seed: int) -> dict:
    """The default recipe on the set's training photos, its final model predicting every test photo (tuning/fold.py)."""
    from foodvit.tuning.fold import run_fold

    return run_fold(default_config(Path(data), seed), Path(out) / "vit" / f"seed-{seed}", Path(data), seed=seed, fold=0)


def cnn_task(data: str, out: str, seed: int) -> dict:
    """A ResNet-18 from scratch, trained as the recipe trains its teacher but on the ViT's schedule, then predicting
    every test photo."""
    from bench.accuracy.curve import held_out_result
    from foodvit.training.trainer import Trainer

    run = Path(out) / "cnn" / f"seed-{seed}"
    result_file = run.with_name(run.name + ".json")
    if result_file.is_file():
        return json.loads(result_file.read_text())
    config = default_config(Path(data), seed)
    config = replace(config, teacher=replace(config.teacher, epochs=CNN_EPOCHS, size=CNN_SIZE))
    run.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, run, quiet=True)
    teacher = trainer.teacher()  # trained here (kept in run/teacher.pt), or read back if it was
    seconds = sum(row["seconds"] for row in teacher.history)
    result = held_out_result(trainer, teacher.module, seed, 0, run.name, seconds)
    result_file.write_text(json.dumps(result))
    (run / "config.json").write_text(config.to_json())
    return result


def _one_thread(settings: dict, cnn_epochs: int) -> None:
    import torch

    global CNN_EPOCHS
    torch.set_num_threads(1)
    SETTINGS.update(settings)
    CNN_EPOCHS = cnn_epochs


def write_studies(data: Path, out: Path, seeds: list[int], results: dict[str, list[dict]]) -> None:
    """OUT/vit and OUT/cnn as studies `foodvit cv --compare` pairs: the same photos and seeds, their settings."""
    from foodvit.data.folders import scan
    from foodvit.tuning.cv import summarise, write_study
    from foodvit.tuning.folds import fingerprint, photo_key
    from foodvit.tuning.study import study_settings

    train, test = scan(data / "train"), scan(data / "test")
    for name, found in results.items():
        config = default_config(data, seeds[0])
        if name == "cnn":
            config = replace(config, teacher=replace(config.teacher, epochs=CNN_EPOCHS, size=CNN_SIZE))
        identity = {
            "kind": "test",
            "data": fingerprint(train),
            "classes": list(train.classes),
            "folds": 1,
            "seeds": seeds,
            "settings": study_settings(config.to_dict()),
            "validation": fingerprint(test),
        }
        assert {p["photo"] for p in found[0]["predictions"]} == {photo_key(test, p) for p, _ in test.samples}
        (out / name / "study.json").write_text(json.dumps(identity, indent=1))
        write_study(out / name, config, summarise(found), found, identity)


def table(out: Path) -> tuple[list[dict], str]:
    """Each class's accuracy of both models over the seeds, and the ViT minus the CNN, paired (the photo the unit)."""
    from foodvit.tuning.compare import paired

    photos = {name: json.loads((out / name / "cv.json").read_text())["photos"] for name in ("vit", "cnn")}
    classes = sorted({key.split("/")[1] for key in photos["vit"]})
    rows, lines = [], ["| class | ViT | ResNet-18 | ViT - ResNet-18 (paired) |", "|---|---|---|---|"]
    for name in [*classes, "all"]:
        keep = {k for k in photos["vit"] if name == "all" or k.split("/")[1] == name}
        vit = {k: v for k, v in photos["vit"].items() if k in keep}
        cnn = {k: v for k, v in photos["cnn"].items() if k in keep}
        diff = paired(cnn, vit)
        row = {
            "class": name,
            "vit": statistics.mean(vit.values()),
            "cnn": statistics.mean(cnn.values()),
            "difference": diff["difference"],
            "difference_se": diff["standard_error"],
            "photos": diff["photos"],
            "only_vit": len(diff["only_b"]),
            "only_cnn": len(diff["only_a"]),
        }
        rows.append(row)
        lines.append(
            f"| {name} | {row['vit']:.3f} | {row['cnn']:.3f} | {row['difference']:+.3f} +- {row['difference_se']:.3f} |"
        )
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a folder with train/<class>/ and test/<class>/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", required=True, help="a folder for the runs and the two studies")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at once, one thread each (default 2)")
    parser.add_argument("--record", action="store_true", help="append the table to results/second-dataset.csv")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings over the recipe (checks)")
    parser.add_argument("--cnn-epochs", type=int, default=CNN_EPOCHS, help=f"the ResNet-18's epochs ({CNN_EPOCHS})")
    args = parser.parse_args(argv)
    settings = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    _one_thread(settings, args.cnn_epochs)
    data, out = Path(args.data).resolve(), Path(args.out)
    tasks = [(task, seed) for seed in args.seeds for task in (vit_task, cnn_task)]
    with ProcessPoolExecutor(
        args.jobs, mp_context=get_context("spawn"), initializer=_one_thread, initargs=(settings, args.cnn_epochs)
    ) as pool:
        futures = [(task, seed, pool.submit(task, str(data), str(out), seed)) for task, seed in tasks]
        done = {"vit": [], "cnn": []}
        for task, _, future in futures:
            done["vit" if task is vit_task else "cnn"].append(future.result())
    write_studies(data, out, args.seeds, done)
    rows, text = table(out)
    print(text)
    for name in ("vit", "cnn"):
        per_seed = [f"{r['accuracy']:.3f}" for r in done[name]]
        print(
            f"{name}: seeds {' / '.join(per_seed)}; {json.loads((out / name / 'cv.json').read_text())['accuracy']:.3f}"
        )
    if args.record:
        from bench.results import record

        seconds = {name: round(statistics.mean(r["seconds"] for r in done[name])) for name in ("vit", "cnn")}
        per_seed = {name: " / ".join(f"{r['accuracy']:.3f}" for r in done[name]) for name in ("vit", "cnn")}
        for row in rows:
            extra = {"vit_per_seed": per_seed["vit"], "cnn_per_seed": per_seed["cnn"]} if row["class"] == "all" else {}
            record(
                "second-dataset",
                {
                    "data": data.name,
                    "seeds": " ".join(map(str, args.seeds)),
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
                    "vit_per_seed": extra.get("vit_per_seed", ""),
                    "cnn_per_seed": extra.get("cnn_per_seed", ""),
                    "vit_seconds": seconds["vit"],
                    "cnn_seconds": seconds["cnn"],
                },
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
