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

import json
import logging
import re
import statistics
import time
import warnings
from pathlib import Path
from urllib.parse import quote, unquote

from foodvit.config import SECTIONS, RunConfig, with_settings
from foodvit.errors import ConfigError, StudyError
from foodvit.files import write_text
from foodvit.model.variants import without_recipe_resizing
from foodvit.rundir import directory as rundir
from foodvit.tuning import compare, cv
from foodvit.tuning.space import Param, base_values, default_space, read_space, space_table
from foodvit.tuning.study import TRIAL_FILE, bind_trial, open_study, read_identity, study_settings

logger = logging.getLogger(__name__)

STUDY_NAME = "foodvit"
FAILURES_IN_A_ROW = 3  # a process stops after this many failed trials in a row: something is wrong beyond one setting


# ------------------------------------------------------------------------------------ a trial


def trial_overrides(params: dict, base: RunConfig) -> dict:
    """A trial's settings as build_config overrides; a searched width takes the MLP along at the
    recipe's ratio (Table 1: M = 4 D) unless the MLP width is searched itself."""
    overrides = dict(params)
    if "vit.embed_dim" in params and "vit.mlp_dim" not in params:
        v = base_values(base)
        overrides["vit.mlp_dim"] = round(params["vit.embed_dim"] * v["vit.mlp_dim"] / v["vit.embed_dim"])
    return overrides


def trial_config(params: dict, base: RunConfig) -> RunConfig:
    """The settings a trial trains with: the base (the recipe and the command line) with the trial's
    settings over it; its progressive resizing stays where the trial's model can take it."""
    overrides = trial_overrides(params, base)
    return without_recipe_resizing(base, with_settings(base, overrides), overrides)


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


def _seconds(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


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

    def __call__(self, trial) -> float:
        import optuna

        folder = self.folder(trial)
        trial.set_user_attr("dir", folder.name)
        params = {key: p.suggest(trial) for key, p in self.space.items()}
        try:
            config = trial_config(params, self.base)
        except ConfigError as err:
            trial.set_user_attr("error", str(err))
            raise TrialCrashed(str(err)) from None

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
                        f"--budget {_seconds(self.budget_s)} is less than one fold takes here "
                        f"({seconds[0]:.0f} s, fold {results[0]['fold']} of trial {trial.number}); a trial of "
                        f"{self.folds} folds needs about {_seconds(self.folds * seconds[0])}: the next `foodvit tune` "
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
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:1000])
            raise TrialCrashed(f"{type(err).__name__}: {err}") from err
        cv.write_study(folder, config, result, fold_results)
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


