"""What `foodvit tune` leaves for a person: tune.md (every trial, the costs, the best against the starting
recipe, paired), best.toml and Optuna's plots, read from the study's database and its trial folders."""

from __future__ import annotations

import json
import logging
import statistics
import warnings
from pathlib import Path

from foodvit.files import read_json, write_text
from foodvit.settings.layout import setting_key
from foodvit.settings.run import SECTIONS, RunConfig
from foodvit.tuning import compare
from foodvit.tuning.space import Param, base_values, trial_config
from foodvit.tuning.study import known_arithmetic

logger = logging.getLogger(__name__)


def duration_text(s: float) -> str:
    """Seconds as a person reads them: '40 s', '12 min', '2.5 h'."""
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


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
    tables = {"vit": config.vit.given(), **{name: asdict(getattr(config, name)) for name in SECTIONS}}
    tables["data"].pop("source")
    for name, table in tables.items():
        lines += [f"[{name}]"] + [f"{k} = {value(v)}" for k, v in table.items()] + [""]
    return "\n".join(lines) + "\n"


def _trial_photos(study_dir: Path, trial) -> dict[str, bool] | None:
    path = study_dir / trial.user_attrs.get("dir", "") / "cv.json"
    return read_json(path)["photos"] if trial.user_attrs.get("dir") and path.is_file() else None


def _plots(study, study_dir: Path, space: dict[str, Param], completed: int) -> list[str]:
    """Optuna's matplotlib plots as PNGs: the optimisation history, the parameter importances (2
    or more finished trials), a slice plot."""
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ov
    from matplotlib.figure import Figure

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
            # e.g. importances of parameters that never varied
            except (ValueError, RuntimeError, ZeroDivisionError) as err:
                written.append(f"{name}: not drawn ({err})")
                continue
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            assert isinstance(figure, Figure)  # Optuna draws on whole figures, never on subfigures
            save_figure(figure, study_dir / name)
            plt.close(figure)  # Optuna draws through pyplot: its figures are closed, not left in pyplot's list
            written.append(name)
    return written


def mixed_arithmetic(trials) -> list[str]:
    """A line naming the trials of each arithmetic when the search's trials trained in more than one (machines of two
    kinds that began their first trials at the same moment, study.search_arithmetic); [] when they trained in one."""
    kinds: dict[str, list[int]] = {}
    for trial in trials:
        kind = known_arithmetic(trial.user_attrs.get("arithmetic"))
        if kind:
            kinds.setdefault(kind, []).append(trial.number)
    if len(kinds) < 2:
        return []
    shown = "; ".join(
        f"trial{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))} in {kind}"
        for kind, numbers in kinds.items()
    )
    return [f"trials trained in {len(kinds)} arithmetics ({shown}): compare only trials of one"]


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
    rows = _trial_rows(all_trials, base_values(base))
    summary += costs(all_trials, folds) + mixed_arithmetic(all_trials)
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


def _trial_rows(trials, start: dict) -> list[str]:
    """tune.md's table: a row per trial, its state, CV accuracy, fold accuracies, settings that differ from the
    starting recipe's (`start`) and seconds."""
    from optuna.trial import TrialState

    rows = ["| trial | state | CV accuracy | fold accuracies | settings | seconds |", "|---|---|---|---|---|---|"]
    for t in trials:
        changed = (
            ", ".join(f"{k}={_short(v)}" for k, v in t.params.items() if v != start.get(setting_key(k)))
            or "(the starting recipe)"
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
    return rows


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
            f"pruning: {len(pruned)} trials stopped early, saving about {duration_text(saved)} "
            f"({saved / max(spent + saved, 1e-9):.0%} "
            f"of the {duration_text(spent + saved)} all trials would have taken unpruned)"
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
