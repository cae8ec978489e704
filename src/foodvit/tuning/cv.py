"""k-fold cross-validation of a recipe over the TRAINING photos alone (`foodvit cv`).

    STUDY/study.json          what the study is (data fingerprint, folds, seeds, settings): a rerun
                              with anything else is refused, never mixed in (tuning/study.py)
    STUDY/folds/seed-S/fold-K/{train,test}/<class>/...   links to the photos: train = the kept
                              folds, test = the held-out one (what a fold's run evaluates on)
    STUDY/fold-K/             a normal run directory (STUDY/seed-S/fold-K/ with several seeds)
    STUDY/fold-K.json         the fold's result, every held-out photo's prediction included
    STUDY/cv.json, cv.md, predictions.jsonl   the study's result

The real test split is never listed, let alone read: the photos come from <root>/train (or
Food-101's meta/train.json) and each fold's run sees only its fold folder. A fold whose result
file exists is not trained again; one whose run was interrupted is resumed from its checkpoint.
Several processes may run one study (`foodvit cv --out STUDY` twice, on one machine or on machines
that share the folder): each takes the folds no other process is training, and waits for the
others' folds at the end, so k folds take about k / processes fold times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock, Timeout

from foodvit.config import RunConfig
from foodvit.data.datasource import DataSource
from foodvit.data.folders import Split, check, cv_folds, keep_classes, list_split
from foodvit.errors import StudyError
from foodvit.files import atomic_folder, write_text
from foodvit.rundir import directory as rundir
from foodvit.rundir.directory import TEACHER_FILE
from foodvit.tuning.compare import prediction_key
from foodvit.tuning.jobs import fold_threads, plan, run_tasks
from foodvit.tuning.study import check_lender, open_study, study_settings

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------ the photos


def training_photos(config: RunConfig) -> Split:
    """The training split of the config's data source (class subset kept), every photo checked;
    the test split is not touched, not even listed."""
    source = DataSource.parse(config.data.source)
    root = source.root(quiet=True)
    listing = list_split(root, "train")
    if source.classes:
        listing = keep_classes(listing, source.classes)
    return check(listing, strict=config.data.strict)


def photo_key(split: Split, path: Path) -> str:
    """A photo's name in a study, 'class/file' (a nested file's folders joined by '__'): the same
    photo has the same key in every study of the same data, so two studies pair photo by photo."""
    parts = Path(path).relative_to(split.root).parts
    return parts[0] + "/" + "__".join(parts[1:])


def fingerprint(split: Split) -> str:
    """Which photos a study is about: their keys and sizes (moving the folder changes nothing)."""
    digest = hashlib.sha256()
    for path, label in sorted(split.samples):
        digest.update(f"{split.classes[label]}:{photo_key(split, path)}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def check_folds(split: Split, k: int) -> None:
    """Every class must have a photo in every held-out fold, else a fold's run sees a class with no test photo."""
    if k < 2:
        raise StudyError(f"cross-validation needs at least 2 folds, got {k}")
    fewest = min(split.counts().values(), default=0)
    for name, n in split.counts().items():
        if n < 2:
            raise StudyError(
                f"class {name} has {n} training photo(s): every fold holds out at least one photo of each class, "
                f"so cross-validation needs at least 2 photos of each; add photos of {name}, or leave the class out"
            )
        if n < k:
            raise StudyError(
                f"class {name} has {n} training photo(s), fewer than the {k} folds: every fold holds out at "
                f"least one photo of each class; use --folds {fewest} or fewer, or add photos"
            )


def fold_folder(folds_dir: Path, seed: int, fold: int) -> Path:
    """The folder of links (train/, test/) of one fold of one seed, under a study's folds/."""
    return folds_dir / f"seed-{seed}" / f"fold-{fold}"


