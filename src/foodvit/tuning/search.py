"""`foodvit tune`: a search over a recipe's settings with Optuna, each trial scored by k-fold CV
over the training photos (cv.py), so the test split plays no part in the choice.

- Sampler: TPE (Optuna's TPESampler), unseeded: processes sharing a study must not propose the same settings.
- Pruning: a fold is a step. After each fold the trial reports its running mean accuracy, and
  Optuna's MedianPruner stops it when that is below the median of earlier trials at the same
  fold. Every trial uses the same folds (the recipe's seed picks them), so the comparison at a
  fold is over the same photos. The median rather than successive halving: halving's rungs are
  built for a resource that grows geometrically (epochs 1, 3, 9, ...) and keep only the top third
  at each, which on 3-5 noisy folds of a few dozen photos throws good settings away; the median
  prunes only a trial that is behind half of the others, and waits for n_startup_trials finished
  trials and for the second fold before it judges.
- The starting recipe (its values for every searched setting) is the first trial (enqueued),
  so the last line of the report compares the best trial with it on the same photos (paired).
- Storage: Optuna's RDB storage, SQLite in STUDY/study.db by default: every finished trial is in
  the database, a rerun continues the study, and several processes can share it. A trial killed
  by Ctrl-C or kill -9 is run again (with its parameters) by the next process, in its own folder,
  whose finished folds are kept (heartbeat + RetryHeartbeatStaleTrialCallback, Optuna's own).

    STUDY/study.db   STUDY/folds/ (the fold folders, shared by all trials)
    STUDY/trial-0003/fold-0/ ...   a trial's fold runs (cv.py's layout)
    STUDY/best.toml  STUDY/tune.md  STUDY/history.png  STUDY/importance.png  STUDY/slice.png
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from dataclasses import replace
from pathlib import Path

from foodvit.errors import ConfigError, StudyError
from foodvit.rundir import directory as rundir
from foodvit.settings.layout import setting_key
from foodvit.settings.run import RunConfig
from foodvit.tuning import cv
from foodvit.tuning.folds import check_folds, fingerprint, training_photos
from foodvit.tuning.space import (
    Param,
    base_values,
    default_space,
    read_space,
    sectioned_space,
    space_table,
    trial_config,
    with_starting_values,
)
from foodvit.tuning.storage import (
    check_database,
    check_study,
    check_url,
    database_error,
    open_storage,
    record_storage,
    storage_lost,
    study_name,
)
from foodvit.tuning.study import (
    TRIAL_FILE,
    bind_trial,
    check_outside,
    open_study,
    read_identity,
    search_arithmetic,
    study_settings,
    training_arithmetic,
)
from foodvit.tuning.summary import duration_text, write_report

logger = logging.getLogger(__name__)

FAILURES_IN_A_ROW = 3  # a process stops after this many failed trials in a row: something is wrong beyond one setting


# ------------------------------------------------------------------------------------ a trial


class TrialCrashed(Exception):
    """A trial that failed for a reason of its own (a diverged run, settings that do not combine):
    Optuna records it as failed and the study goes on."""


def parse_budget(text: str) -> float:
    """'2h', '45m', '90s', '1h30m', '600' (seconds) -> seconds."""
    cleaned = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    else:
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", cleaned)
        if not parts or not any(parts.groups()):
            raise ConfigError(f"--budget takes a time such as 2h, 45m, 90s or 1h30m, got {text!r}")
        h, m, s = (float(g or 0) for g in parts.groups())
        seconds = 3600 * h + 60 * m + s
    if seconds <= 0:
        raise ConfigError(f"--budget must be positive, got {text!r}")
    return seconds


class Objective:
    """One trial: sampled settings over the starting recipe, k-fold CV in the trial's folder, the
    running mean accuracy reported after each fold (Optuna prunes there), the budget checked
    between folds."""

    def __init__(
        self,
        study_dir: Path,
        base: RunConfig,
        space: dict[str, Param],
        split,
        folds: int,
        *,
        budget_s: float | None,
        started: float,
        log,
    ) -> None:
        self.study_dir, self.base, self.space, self.split, self.folds = study_dir, base, space, split, folds
        self.budget_s, self.deadline = budget_s, (started + budget_s) if budget_s else None
        self.log = log
        self.failures = 0  # failed trials in a row, in this process
        self.short = ""  # set when the budget ended inside a trial's first fold: what to do about it

    def folder(self, trial) -> Path:
        """The trial's folder; a trial run again after its process was killed (Optuna's
        RetryHeartbeatStaleTrialCallback, or an interrupted trial enqueued again) takes over its
        predecessor's, finished folds and all."""
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks it experimental
            previous = RetryHeartbeatStaleTrialCallback.retried_trial_number(trial.study.trials[trial.number])
        if previous is None:
            previous = trial.user_attrs.get("retries")
        if previous is not None:
            name = trial.study.trials[previous].user_attrs.get("dir")
            if name:
                return self.study_dir / name
        return self.study_dir / f"trial-{trial.number:04d}"

    def held_names(self, trial) -> dict[str, Param]:
        """The space, each setting under the name the trial already holds a value for: a trial a study of the flat
        layout queued (its starting recipe, fixed params) or Optuna's stale-trial retry queued again (its params)
        holds it under the flat name (settings.layout.MOVED), and keeps that value rather than drawing a new one."""
        frozen = trial.study.get_trials(deepcopy=False)[trial.number]
        old = {setting_key(name): name for name in {**frozen.system_attrs.get("fixed_params", {}), **frozen.params}}
        return {key: replace(p, key=old[key]) if key in old else p for key, p in self.space.items()}

    def __call__(self, trial) -> float:
        import optuna

        folder = self.folder(trial)
        trial.set_user_attr("dir", folder.name)
        params = {key: p.suggest(trial) for key, p in self.held_names(trial).items()}
        try:
            config = trial_config(params, self.base)
        except ConfigError as err:
            trial.set_user_attr("error", str(err))
            raise TrialCrashed(str(err)) from None

        here = training_arithmetic(config)
        try:  # trials another machine started since this search began (the study's database is what they share)
            search_arithmetic(self.study_dir, trial.study.get_trials(deepcopy=False), here, this=trial.number)
        except StudyError as err:  # the trial is run again by the next `foodvit tune`, on a machine of the study's kind
            trial.set_user_attr("error", str(err)[:1000])
            trial.set_user_attr("interrupted", True)
            raise
        trial.set_user_attr("arithmetic", here)
        bind_trial(folder, trial_identity(config, self.split, self.folds), f"trial {trial.number}")
        # folds a trial run again finds finished are read, not run: their time is not this trial's
        finished = {p.name for p in folder.glob("fold-*.json")}

        def after_fold(step: int, results: list[dict]) -> None:
            running = cv.summarise(results).accuracy
            trial.report(running, step)
            trial.set_user_attr("fold_accuracy", [r["accuracy"] for r in results])
            seconds = [r["seconds"] for r in results]
            trial.set_user_attr("fold_seconds", seconds)
            trial.set_user_attr(
                "fold_seconds_here", [r["seconds"] for r in results if f"{r['run']}.json" not in finished]
            )
            if step + 1 >= self.folds:
                return
            if trial.should_prune():
                raise optuna.TrialPruned(
                    f"running mean {running:.3f} after {step + 1} of {self.folds} folds is below the pruner's mark"
                )
            if self.deadline and time.time() + sum(seconds) / len(seconds) > self.deadline:
                # cut short by the budget, not judged: the next `foodvit tune` runs the trial again, its folds kept
                trial.set_user_attr("stopped", "budget")
                trial.study.stop()
                if step == 0 and self.budget_s and seconds[0] > self.budget_s:
                    self.short = (
                        f"--budget {duration_text(self.budget_s)} is less than one fold takes here "
                        f"({seconds[0]:.0f} s, fold {results[0]['fold']} of trial {trial.number}); a trial of "
                        f"{self.folds} folds needs about {duration_text(self.folds * seconds[0])}: the next "
                        "`foodvit tune` "
                        f"goes on with trial {trial.number}'s other folds (a larger --budget, or fewer --folds, "
                        "runs it whole)"
                    )
                raise optuna.TrialPruned(f"the budget ends before a fold more would ({step + 1} of {self.folds} done)")

        try:
            result, fold_results = cv.run_cv(
                config,
                folder,
                self.study_dir / "folds",
                self.split,
                folds=self.folds,
                seeds=[self.base.train.seed],
                after_fold=after_fold,
            )
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)  # the next process runs it again, in this folder
            raise
        except Exception as err:
            if database_error(err) is not None:
                raise  # the study's database, not the trial: nothing can be recorded, the search stops (tune)
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:1000])
            raise TrialCrashed(f"{type(err).__name__}: {err}") from err
        cv.write_study(folder, config, result, fold_results, trial_identity(config, self.split, self.folds))
        return result.accuracy

    def after_trial(self, study, trial) -> None:
        """A line per trial; the study stops when the next trial would not fit the budget, or
        after FAILURES_IN_A_ROW failures in a row."""
        from optuna.trial import TrialState

        state = trial.state.name.lower() + (
            " (the budget ended)" if trial.user_attrs.get("stopped") == "budget" else ""
        )
        value = f" {trial.value:.3f}" if trial.value is not None else ""
        why = f": {trial.user_attrs['error']}" if trial.state == TrialState.FAIL and "error" in trial.user_attrs else ""
        folds = len(trial.user_attrs.get("fold_accuracy", []))
        self.log(f"trial {trial.number}: {state}{value} after {folds} of {self.folds} folds{why}")
        self.failures = self.failures + 1 if trial.state == TrialState.FAIL else 0
        if self.failures >= FAILURES_IN_A_ROW:
            study.stop()
        if self.deadline and trial.state == TrialState.COMPLETE and trial.duration is not None:
            if time.time() + trial.duration.total_seconds() > self.deadline:
                study.stop()


