"""Score a guided (or distilled) `foodvit cv` study's ResNet-18 teachers on their folds' held-out photos,
as a study of their own that `foodvit cv --compare` pairs with any other on the same folds.

    python bench/teachers.py runs/r12/size112 runs/r12/cnn-size112
    foodvit cv --compare runs/r12/cnn-size112 runs/r12/size112

Each fold's saved teacher.pt is loaded, not trained again (bench/curve.py's scorer, which the
data-efficiency curve uses for its CNN points); the fold's own settings (image size, augmentation)
come from its saved config.json. Needs the study's photos where they were (its folds' links).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from curve import cnn_fold

from foodvit.config import RunConfig
from foodvit.tuning.cv import summarise, write_study


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: python bench/teachers.py STUDY OUT (a guided cv study of one seed, and a folder for the result)")
    study, out = Path(argv[0]), Path(argv[1])
    if not (study / "cv.json").is_file():
        raise SystemExit(f"{study} holds no finished cv study (cv.json): give a guided or distilled `foodvit cv` study")
    done = json.loads((study / "cv.json").read_text())["folds"]
    seeds = sorted({f["seed"] for f in done})
    if len(seeds) != 1:
        raise SystemExit(f"{study} holds folds of {len(seeds)} seeds ({', '.join(map(str, seeds))}): this script scores a study of one seed")
    seed, folds = seeds[0], sorted(f["fold"] for f in done)
    results, config = [], None
    for k in folds:
        saved = study / f"fold-{k}" / "config.json"
        if not (study / f"fold-{k}" / "teacher.pt").is_file() or not saved.is_file():
            raise SystemExit(f"{study / f'fold-{k}'} holds no trained teacher: give a guided or distilled cv study that has finished")
        config = RunConfig.from_dict(json.loads(saved.read_text()), where=str(saved))
        folder = study / "folds" / f"seed-{seed}" / f"fold-{k}"
        config = replace(config, data=replace(config.data, source=str(folder.resolve())), optim=replace(config.optim, distill=1.0, guidance=0.0))
        results.append(cnn_fold(config, folder, out / f"fold-{k}", k, study, seed))
    result = summarise(results)
    write_study(out, replace(config, recipe=f"resnet18 teachers of {study}"), result, results)
    print(f"{out}: the ResNet-18 teachers of {study}, {len(folds)}-fold CV accuracy {result.accuracy:.3f} +- {result.standard_error:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