def fold_folders(split: Split, k: int, seed: int, where: Path) -> list[Path]:
    """One folder per fold, train/ = the other folds, test/ = this one, of links to the photos;
    made once (in a temporary folder renamed into place, so a concurrent or killed maker leaves
    no half folder) and reused by every run on the same seed."""
    folders = []
    for index, (kept, held) in enumerate(cv_folds(split, k, seed)):
        folder = fold_folder(where, seed, index)
        folders.append(folder)
        if folder.is_dir():
            continue

        def fill(tmp: Path, kept=kept, held=held) -> None:
            for name, part in (("train", kept), ("test", held)):
                for path, _ in part.samples:
                    link = tmp / name / photo_key(split, path)
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(Path(path).resolve())

        try:
            atomic_folder(folder, fill)  # a killed or failed maker leaves nothing behind
        except OSError:  # another process made it first: theirs holds the same links
            if not folder.is_dir():
                raise
    return folders


# ------------------------------------------------------------------------------------ one fold


def fold_name(seed: int, fold: int, seeds: int) -> str:
    """The run of one fold inside a study of `seeds` seeds (its result beside it, NAME.json)."""
    return f"fold-{fold}" if seeds == 1 else f"seed-{seed}/fold-{fold}"


def prediction_record(photo: str, label: str, probabilities, classes: list[str]) -> dict:
    """One held-out photo's prediction as a study keeps it: the guess, whether it is right, its
    probability and every class's (which lets studies on the same folds be averaged afterwards)."""
    guess = classes[int(probabilities.argmax())]
    return {
        "photo": photo,
        "label": label,
        "predicted": guess,
        "right": guess == label,
        "probability": round(float(probabilities.max()), 6),
        "probabilities": {c: round(float(q), 6) for c, q in zip(classes, probabilities, strict=False)},
    }


def held_out_predictions(run: Path, folder: Path) -> list[dict]:
    """Every held-out photo's prediction by the fold's saved model, through the Predictor (as any
    use of a trained model), as prediction_record keeps them."""
    import numpy as np

    from foodvit.data.folders import scan
    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor

    predictor = Predictor.from_run(run)
    held = scan(folder / "test")
    out = []
    for start in range(0, len(held.samples), 64):
        chunk = held.samples[start : start + 64]
        probabilities = predictor.probabilities(
            np.stack([predictor.prepare(load_or_explain(p), str(p)) for p, _ in chunk])
        )
        out += [
            prediction_record(photo_key(held, path), held.classes[label], p, predictor.classes)
            for (path, label), p in zip(chunk, probabilities, strict=False)
        ]
    return out


