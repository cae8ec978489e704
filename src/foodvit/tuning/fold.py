"""One fold of a study run to its result: trained (or resumed from its checkpoint, or read when its
result is written), then every held-out photo predicted through the Predictor from the saved model.

    STUDY/fold-K/             a normal run directory
    STUDY/fold-K.json         the fold's result, every held-out photo's prediction included
    STUDY/.fold-K.stages.json the seconds its teacher's task took (`cv --jobs`: start_fold), until the result

One process runs a fold at a time (a lock beside the run, from the look at its result to the result
written); another process meeting the lock gets FoldBusy and takes another fold meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from filelock import FileLock, Timeout

from foodvit.errors import StudyError
from foodvit.files import read_json, write_text
from foodvit.rundir import directory as rundir
from foodvit.rundir.card import card_problem, read_card
from foodvit.settings.run import RunConfig
from foodvit.tuning.compare import is_run_result
from foodvit.tuning.folds import photo_key

logger = logging.getLogger(__name__)


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
    check: Callable[[], None] | None = None,
) -> dict:
    """A fold's result: trained (or resumed, or read when finished), then its held-out photos predicted.
    teacher_from: the same fold's run in another study, whose CNN teacher this fold borrows. check: called with the
    fold's lock held, before it trains (it raises to stop the fold: its study changed under it)."""
    from foodvit.training.run import resume, train

    result_file = result_path(run)
    if (finished := read_result(result_file)) is not None:
        return finished
    with fold_lock(run):
        if (
            finished := read_result(result_file)
        ) is not None:  # finished by another process between the look and the lock
            return finished
        if check is not None:
            check()
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


def fold_config(config: RunConfig, folder: Path, seed: int) -> RunConfig:
    """The run of a fold: the study's settings on the fold's photos and seed, evaluated once, at the end (the study
    reads the fold's final model alone, never its curves)."""
    return replace(
        config,
        # a pool study's folder holds its pool as the runs' test split: the run itself validates on nothing else
        data=replace(config.data, source=str(folder.resolve()), validate_on=""),
        train=replace(config.train, seed=seed, eval_every=config.train.epochs),
    )


def start_fold(
    config: RunConfig, run: Path, folder: Path, *, seed: int, check: Callable[[], None] | None = None
) -> None:
    """The fold's run started and trained up to its first epoch (its CNN teacher, its pre-training:
    training.run.train_stages), so that run_fold resumes it; nothing when the fold has a result or a run under way;
    FoldBusy when another process is on it. check: as run_fold's."""
    from foodvit.training.engine import silent
    from foodvit.training.run import train_stages

    with fold_lock(run):
        if read_result(result_path(run)) is None and not (run / "checkpoint.pt").is_file():
            if check is not None:
                check()
            _clear_unstarted(run)
            started = time.perf_counter()
            with _taken_as_busy(run):
                train_stages(fold_config(config, folder, seed), run, log=silent)
            write_text(stages_file(run), json.dumps({"seconds": round(time.perf_counter() - started, 2)}))


def result_path(run: Path) -> Path:
    """STUDY/fold-K.json: the fold's result."""
    return run.with_name(run.name + ".json")


def stages_file(run: Path) -> Path:
    """STUDY/.fold-K.stages.json: the seconds start_fold took, which the fold's result adds to its own."""
    return run.with_name(f".{run.name}.stages.json")


@contextlib.contextmanager
def _taken_as_busy(run: Path):
    """A run another process took between the look and the start (its lock): FoldBusy, naming the process."""
    try:
        yield
    except rundir.LockedError:
        raise FoldBusy(
            f"{run} is being trained by another process ({rundir.training_now(run) or 'owner unknown'})"
        ) from None