# ------------------------------------------------------------------------------------ a study


def trial_identity(config: RunConfig, split, folds: int) -> dict:
    """What a trial's folder holds: folds of these photos, trained with these settings (trial.json)."""
    return {
        "kind": "trial",
        "data": fingerprint(split),
        "folds": folds,
        "seed": config.train.seed,
        "settings": study_settings(config.to_dict()),
    }


def check_trial_folders(study, study_dir: Path, base: RunConfig, split, folds: int) -> None:
    """Every trial folder belongs to a trial of the study's database and is bound to that trial's
    settings: a database that is not this folder's own is refused before any fold is reported."""
    from optuna.trial import TrialState

    owners = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("dir") and t.state != TrialState.RUNNING:
            owners[t.user_attrs["dir"]] = t
    for folder in sorted(study_dir.glob("trial-*")):
        owner = owners.get(folder.name)
        if owner is None:
            running = any(t.user_attrs.get("dir") == folder.name for t in study.get_trials(deepcopy=False))
            if running or folder.is_dir() and read_identity(folder / TRIAL_FILE) is None and not any(folder.iterdir()):
                continue
            raise StudyError(
                f"{folder} is no trial of the study's database: the database is not this folder's own; "
                "restore the study's own database, or choose a new --out"
            )
        try:
            config = trial_config(owner.params, base)
        except ConfigError:
            continue  # a trial whose settings do not combine trained nothing
        bind_trial(folder, trial_identity(config, split, folds), f"trial {owner.number}")


