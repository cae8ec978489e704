"""k-fold cross-validation of a recipe over the TRAINING photos alone (`foodvit cv`), or a study of a recipe on a
validation pool (`foodvit cv --validate-on POOL`: one run a seed on every training photo, judged on the pool's).

    STUDY/study.json          what the study is (data fingerprint, folds, seeds, settings): a rerun
                              with anything else is refused, never mixed in, except more seeds, which
                              grow the study (tuning/study.py)
    STUDY/folds/seed-S/fold-K/{train,test}/<class>/...   links to the photos: train = the kept
                              folds, test = the held-out one (what a fold's run evaluates on; tuning/folds.py)
    STUDY/fold-K/             a normal run directory (STUDY/seed-S/fold-K/ with several seeds)
    STUDY/fold-K.json         the fold's result, every held-out photo's prediction included (tuning/fold.py)
    STUDY/cv.json, cv.md, predictions.jsonl   the study's result
    STUDY/arithmetic.json     what its runs train in (bf16 or float32, on which device kind): one for all its runs

    STUDY/folds/pool/{train,test}/  with --validate-on: every training photo, and the pool's (folds.pool_folder)
    STUDY/seed-S/, seed-S.json   a pool study's run of seed S, and its result (every pool photo's prediction)

The real test split is never listed, let alone read: the photos come from <root>/train (or
Food-101's meta/train.json) and each fold's run sees only its fold folder. A fold whose result
file exists is not trained again; one whose run was interrupted is resumed from its checkpoint.
Several processes may run one study (`foodvit cv --out STUDY` twice, on one machine or on machines
that share the folder): each takes the folds no other process is training, and waits for the
others' folds at the end, so k folds take about k / processes fold times.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from foodvit.data.folders import Split
from foodvit.errors import StudyError
from foodvit.files import write_text
from foodvit.rundir import directory as rundir
from foodvit.settings.run import RunConfig
from foodvit.tuning.compare import prediction_key
from foodvit.tuning.fold import FoldBusy, per_class, run_fold, start_fold
from foodvit.tuning.folds import (
    Unit,
    check_folds,
    fingerprint,
    fold_name,
    pool_fingerprint,
    pool_photos,
    study_units,
    training_photos,
)
from foodvit.tuning.jobs import Task, fold_threads, plan, run_tasks
from foodvit.tuning.study import (
    check_arithmetic,
    check_lender,
    check_outside,
    grown_since,
    known_arithmetic,
    lender_run,
    one_arithmetic,
    open_study,
    study_lock,
    study_settings,
    training_arithmetic,
)

logger = logging.getLogger(__name__)

_wait = time.sleep  # run_cv's pause while only other processes' folds are left (a test replaces it)


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

    pool: str = ""  # a pool study's validation source ('' for cross-validation)
    summarised: bool = True  # False: another process grew the study meanwhile, and writes its summary

    def line(self) -> str:
        k, seeds = len({f["fold"] for f in self.folds}), len({f["seed"] for f in self.folds})
        return (
            (f"validation pool {self.pool}" if self.pool else f"{k}-fold CV")
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
    classes = per_class([p for r in fold_results for p in r["predictions"]])
    folds = [{k: v for k, v in r.items() if k != "predictions"} for r in fold_results]
    return CvResult(accuracy, se, len(shares), classes, folds)


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
    pool: tuple | None = None,
) -> tuple[CvResult, list[dict]]:
    """Each seed's folds (or those numbered in `only`), each a run in `runs`; after_fold(index, results
    so far) after each (the tuner reports and prunes there). The results and every fold's full result, in fold order.
    pool: a validation pool (folds.pool_photos) that each seed's one run, on every training photo, is judged on
    instead of folds.
    teachers: a study of the same folds whose fold runs lend their trained CNN teachers (a fold whose
    lender has none yet trains its own).
    A fold another process is training is skipped, and looked at again (every wait_s seconds once
    only such folds are left) until its result is written or its process is gone (then resumed)."""
    from tqdm.auto import tqdm

    if pool is None:
        check_folds(split, folds)
    units = study_units(split, folds, seeds, folds_dir, pool)
    todo = [u for u in units if only is None or u.fold in only]
    check_arithmetic(runs, units, todo, config)
    check = same_seeds_check(runs, seeds, pool)
    results = []
    unit = "run" if pool is not None else "fold"
    with tqdm(total=len(todo), desc=f"{unit}s", unit=unit, disable=not progress, leave=False) as bar:
        while todo:
            busy: list[Unit] = []  # folds another process is training: taken again after the rest
            for u in todo:
                run, lender = runs / u.name, lender_run(teachers, u)
                try:
                    results.append(
                        run_fold(
                            config,
                            run,
                            u.folder,
                            seed=u.seed,
                            fold=u.fold,
                            quiet=quiet,
                            teacher_from=lender,
                            check=check,
                        )
                    )
                except FoldBusy:
                    busy.append(u)
                    continue
                bar.update()
                bar.set_postfix(acc=f"{summarise(results).accuracy:.3f}")
                if after_fold is not None:
                    after_fold(len(results) - 1, results)
            if busy and len(busy) == len(todo):
                bar.set_description(f"{unit}s (waiting: another process runs {len(busy)})")
                _wait(wait_s)
                bar.set_description(f"{unit}s")
            todo = busy
    order = {seed: i for i, seed in enumerate(seeds)}
    results.sort(key=lambda r: (order[r["seed"]], r["fold"]))
    names = {(u.seed, u.fold): u.name for u in units}  # runs of other processes may have joined since the start
    found = {names[r["seed"], r["fold"]]: known_arithmetic(r.get("arithmetic")) for r in results}
    one_arithmetic(runs, {name: kind for name, kind in found.items() if kind}, None)
    result = summarise(results)
    return (replace(result, pool=pool[0].source) if pool is not None else result), results


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
    in the study folder (resumed if it holds this same study). With a validation source (data.validate_on), a pool
    study instead: one run a seed on every training photo, judged on the source's photos (those whose bytes are
    also in the training data dropped). teachers: a study of the same folds (or pool)
    and teacher settings (a distilled or guided recipe) whose trained CNN teachers the folds borrow:
    the same teachers they would train, so only the time changes. only (`--fold K`): run these folds
    of each seed alone (to spread a study over machines or over a queue of jobs); the result is then
    theirs, and the study's files are written only once every fold of it has its result. jobs: the folds
    trained on this many processes at once (None: one per core; tuning/jobs.py), else in this process."""
    study = Path(study)
    config = rundir.with_source(config)
    split = training_photos(config)
    check_outside(study, split.root)
    pool = pool_photos(config, split) if config.data.validate_on else None
    if pool is not None:
        if only is not None:
            raise StudyError(
                "--fold picks folds of a cross-validation; a study on --validate-on has one run a seed: leave --fold "
                "out"
            )
        folds = 1
    else:
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
        "kind": "pool" if pool is not None else "cv",
        "data": fingerprint(split),
        "classes": list(split.classes),
        "folds": folds,
        "seeds": seed_list,
        "settings": study_settings(config.to_dict()),
    }
    if pool is not None:
        identity |= {"validation": pool_fingerprint(*pool), "dropped": len(pool[0].dropped)}
    if teachers is not None:
        teachers = Path(teachers)
        with fold_threads(jobs):  # checked against the threads the folds will train on
            check_lender(teachers, study, identity, config)
    grown = open_study(study, identity, grow=training_arithmetic(config))
    if grown is not None and grown != seed_list:
        logger.warning(
            f"{study}: grown from seeds {', '.join(map(str, grown))} to {', '.join(map(str, seed_list))}; the results "
            "of the seeds it held are kept, and the new seeds train"
        )
    if jobs != 1:  # the folds trained on several processes; run_cv below then reads their results
        units = study_units(split, folds, seed_list, study / "folds", pool)
        check_arithmetic(study, units, [u for u in units if only is None or u.fold in only], config)
        train_on_processes(
            config, study, split, folds=folds, seeds=seed_list, teachers=teachers, only=only, jobs=jobs, pool=pool
        )
    run = functools.partial(
        run_cv,
        config,
        study,
        study / "folds",
        split,
        folds=folds,
        seeds=seed_list,
        quiet=quiet,
        teachers=teachers,
        pool=pool,
    )
    result, fold_results = run(progress=progress, only=only)
    if only is not None:  # the study is written once it is whole: its other folds' results are then read, not trained
        if grown_since(study, seed_list):  # grown meanwhile: its runs are where the grown study keeps them
            return replace(result, summarised=False)
        left = folds_left(study, folds, seed_list)
        if left:
            return replace(result, left=tuple(sorted({fold for _, fold in left})))
        result, fold_results = run()
    with study_lock(study):  # a growth by another process changes study.json and the summary under the same lock
        now = grown_since(study, seed_list)
        if now:
            logger.warning(
                f"{study} has grown to seeds {', '.join(map(str, now))} while this ran: the results of seeds "
                f"{', '.join(map(str, seed_list))} are kept, and the process training the new seeds writes the "
                "study's summary"
            )
            return replace(result, summarised=False)
        write_study(study, config, result, fold_results, identity)
    return result