def run_fold(
    config: RunConfig,
    run: Path,
    folder: Path,
    *,
    seed: int,
    fold: int,
    quiet: bool = True,
    teacher_from: Path | None = None,
) -> dict:
    """A fold's result: trained (or resumed, or read when finished), then its held-out photos predicted.
    teacher_from: the same fold's run in another study, whose CNN teacher this fold borrows."""
    from foodvit.training.run import resume, train

    result_file = run.with_name(run.name + ".json")
    if (finished := read_result(result_file)) is not None:
        return finished
    run.parent.mkdir(parents=True, exist_ok=True)
    # One process a fold, from the look at its result to the result written (the run's own lock covers
    # only its training): another process takes another fold meanwhile.
    lock = FileLock(run.parent / f".{run.name}.lock", timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FoldBusy(f"{run} is being run by another process") from None
    try:
        if (
            finished := read_result(result_file)
        ) is not None:  # finished by another process between the look and the lock
            return finished
        return _run_fold(
            config,
            run,
            folder,
            result_file,
            seed=seed,
            fold=fold,
            quiet=quiet,
            resume=resume,
            train=train,
            teacher_from=teacher_from,
        )
    finally:
        lock.release()


def read_result(path: Path) -> dict | None:
    """A fold's written result; None when there is none, or when it is damaged (cut short, overwritten):
    the fold is then scored again from its saved model (trained again only if that is gone too)."""
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        result = None
    if isinstance(result, dict) and {"seed", "fold", "predictions", "accuracy", "seconds"} <= result.keys():
        return result
    logger.warning(f"{path} is damaged: the fold is scored again from its run")
    return None


def _run_fold(
    config: RunConfig,
    run: Path,
    folder: Path,
    result_file: Path,
    *,
    seed: int,
    fold: int,
    quiet: bool,
    resume,
    train,
    teacher_from: Path | None,
) -> dict:
    started = time.perf_counter()
    if not (run / "model.json").is_file():
        try:
            if (run / "checkpoint.pt").is_file():
                resume(run, quiet=quiet, log=lambda *a, **k: None)
            else:
                _clear_unstarted(run)
                # evaluated once, at the end: the study reads the fold's final model alone, never its curves
                fold_config = replace(
                    config,
                    data=replace(config.data, source=str(folder.resolve())),
                    train=replace(config.train, seed=seed, eval_every=config.train.epochs),
                )
                train(fold_config, run, quiet=quiet, log=lambda *a, **k: None, teacher_from=teacher_from)
        except rundir.LockedError:  # another process took the fold between the look and the start
            raise FoldBusy(
                f"{run} is being trained by another process ({rundir.training_now(run) or 'owner unknown'})"
            ) from None
    predictions = held_out_predictions(run, folder)
    metrics = json.loads((run / "model.json").read_text())["metrics"]
    right = sum(p["right"] for p in predictions)
    if len(predictions) != metrics["test_n"]:
        raise StudyError(
            f"{run}: {len(predictions)} held-out photos in {folder / 'test'}, its run scored {metrics['test_n']}; "
            f"the fold's photos changed: remove {run} to train the fold again"
        )
    # The fold is scored from the saved model's predictions, as any later use of it sees it; the run's own
    # evaluation (bf16 on a GPU, photos decoded at full size) may differ by a near-tie, which is no error.
    result = {
        "seed": seed,
        "fold": fold,
        "run": run.name,
        "n": len(predictions),
        "correct": right,
        "accuracy": right / len(predictions),
        "per_class": _per_class(predictions),
        "seconds": round(time.perf_counter() - started, 2),
        "predictions": predictions,
    }
    write_text(result_file, json.dumps(result))  # compact: every held-out photo's class probabilities
    return result


def _clear_unstarted(run: Path) -> None:
    """A run killed before its first checkpoint (kill -9: no clean-up ran) leaves its config.json:
    foodvit's own files of that start are removed, so the fold starts again."""
    if not run.is_dir():
        return
    holder = rundir.training_now(run)
    if holder:
        raise FoldBusy(f"{run} is being trained by another process ({holder}); wait for it or use another study folder")
    rundir.forget_start(run)


class FoldBusy(StudyError):
    """Another live process is running the fold: run_cv takes the next one and comes back to it."""


_wait = time.sleep  # run_cv's pause while only other processes' folds are left (a test replaces it)


def _per_class(predictions: list[dict]) -> dict[str, float]:
    classes = sorted({p["label"] for p in predictions})
    return {c: statistics.mean(p["right"] for p in predictions if p["label"] == c) for c in classes}


# ------------------------------------------------------------------------------------ a study


@dataclass
class CvResult:
    accuracy: float
    standard_error: float
    n: int  # photos (each predicted once per seed)
    per_class: dict[str, float]
    folds: list[dict]  # each fold's result without its predictions
    left: tuple[
        int, ...
    ] = ()  # with --fold: the study's folds still without a result (of any seed); () once it is whole

    def line(self) -> str:
        k, seeds = len({f["fold"] for f in self.folds}), len({f["seed"] for f in self.folds})
        return (
            f"{k}-fold CV"
            + (f" x {seeds} seeds" if seeds > 1 else "")
            + f" accuracy {self.accuracy:.3f} +- {self.standard_error:.3f} (standard error over "
            f"{self.n} photos); " + ", ".join(f"{c} {a:.3f}" for c, a in self.per_class.items())
        )


def summarise(fold_results: list[dict]) -> CvResult:
    """Accuracy over the photos (each photo's share right over the seeds) and its standard error."""
    by_photo: dict[str, list[bool]] = {}
    for result in fold_results:
        for p in result["predictions"]:
            by_photo.setdefault(p["photo"], []).append(p["right"])
    shares = [statistics.mean(r) for r in by_photo.values()]
    accuracy = statistics.mean(shares)
    se = statistics.stdev(shares) / math.sqrt(len(shares)) if len(shares) > 1 else float("nan")
    per_class = _per_class([p for r in fold_results for p in r["predictions"]])
    folds = [{k: v for k, v in r.items() if k != "predictions"} for r in fold_results]
    return CvResult(accuracy, se, len(shares), per_class, folds)


def run_cv(
    config: RunConfig,
    runs: Path,
    folds_dir: Path,
    split: Split,
    *,
    folds: int,
    seeds: list[int],
    quiet: bool = True,
    progress: bool = False,
    after_fold=None,
    wait_s: float = 30.0,
    teachers: Path | None = None,
    only: Sequence[int] | None = None,
) -> tuple[CvResult, list[dict]]:
    """Each seed's folds (or those numbered in `only`), each a run in `runs`; after_fold(index, results
    so far) after each (the tuner reports and prunes there). The results and every fold's full result, in fold order.
    teachers: a study of the same folds whose fold runs lend their trained CNN teachers (a fold whose
    lender has none yet trains its own).
    A fold another process is training is skipped, and looked at again (every wait_s seconds once
    only such folds are left) until its result is written or its process is gone (then resumed)."""
    from tqdm.auto import tqdm

    check_folds(split, folds)
    todo = [
        (seed, index, folder)
        for seed in seeds
        for index, folder in enumerate(fold_folders(split, folds, seed, folds_dir))
        if only is None or index in only
    ]
    results = []
    with tqdm(total=len(todo), desc="folds", unit="fold", disable=not progress, leave=False) as bar:
        while todo:
            busy = []  # folds another process is training: taken again after the rest
            for seed, index, folder in todo:
                name = fold_name(seed, index, len(seeds))
                run, lender = runs / name, teachers / name if teachers is not None else None
                lender = lender if lender is not None and (lender / TEACHER_FILE).is_file() else None
                try:
                    results.append(
                        run_fold(config, run, folder, seed=seed, fold=index, quiet=quiet, teacher_from=lender)
                    )
                except FoldBusy:
                    busy.append((seed, index, folder))
                    continue
                bar.update()
                bar.set_postfix(acc=f"{summarise(results).accuracy:.3f}")
                if after_fold is not None:
                    after_fold(len(results) - 1, results)
            if busy and len(busy) == len(todo):
                bar.set_description(f"folds (waiting: another process runs {len(busy)})")
                _wait(wait_s)
                bar.set_description("folds")
            todo = busy
    order = {seed: i for i, seed in enumerate(seeds)}
    results.sort(key=lambda r: (order[r["seed"]], r["fold"]))
    return summarise(results), results


def cross_validate(
    config: RunConfig,
    study: str | Path,
    *,
    folds: int = 5,
    seeds: int = 1,
    quiet: bool = True,
    progress: bool = False,
    teachers: str | Path | None = None,
    only: Sequence[int] | None = None,
    jobs: int | None = 1,
) -> CvResult:
    """`foodvit cv`: the config's k-fold CV over its training photos, seeds config.train.seed and on,
    in the study folder (resumed if it holds this same study). teachers: a study of the same folds
    and teacher settings (a distilled or guided recipe) whose trained CNN teachers the folds borrow:
    the same teachers they would train, so only the time changes. only (`--fold K`): run these folds
    of each seed alone (to spread a study over machines or over a queue of jobs); the result is then
    theirs, and the study's files are written only once every fold of it has its result. jobs: the folds
    trained on this many processes at once (None: one per core; tuning/jobs.py), else in this process."""
    study = Path(study)
    config = rundir.with_source(config)
    split = training_photos(config)
    check_folds(split, folds)
    if only is not None:
        outside = sorted(set(only) - set(range(folds)))
        if outside or not only:
            shown = f"--fold {', '.join(map(str, outside))}" if outside else "no fold given"
            raise StudyError(
                f"{shown}: a {folds}-fold study has folds 0 to {folds - 1}; give folds of those, "
                "or leave --fold out to run them all"
            )
    seed_list = [config.train.seed + i for i in range(seeds)]
    identity = {
        "kind": "cv",
        "data": fingerprint(split),
        "classes": list(split.classes),
        "folds": folds,
        "seeds": seed_list,
        "settings": study_settings(config.to_dict()),
    }
    if teachers is not None:
        teachers = Path(teachers)
        with fold_threads(jobs):  # checked against the threads the folds will train on
            check_lender(teachers, study, identity, config)
    open_study(study, identity)
    if jobs != 1:  # the folds trained on several processes; run_cv below then reads their results
        train_on_processes(
            config,
            study,
            split,
            folds=folds,
            seeds=seed_list,
            teachers=teachers,
            only=only,
            jobs=jobs,
            progress=progress,
        )
    result, fold_results = run_cv(
        config,
        study,
        study / "folds",
        split,
        folds=folds,
        seeds=seed_list,
        quiet=quiet,
        progress=progress,
        teachers=teachers,
        only=only,
    )
    if only is not None:  # the study is written once it is whole: its other folds' results are then read, not trained
        left = folds_left(study, folds, seed_list)
        if left:
            return replace(result, left=tuple(sorted({fold for _, fold in left})))
        result, fold_results = run_cv(config, study, study / "folds", split, folds=folds, seeds=seed_list, quiet=quiet)
    write_study(study, config, result, fold_results)
    return result


def folds_left(study: Path, folds: int, seeds: list[int]) -> list[tuple[int, int]]:
    """(seed, fold) of every fold of the study whose result is not written yet (by this process or another)."""
    return [
        (seed, fold)
        for seed in seeds
        for fold in range(folds)
        if not (study / f"{fold_name(seed, fold, len(seeds))}.json").is_file()
    ]


def write_study(study: Path, config: RunConfig, result: CvResult, fold_results: list[dict]) -> None:
    """cv.json (the result and every prediction), predictions.jsonl, cv.md."""
    photos = {prediction_key(r["seed"], p["photo"]): p["right"] for r in fold_results for p in r["predictions"]}
    write_text(
        study / "cv.json",
        json.dumps(
            {
                "recipe": config.recipe,
                "accuracy": result.accuracy,
                "standard_error": result.standard_error,
                "n": result.n,
                "per_class": result.per_class,
                "folds": result.folds,
                "photos": photos,
            },
            indent=1,
        ),
    )
    write_text(
        study / "predictions.jsonl",
        "".join(
            json.dumps({"seed": r["seed"], "fold": r["fold"], **p}) + "\n"
            for r in fold_results
            for p in r["predictions"]
        ),
    )
    classes = list(result.per_class)
    lines = [
        f"# Cross-validation: {config.recipe}",
        "",
        result.line(),
        "",
        "| seed | fold | photos | accuracy | " + " | ".join(classes) + " | seconds |",
        "|---|---|---|---|" + "---|" * len(classes) + "---|",
    ]
    for f in result.folds:
        lines.append(
            f"| {f['seed']} | {f['fold']} | {f['n']} | {f['accuracy']:.3f} | "
            + " | ".join(f"{f['per_class'].get(c, float('nan')):.3f}" for c in classes)
            + f" | {f['seconds']:.0f} |"
        )
    write_text(study / "cv.md", "\n".join(lines) + "\n")


def train_on_processes(
    config: RunConfig,
    study: Path,
    split: Split,
    *,
    folds: int,
    seeds: list[int],
    teachers: Path | None,
    only: Sequence[int] | None,
    jobs: int | None,
    progress: bool = False,
) -> None:
    """Every fold of the study without a result (of `only`'s folds, if given) trained on the processes of
    jobs.plan(jobs), each fold as run_cv trains it: its lender's teacher borrowed where the lender has one."""
    tasks = []
    for seed in seeds:
        for index, folder in enumerate(fold_folders(split, folds, seed, study / "folds")):
            name = fold_name(seed, index, len(seeds))
            if (only is not None and index not in only) or (study / f"{name}.json").is_file():
                continue
            lender = teachers / name if teachers is not None else None
            tasks.append(
                (
                    config,
                    study / name,
                    folder,
                    seed,
                    index,
                    lender if lender is not None and (lender / TEACHER_FILE).is_file() else None,
                )
            )
    if tasks:
        run_tasks(_fold_task, tasks, plan(jobs, len(tasks)), progress=progress)


def _fold_task(config: RunConfig, run: Path, folder: Path, seed: int, fold: int, teacher_from: Path | None) -> None:
    """One fold in a process of train_on_processes; a fold another command's process holds is left to run_cv."""
    try:
        run_fold(config, run, folder, seed=seed, fold=fold, quiet=True, teacher_from=teacher_from)
    except FoldBusy:
        pass