def _requeue_interrupted(study) -> None:
    """Trials stopped by Ctrl-C or cut short by a budget are run again (same settings, same folder,
    finished folds kept) by the next process."""
    from optuna.trial import TrialState

    retried = {t.user_attrs.get("retries") for t in study.trials}
    for t in study.trials:
        cut = (t.state == TrialState.FAIL and t.user_attrs.get("interrupted")) or (
            t.state == TrialState.PRUNED and t.user_attrs.get("stopped") == "budget"
        )
        if cut and t.number not in retried:
            study.enqueue_trial(
                {setting_key(key): value for key, value in t.params.items()},  # as the space names them
                user_attrs={"retries": t.number, **({"baseline": True} if t.user_attrs.get("baseline") else {})},
            )


def _opened(study_dir: Path, identity: dict, storage: str | None, base: RunConfig, space, split, folds: int, pruner):
    """The folder's Optuna study, created or loaded and checked to be this folder's, its starting recipe queued once
    and its interrupted trials queued again."""
    import optuna
    from filelock import FileLock

    # one process at a time opens the study: Optuna's first creation of its tables is not safe
    # against a second process doing the same, nor is enqueuing the starting recipe exactly once
    with FileLock(study_dir / ".open.lock", timeout=300):
        check_database(study_dir, storage)
        name = study_name(study_dir, storage, identity)
        # TPE unseeded: processes sharing a study would otherwise propose the same settings
        study = optuna.create_study(
            storage=open_storage(study_dir, storage),
            study_name=name,
            direction="maximize",
            sampler=optuna.samplers.TPESampler(),
            pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1),
            load_if_exists=True,
        )
        if storage:
            check_study(study, identity, storage)
        record_storage(study_dir, storage, name)
        if not any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
            start = base_values(base)
            # skip_if_exists: machines sharing a server, each with its own folder (and lock), enqueue it once
            study.enqueue_trial({key: start[key] for key in space}, user_attrs={"baseline": True}, skip_if_exists=True)
        check_trial_folders(study, study_dir, base, split, folds)
        _requeue_interrupted(study)
    return study