@contextlib.contextmanager
def fold_lock(run: Path):
    """One process a fold, from the look at its result to the result written (the run's own lock covers only its
    training): FoldBusy when another process holds it, and that process takes another fold meanwhile."""
    run.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(run.parent / f".{run.name}.lock", timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FoldBusy(f"{run} is being run by another process") from None
    try:
        yield
    finally:
        lock.release()


def read_result(path: Path) -> dict | None:
    """A fold's written result; None when there is none, or when it is damaged (cut short, overwritten):
    the fold is then scored again from its saved model (trained again only if that is gone too)."""
    if not path.is_file():
        return None
    try:
        result = read_json(path)
    except (OSError, ValueError):
        result = None
    if is_run_result(result) and _consistent(result):
        return result
    logger.warning(f"{path} is damaged: the fold is scored again from its run")
    return None


def _consistent(result: dict) -> bool:
    """Whether a fold's result agrees with itself as _run_fold writes it: its photos, how many were right, the
    accuracy they make and its seconds (an edited or half-damaged file was a traceback where the study summed them,
    or a study's accuracy and standard error over fewer photos than it holds)."""
    predictions, accuracy, seconds = result["predictions"], result.get("accuracy"), result.get("seconds")
    right = sum(p["right"] for p in predictions)
    return (
        bool(predictions)
        and all(isinstance(p.get("label"), str) for p in predictions)  # per_class reads it
        and result.get("n") == len(predictions)
        and result.get("correct") == right
        and isinstance(accuracy, (int, float))
        and not isinstance(accuracy, bool)
        and math.isclose(accuracy, right / len(predictions))
        and isinstance(seconds, (int, float))
        and math.isfinite(seconds)
    )


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
    from foodvit.training.engine import silent

    started = time.perf_counter()
    if not (run / "model.json").is_file():
        with _taken_as_busy(run):
            if (run / "checkpoint.pt").is_file():
                resume(run, quiet=quiet, log=silent)
            else:
                _clear_unstarted(run)
                train(fold_config(config, folder, seed), run, quiet=quiet, log=silent, teacher_from=teacher_from)
    predictions = held_out_predictions(run, folder)
    card = read_card(run / "model.json")  # its model was read to predict: a card whose metrics are checked
    metrics = card.get("metrics")
    if not isinstance(metrics, dict) or not isinstance(metrics.get("test_n"), int) or card_problem(card):
        raise StudyError(f"{run / 'model.json'} is not the model card training writes: remove {run} to train it again")
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
        "per_class": per_class(predictions),
        "seconds": round(time.perf_counter() - started + _stages_seconds(run), 2),
        **{key: metrics[key] for key in ("arithmetic", "processor") if key in metrics},
        "predictions": predictions,
    }
    write_text(result_file, json.dumps(result))  # compact: every held-out photo's class probabilities
    stages_file(run).unlink(missing_ok=True)
    return result


def _stages_seconds(run: Path) -> float:
    """The seconds start_fold spent on the fold's teacher in a task of its own (0 when none did, or unreadable)."""
    try:
        return float(read_json(stages_file(run))["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _clear_unstarted(run: Path) -> None:
    """A run killed before its first checkpoint (kill -9: no clean-up ran) leaves its config.json:
    foodvit's own files of that start are removed, so the fold starts again (and the seconds an earlier
    start_fold left are forgotten: they were not this run's)."""
    holder = rundir.training_now(run) if run.is_dir() else None
    if holder:
        raise FoldBusy(f"{run} is being trained by another process ({holder}); wait for it or use another study folder")
    stages_file(run).unlink(missing_ok=True)
    if run.is_dir():
        rundir.forget_start(run)


class FoldBusy(StudyError):
    """Another live process is running the fold: run_cv takes the next one and comes back to it."""


def per_class(predictions: list[dict]) -> dict[str, float]:
    """Each class's share of its photos predicted right (the classes in alphabetical order)."""
    classes = sorted({p["label"] for p in predictions})
    return {c: statistics.mean(p["right"] for p in predictions if p["label"] == c) for c in classes}