def same_seeds_check(study: Path, seeds: list[int], pool) -> Callable[[], None] | None:
    """What a fold of a one-seed CV study checks before it trains (run_fold's check): another process may have grown
    the study by seeds, moving its runs from fold-K to seed-S/fold-K, where this process does not look; it then stops
    rather than train a fold again under the old name. None where growth moves nothing (a pool study, several seeds)."""
    if pool is not None or len(seeds) != 1:
        return None
    return functools.partial(_same_seeds, study, seeds)


def _same_seeds(study: Path, seeds: list[int]) -> None:
    now = grown_since(study, seeds)
    if now:
        raise StudyError(
            f"{study} has grown to seeds {', '.join(map(str, now))} while this process ran on seed {seeds[0]}: it "
            f"stops, its finished folds kept; run the same `foodvit cv` with --seed {now[0]} --seeds {len(now)} to go "
            "on"
        )


def folds_left(study: Path, folds: int, seeds: list[int]) -> list[tuple[int, int]]:
    """(seed, fold) of every fold of the study whose result is not written yet (by this process or another)."""
    return [
        (seed, fold)
        for seed in seeds
        for fold in range(folds)
        if not (study / f"{fold_name(seed, fold, len(seeds))}.json").is_file()
    ]


def write_study(study: Path, config: RunConfig, result: CvResult, fold_results: list[dict], identity: dict) -> None:
    """cv.json (the result, what the study is, and every prediction), predictions.jsonl, cv.md."""
    photos = {prediction_key(r["seed"], p["photo"]): p["right"] for r in fold_results for p in r["predictions"]}
    what = {key: value for key, value in identity.items() if key != "settings"}  # study.json's, less the settings
    write_text(
        study / "cv.json",
        json.dumps(
            {
                "recipe": config.recipe,
                "study": what | ({"pool": result.pool} if result.pool else {}),
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
    title = f"Validation pool: {config.recipe}" if result.pool else f"Cross-validation: {config.recipe}"
    fold = "" if result.pool else "fold | "  # a pool study has one run a seed
    lines = [
        f"# {title}",
        "",
        result.line(),
        "",
        f"| seed | {fold}photos | accuracy | " + " | ".join(classes) + " | seconds |",
        "|---|---|---|" + "---|" * (len(classes) + bool(fold)) + "---|",
    ]
    for f in result.folds:
        lines.append(
            f"| {f['seed']} | "
            + ("" if result.pool else f"{f['fold']} | ")
            + f"{f['n']} | {f['accuracy']:.3f} | "
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
    pool: tuple | None = None,
) -> None:
    """Every fold (or pool run) of the study without a result (of `only`'s folds, if given) trained on the processes
    of jobs.plan(jobs), each as run_cv trains it: its lender's teacher borrowed where the lender has one, else its
    CNN teacher trained first as a task of its own, so that no core waits while the last folds train."""
    from foodvit.training.teacher import trains_teacher

    tasks = []
    for u in study_units(split, folds, seeds, study / "folds", pool):
        if (only is not None and u.fold not in only) or (study / f"{u.name}.json").is_file():
            continue
        lent = lender_run(teachers, u)
        check = same_seeds_check(study, seeds, pool)
        fold = Task(_fold_task, (config, study / u.name, u.folder, u.seed, u.fold, lent, check))
        if lent is None and trains_teacher(config) and not (study / u.name / "checkpoint.pt").is_file():
            # the teacher a task of its own, the fold's queued when it ends: with 5 folds on 2 processes,
            # teachers 0 and 1, 2 and 3, teacher 4 beside fold 0, folds 1 and 2, folds 3 and 4
            fold = Task(_teacher_task, (config, study / u.name, u.folder, u.seed, check), then=fold)
        tasks.append(fold)
    if tasks:
        run_tasks(tasks, plan(jobs, len(tasks)), progress=progress, firsts="teachers")


def _teacher_task(config: RunConfig, run: Path, folder: Path, seed: int, check=None) -> None:
    """A fold's CNN teacher in a process of train_on_processes: its run started up to its first epoch (fold.start_fold),
    which the fold's own task, queued when this one has ended, resumes to learn what one task would have."""
    try:
        start_fold(config, run, folder, seed=seed, check=check)
    except FoldBusy:
        pass


def _fold_task(
    config: RunConfig, run: Path, folder: Path, seed: int, fold: int, teacher_from: Path | None, check=None
) -> None:
    """One fold in a process of train_on_processes; a fold another command's process holds is left to run_cv."""
    try:
        run_fold(config, run, folder, seed=seed, fold=fold, quiet=True, teacher_from=teacher_from, check=check)
    except FoldBusy:
        pass