def tune(
    study_dir: str | Path,
    base: RunConfig,
    *,
    trials: int | None = None,
    budget_s: float | None = None,
    space_file: str | Path | None = None,
    space: dict[str, Param] | None = None,
    folds: int = 3,
    storage: str | None = None,
    pruner=None,
    log=None,
) -> str:
    """Search settings around `base` (the starting recipe with its options) by k-fold CV over the
    training photos; `trials` trials in this call (default: until the budget, else 20). Writes the
    report and returns its summary lines."""
    started = time.time()
    log = log or logger.info
    study_dir = Path(study_dir)
    check_url(storage)
    base = rundir.with_source(base)
    split = training_photos(base)
    check_outside(study_dir, split.root)
    check_folds(split, folds)
    if space is None:
        space = read_space(space_file, base) if space_file else default_space(base)
    space, widened = with_starting_values(sectioned_space(space), base)
    for key, value in widened.items():
        log(
            f"{key}: the starting recipe's {value!r} is not among the space's choices; it is searched "
            "too (the first trial is the starting recipe)"
        )
    identity = {
        "kind": "tune",
        "data": fingerprint(split),
        "classes": list(split.classes),
        "folds": folds,
        "seed": base.train.seed,
        "space": space_table(space),
        "settings": study_settings(base.to_dict()),
    }
    open_study(study_dir, identity)
    study = _opened(study_dir, identity, storage, base, space, split, folds, pruner)
    search_arithmetic(study_dir, study.get_trials(deepcopy=False), training_arithmetic(base))
    objective = Objective(study_dir, base, space, split, folds, budget_s=budget_s, started=started, log=log)
    with warnings.catch_warnings():
        # a starting value outside a user's range is tried as it is (the first trial): Optuna's warning is needless
        warnings.filterwarnings("ignore", message=".*out of the range.*|.*is out of range.*")
        try:
            study.optimize(
                objective,
                n_trials=trials if trials else (None if budget_s else 20),
                timeout=budget_s,
                catch=(TrialCrashed,),
                callbacks=[objective.after_trial],
            )
        except Exception as err:
            # Optuna's own handling of a trial fails with the database (an UnboundLocalError), the cause behind it
            lost = database_error(err)
            if lost is None:
                raise
            raise StudyError(storage_lost(study_dir, storage, lost)) from None
    if objective.failures >= FAILURES_IN_A_ROW:
        last = study.trials[-1].user_attrs.get("error", "see tune.md")
        write_report(study, study_dir, base, space, folds)
        raise StudyError(f"{FAILURES_IN_A_ROW} trials in a row failed, the last with {last}; the study stopped")
    summary = write_report(study, study_dir, base, space, folds)
    return summary + (f"\n{objective.short}" if objective.short else "")


# ------------------------------------------------------------------------------------ the report