def _storage(study_dir: Path, url: str | None):
    """Optuna's RDB storage: SQLite in the study folder unless a URL is given. The heartbeat
    marks a trial whose process died (kill -9) as failed after grace_period, and the retry
    callback enqueues it again."""
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    given = url
    # the folder's path quoted: a "?" or "#" in it is part of the name, not the URL's query or fragment
    url = url or f"sqlite:///{quote(str((study_dir / 'study.db').resolve()))}"
    engine = (
        {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    )  # SQLite: wait for the other process's write
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks the heartbeat experimental
            return RDBStorage(
                url,
                engine_kwargs=engine,
                heartbeat_interval=30,
                grace_period=90,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
            )
    except Exception as err:
        raise StudyError(storage_problem(given, url, err)) from None


def storage_problem(given: str | None, url: str, err: Exception) -> str:
    """What is wrong with a study's database, in one line: its driver missing, a URL no database
    takes, a server not there, a file that is no database."""
    import sqlalchemy.exc

    where = f"--storage {_hide_password(url)}" if given else unquote(url.removeprefix("sqlite:///"))
    first = (
        str(getattr(err, "orig", None) or err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    )
    if isinstance(err, ImportError):
        missing = (
            getattr(err.__cause__, "name", None) or err.name or "its driver"
        )  # Optuna wraps SQLAlchemy's ImportError
        return (
            f"{where} needs the database driver {missing}, which is not installed: pip install 'foodvit[tune]' for "
            f"PostgreSQL (psycopg), or the driver the URL names (e.g. mysql+pymysql:// needs PyMySQL)"
        )
    if isinstance(err, sqlalchemy.exc.ArgumentError | sqlalchemy.exc.NoSuchModuleError) or isinstance(err, ValueError):
        return (
            f"{where} is not a database URL: give postgresql://user@host/db, mysql://user@host/db or "
            f"sqlite:///path ({first})"
        )
    if isinstance(err, sqlalchemy.exc.OperationalError) and given and not url.startswith("sqlite"):
        return (
            f"cannot reach the database of {where} ({first}): start its server, or check the host, port, user "
            "and database"
        )
    if isinstance(err, sqlalchemy.exc.DatabaseError | sqlalchemy.exc.OperationalError):
        return f"{where} is not a study database foodvit can use ({first}): restore it, or choose a new --out"
    raise err


def _hide_password(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def trial_identity(config: RunConfig, split, folds: int) -> dict:
    """What a trial's folder holds: folds of these photos, trained with these settings (trial.json)."""
    return {
        "kind": "trial",
        "data": cv.fingerprint(split),
        "folds": folds,
        "seed": config.train.seed,
        "settings": study_settings(config.to_dict()),
    }


def check_database(study_dir: Path, storage: str | None) -> None:
    """The study's own SQLite database, before Optuna opens it (and would add its tables to any file):
    gone while trial folders remain, another program's, truncated or random bytes are refused, since
    the trial folders could then be reported under trials they are not."""
    import sqlite3
    from contextlib import closing

    if storage:
        return  # a server's database: the trial folders are checked against its trials (check_trial_folders)
    db = study_dir / "study.db"
    held = sorted(p.name for p in study_dir.glob("trial-*"))
    advice = f"restore {db} from where it was copied, or choose a new --out for a new study"
    if not db.exists():
        if held:
            raise StudyError(
                f"{db} is gone, and without it the trial folders "
                f"({', '.join(held[:3])}{' ...' if len(held) > 3 else ''}) "
                f"cannot be matched to their trials' settings; {advice}"
            )
        return
    if not db.is_file():
        raise StudyError(f"{db} is not a file; {advice}")
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            names = {row[0] for row in connection.execute("select study_name from studies")}
    except sqlite3.Error as err:
        if db.stat().st_size == 0 and not held:
            return  # made by a start that stopped at once: Optuna fills it
        raise StudyError(f"{db} is not a study database foodvit can read ({err}); {advice}") from None
    if STUDY_NAME not in names:
        raise StudyError(f"{db} holds no foodvit study (another program's or another tool's database); {advice}")


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
                t.params,
                user_attrs={"retries": t.number, **({"baseline": True} if t.user_attrs.get("baseline") else {})},
            )


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
    import optuna

    started = time.time()
    log = log or logger.info
    study_dir = Path(study_dir)
    base = rundir.with_source(base)
    split = cv.training_photos(base)
    cv.check_folds(split, folds)
    if space is None:
        space = read_space(space_file, base) if space_file else default_space(base)
    open_study(
        study_dir,
        {
            "kind": "tune",
            "data": cv.fingerprint(split),
            "classes": list(split.classes),
            "folds": folds,
            "seed": base.train.seed,
            "space": space_table(space),
            "settings": study_settings(base.to_dict()),
        },
    )
    from filelock import FileLock

    # one process at a time opens the study: Optuna's first creation of its tables is not safe
    # against a second process doing the same, nor is enqueuing the starting recipe exactly once
    with FileLock(study_dir / ".open.lock", timeout=300):
        check_database(study_dir, storage)
        # TPE unseeded: processes sharing a study would otherwise propose the same settings
        study = optuna.create_study(
            storage=_storage(study_dir, storage),
            study_name=STUDY_NAME,
            direction="maximize",
            sampler=optuna.samplers.TPESampler(),
            pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1),
            load_if_exists=True,
        )
        if not any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
            start = base_values(base)
            # skip_if_exists: machines sharing a server, each with its own folder (and lock), enqueue it once
            study.enqueue_trial({key: start[key] for key in space}, user_attrs={"baseline": True}, skip_if_exists=True)
        check_trial_folders(study, study_dir, base, split, folds)
        _requeue_interrupted(study)
    objective = Objective(study_dir, base, space, split, folds, budget_s=budget_s, started=started, log=log)
    with warnings.catch_warnings():
        # a starting value outside a user's range is tried as it is (the first trial): Optuna's warning is needless
        warnings.filterwarnings("ignore", message=".*out of the range.*|.*is out of range.*")
        study.optimize(
            objective,
            n_trials=trials if trials else (None if budget_s else 20),
            timeout=budget_s,
            catch=(TrialCrashed,),
            callbacks=[objective.after_trial],
        )
    if objective.failures >= FAILURES_IN_A_ROW:
        last = study.trials[-1].user_attrs.get("error", "see tune.md")
        write_report(study, study_dir, base, space, folds)
        raise StudyError(f"{FAILURES_IN_A_ROW} trials in a row failed, the last with {last}; the study stopped")
    summary = write_report(study, study_dir, base, space, folds)
    return summary + (f"\n{objective.short}" if objective.short else "")


# ------------------------------------------------------------------------------------ the report


def recipe_toml(config: RunConfig, header: str) -> str:
    """A recipe file of the config (load_recipe reads it back): every setting but the data source,
    which stays a command-line choice."""
    from dataclasses import asdict

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # a TOML basic string

    lines = [f"# {line}" for line in header.splitlines()] + [f"model = {value(config.model)}", ""]
    tables = {"vit": dict(config.vit), **{name: asdict(getattr(config, name)) for name in SECTIONS}}
    tables["data"].pop("source")
    for name, table in tables.items():
        lines += [f"[{name}]"] + [f"{k} = {value(v)}" for k, v in table.items()] + [""]
    return "\n".join(lines) + "\n"


def _trial_photos(study_dir: Path, trial) -> dict[str, bool] | None:
    path = study_dir / trial.user_attrs.get("dir", "") / "cv.json"
    return json.loads(path.read_text())["photos"] if trial.user_attrs.get("dir") and path.is_file() else None


def _plots(study, study_dir: Path, space: dict[str, Param], completed: int) -> list[str]:
    """Optuna's matplotlib plots as PNGs: the optimisation history, the parameter importances (2
    or more finished trials), a slice plot."""
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ov

    from foodvit.viz.plotting import save_figure

    wanted = [
        ("history.png", lambda: ov.plot_optimization_history(study)),
        ("slice.png", lambda: ov.plot_slice(study, params=list(space))),
    ]
    if completed >= 2:
        wanted.insert(1, ("importance.png", lambda: ov.plot_param_importances(study)))
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        for name, draw in wanted:
            try:
                axes = draw()
            except (
                ValueError,
                RuntimeError,
                ZeroDivisionError,
            ) as err:  # e.g. importances of parameters that never varied
                written.append(f"{name}: not drawn ({err})")
                continue
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            save_figure(figure, study_dir / name)
            plt.close(figure)  # Optuna draws through pyplot: its figures are closed, not left in pyplot's list
            written.append(name)
    return written


def write_report(study, study_dir: Path, base: RunConfig, space: dict[str, Param], folds: int) -> str:
    """best.toml, tune.md and the plots; returns the summary: the best trial and, last, the paired
    comparison of the best with the starting recipe on the same photos."""
    from optuna.trial import TrialState

    all_trials = study.get_trials(deepcopy=False)
    completed = [t for t in all_trials if t.state == TrialState.COMPLETE]
    cut = [t for t in all_trials if t.user_attrs.get("stopped") == "budget" or t.user_attrs.get("interrupted")]
    counts = {
        state: sum(t.state == state and t not in cut for t in all_trials)
        for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    summary = [
        f"{len(all_trials)} trials in {study_dir}: {counts[TrialState.COMPLETE]} complete, "
        f"{counts[TrialState.PRUNED]} pruned, "
        f"{counts[TrialState.FAIL]} failed"
        + (f", {len(cut)} stopped by the budget or interrupted (run again by the next foodvit tune)" if cut else "")
    ]
    rows = ["| trial | state | CV accuracy | fold accuracies | settings | seconds |", "|---|---|---|---|---|---|"]
    start = base_values(base)
    for t in all_trials:
        changed = (
            ", ".join(f"{k}={_short(v)}" for k, v in t.params.items() if v != start.get(k)) or "(the starting recipe)"
        )
        value = f"{t.value:.3f}" if t.value is not None else "--"
        accs = " ".join(f"{a:.2f}" for a in t.user_attrs.get("fold_accuracy", []))
        seconds = f"{t.duration.total_seconds():.0f}" if t.duration else "--"
        note = f" ({t.user_attrs['error'][:80]})" if t.state == TrialState.FAIL and "error" in t.user_attrs else ""
        if t.user_attrs.get("stopped") == "budget":
            note = " (the budget ended)"
        if t.user_attrs.get("dir", f"trial-{t.number:04d}") != f"trial-{t.number:04d}":
            note += f" (runs {t.user_attrs['dir']} again, its finished folds kept)"
        rows.append(f"| {t.number} | {t.state.name.lower()}{note} | {value} | {accs} | {changed} | {seconds} |")
    summary += costs(all_trials, folds)
    lines = [
        "# Tuning study",
        "",
        f"Starting recipe: {base.recipe}; {folds}-fold CV over the training photos (seed "
        f"{base.train.seed}), TPE sampler, pruner {type(study.pruner).__name__}.",
        "",
        *summary,
        "",
    ]
    if completed:
        best = study.best_trial
        config = trial_config(best.params, base)  # what the best trial trained with, its progressive resizing included
        header = (
            f"foodvit tune: the best of {len(completed)} finished trials in {study_dir} (trial {best.number}), "
            f"{folds}-fold CV accuracy {best.value:.3f} over the training photos; train with\n"
            f"foodvit train --recipe {study_dir / 'best.toml'}"
        )
        write_text(study_dir / "best.toml", recipe_toml(config, header))
        summary.append(f"best: trial {best.number}, CV accuracy {best.value:.3f}; recipe {study_dir / 'best.toml'}")
        lines += [summary[-1], ""]
        lines += [
            f"![{name}]({name})" for name in _plots(study, study_dir, space, len(completed)) if name.endswith(".png")
        ] + [""]
        baseline = next((t for t in completed if t.user_attrs.get("baseline")), None)
        if baseline is None:
            summary.append("the starting recipe's trial has not finished: no paired comparison yet")
        elif baseline.number == best.number:
            summary.append(f"the starting recipe (trial {best.number}) is the best found")
        else:
            a, b = _trial_photos(study_dir, baseline), _trial_photos(study_dir, best)
            if a is None or b is None:  # a trial run on another machine (--storage): its photos are not here
                summary.append(
                    f"best vs starting recipe: trial {best.number if b is None else baseline.number}'s predictions "
                    f"are not in {study_dir} (run on another machine): no paired comparison here"
                )
            else:
                result = compare.paired(a, b)
                summary.append(
                    "best vs starting recipe, same folds: "
                    + compare.compare_line(result, f"trial {baseline.number} (start)", f"trial {best.number} (best)")
                )
    else:
        summary.append("no trial has finished yet: no best recipe")
    lines += rows + ["", summary[-1], ""]
    write_text(study_dir / "tune.md", "\n".join(lines))
    return "\n".join(summary)


def costs(trials, folds: int) -> list[str]:
    """What pruning saved (each pruned trial's folds not run, at its own mean fold time) and the
    study's own cost per trial (a trial's time beyond its folds: sampling, storage, building the
    config), from the trials' recorded fold times."""
    from optuna.trial import TrialState

    pruned = [
        t
        for t in trials
        if t.state == TrialState.PRUNED and t.user_attrs.get("stopped") != "budget" and t.user_attrs.get("fold_seconds")
    ]
    saved = sum(
        (folds - len(t.user_attrs["fold_seconds"])) * statistics.fmean(t.user_attrs["fold_seconds"]) for t in pruned
    )
    spent = sum(sum(t.user_attrs.get("fold_seconds", [])) for t in trials)
    out = (
        [
            f"pruning: {len(pruned)} trials stopped early, saving about {_seconds(saved)} "
            f"({saved / max(spent + saved, 1e-9):.0%} "
            f"of the {_seconds(spent + saved)} all trials would have taken unpruned)"
        ]
        if pruned
        else []
    )
    overhead = [
        t.duration.total_seconds() - sum(t.user_attrs.get("fold_seconds_here", t.user_attrs["fold_seconds"]))
        for t in trials
        if t.duration and t.user_attrs.get("fold_seconds") and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    ]
    if overhead:
        out.append(
            f"the study's own cost per trial (beyond its folds): median {statistics.median(overhead):.1f} s, "
            f"largest {max(overhead):.1f} s"
        )
    return out


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
