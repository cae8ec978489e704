"""Score a guided (or distilled) `foodvit cv` study's ResNet-18 teachers on their folds' held-out photos,
as a study of their own that `foodvit cv --compare` pairs with any other on the same folds.

    python -m bench.accuracy.teachers runs/r12/size112 runs/r12/cnn-size112
    foodvit cv --compare runs/r12/cnn-size112 runs/r12/size112

Each fold's saved teacher.pt is loaded and scored, nothing trained or copied, on any machine (scoring
does not depend on where the teacher trained); the fold's own settings (image size, normalisation)
come from its saved config.json. Needs the study's photos where they were (its folds' links).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.accuracy.curve import held_out_result
from foodvit.settings.run import RunConfig
from foodvit.tuning.compare import study_identity
from foodvit.tuning.cv import summarise, write_study
from foodvit.tuning.folds import fold_folder, fold_name


def score_fold(study: Path, seed: int, k: int) -> tuple[RunConfig, dict]:
    """Fold k's teacher, loaded from its teacher.pt, on that fold's held-out photos."""
    from foodvit.rundir.directory import TEACHER_FILE
    from foodvit.training.teacher import build_teacher, read_teacher
    from foodvit.training.trainer import Trainer

    run = study / fold_name(seed, k, 1)  # a study of one seed
    saved = run / "config.json"
    if not (run / TEACHER_FILE).is_file() or not saved.is_file():
        raise SystemExit(f"{run} holds no trained teacher: give a guided or distilled cv study that has finished")
    config = RunConfig.from_dict(json.loads(saved.read_text()), where=str(saved))
    folder = fold_folder(study / "folds", seed, k)
    config = replace(config, data=replace(config.data, source=str(folder.resolve())))
    with tempfile.TemporaryDirectory() as scratch:  # the trainer builds the fold's loaders; nothing is written
        trainer = Trainer(config, Path(scratch) / "run", quiet=True)
        teacher = build_teacher(config.teacher.architecture, len(trainer.classes)).to(trainer.device)
        teacher.load_state_dict(read_teacher(run / TEACHER_FILE, config.teacher.architecture)["model"])
        return config, held_out_result(trainer, teacher, seed, k, run.name)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(
            "usage: python -m bench.accuracy.teachers STUDY OUT "
            "(a guided cv study of one seed, and a folder for the result)"
        )
    study, out = Path(argv[0]), Path(argv[1])
    if not (study / "cv.json").is_file():
        raise SystemExit(f"{study} holds no finished cv study (cv.json): give a guided or distilled `foodvit cv` study")
    done = json.loads((study / "cv.json").read_text())["folds"]
    seeds = sorted({f["seed"] for f in done})
    if len(seeds) != 1:
        raise SystemExit(
            f"{study} holds folds of {len(seeds)} seeds ({', '.join(map(str, seeds))}): "
            "give a study run with one --seed"
        )
    results, config = [], None
    for k in sorted(f["fold"] for f in done):
        config, result = score_fold(study, seeds[0], k)
        results.append(result)
    result = summarise(results)
    identity = study_identity(study)  # the same photos, folds and seed as the guided study: the two pair
    write_study(
        out, replace(config, recipe=f"{config.teacher.architecture} teachers of {study}"), result, results, identity
    )
    print(
        f"{out}: the {config.teacher.architecture} teachers of {study}, {len(results)}-fold CV accuracy "
        f"{result.accuracy:.3f} +- {result.standard_error:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
