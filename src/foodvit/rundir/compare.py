"""`foodvit compare RUN...`: runs side by side in the terminal, for people without TensorBoard:
the settings in which they differ (each run's read in the sectioned layout), then their final metrics. Reads
config.json, metrics.csv and model.json only (no PyTorch), so it is instant and works on a finished or an
interrupted run."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from foodvit.errors import RunError
from foodvit.files import read_json
from foodvit.markup import terminal
from foodvit.rundir.card import card_problem, read_card
from foodvit.settings.run import settings_sectioned

METRICS = (
    ("epochs", "epochs"),
    ("train_loss", "train loss"),
    ("train_acc", "train acc"),
    ("val_acc", "val acc"),
    ("test_loss", "test loss"),
    ("test_acc", "test acc"),
    ("seconds", "time (s)"),
    ("images_per_s", "images/s"),
    ("model_share", "model step share"),
)


def flatten(values: dict, prefix: str = "") -> dict:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _canonical(value) -> str:
    """A setting as JSON text, so that equal settings compare equal (a tuple and a list alike)."""
    return json.dumps(value, sort_keys=True)


def differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(key, a's value, b's value) for every setting that differs between two nested config dicts,
    keys flattened ("optim.lr")."""
    flat_a, flat_b = flatten(a), flatten(b)
    return [
        (key, flat_a.get(key), flat_b.get(key))
        for key in sorted(set(flat_a) | set(flat_b))
        if _canonical(flat_a.get(key)) != _canonical(flat_b.get(key))
    ]


def last_epoch(path: Path) -> dict:
    """The figures of metrics.csv's last row, its epoch, and the seconds of all its rows; a RunError for a file
    that is not the table training writes."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            return {}
        last = rows[-1]
        metrics = {key: last.get(key) for key, _ in METRICS if last.get(key)}
        metrics["epochs"] = last.get("epoch")
        metrics["seconds"] = sum(float(r["seconds"]) for r in rows if r.get("seconds"))
        metrics["images_per_s"] = last.get("images_per_s") or None
        return metrics
    except (OSError, ValueError, csv.Error) as err:  # UnicodeDecodeError is a ValueError
        raise RunError(
            f"{path} is not the metrics table training writes ({type(err).__name__}: {str(err)[:120]}); restore it, "
            "or leave that run out"
        ) from None


def read_run(run: Path) -> tuple[dict, dict]:
    """A run's flat settings and its final metrics (the last epoch's row, the final test result when
    the run finished, the total time)."""
    config_path = run / "config.json"
    if not config_path.is_file():
        raise RunError(f"{run} holds no foodvit run (no config.json); give run directories written by foodvit train")
    try:
        stored = read_json(config_path)
    except (OSError, ValueError) as err:
        raise RunError(f"cannot read {config_path} ({err}); restore it, or leave that run out") from None
    if not isinstance(stored, dict):
        raise RunError(
            f"{config_path}: expected a JSON object of settings, got {type(stored).__name__}; restore it, or leave "
            "that run out"
        )
    settings = flatten(settings_sectioned(stored))  # read in either layout
    metrics: dict = {}
    if (run / "metrics.csv").is_file():
        metrics = last_epoch(run / "metrics.csv")
    model_json = run / "model.json"
    if model_json.is_file():
        try:
            card = read_card(model_json)
        except RunError as err:
            raise RunError(f"{err}; or leave that run out of the comparison") from None
        if problem := card_problem(card) or ("" if isinstance(card.get("metrics"), dict) else "it has no metrics"):
            raise RunError(f"{model_json} is damaged: {problem}; restore it, or leave that run out")
        final = card["metrics"]
        metrics.update({k: final[k] for k in ("test_acc", "test_loss") if k in final})
    else:
        total = settings.get("train.epochs")
        metrics["epochs"] = f"{metrics.get('epochs', 0)}/{total} (unfinished)"
    return settings, metrics


def _show(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "()"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, bool):
        return str(value)
    if number.is_integer() and abs(number) < 1e9:
        return str(int(number))
    return f"{number:.4g}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns of text for a terminal, each cell one line (markup.terminal)."""
    header, rows = [terminal(c) for c in header], [[terminal(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def compare_runs(runs: list[Path]) -> str:
    """The settings that differ between the runs, then their final metrics, as two tables."""
    runs = [Path(run) for run in runs]
    for i, run in enumerate(runs):
        twice = next((other for other in runs[:i] if other.resolve() == run.resolve()), None)
        if twice is not None:
            raise RunError(f"{twice} and {run} name one run; give each run once")
    read = [read_run(run) for run in runs]
    names = [run.name or str(run) for run in runs]
    if len(set(names)) < len(names):  # runs/a/run and runs/b/run: each named by its path as given
        names = [os.path.normpath(run) for run in runs]
    keys = sorted(set().union(*(settings for settings, _ in read)))
    differing = [k for k in keys if len({_canonical(s.get(k)) for s, _ in read}) > 1]
    parts = []
    if len(runs) > 1:
        if differing:
            parts.append(table(["setting", *names], [[k, *(_show(s.get(k)) for s, _ in read)] for k in differing]))
        else:
            parts.append("same settings in every run")
    else:
        parts.append(table(["setting", names[0]], [[k, _show(read[0][0][k])] for k in keys]))
    metric_rows = [
        [label, *(_show(m.get(key)) for _, m in read)]
        for key, label in METRICS
        if any(m.get(key) is not None for _, m in read)
    ]
    parts.append(table(["metric", *names], metric_rows))
    return "\n\n".join(parts)
