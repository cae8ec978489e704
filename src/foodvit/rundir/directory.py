"""A run directory, the one place that creates, locks, reads and checks it. What it holds, file by file, is
RUN_FILES below (the run-directory reference's table is generated from it).

A run directory is the user's: a new run goes only into a new or empty folder, one process at a
time writes it, a run that fails before its first checkpoint leaves the folder as it was found,
and a resumed run continues with exactly the settings it started with.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path

from filelock import FileLock, Timeout

from foodvit.data.datasource import DataSource
from foodvit.errors import ConfigError, FoodVitError, RunError
from foodvit.files import atomic_write, read_json
from foodvit.rundir.compare import differences
from foodvit.settings.run import RunConfig, settings_sectioned
from foodvit.torchrun import place

logger = logging.getLogger(__name__)

TEACHER_FILE = "teacher.pt"  # the CNN teacher of a distilled or guided run (training/teacher.py)
TEACHER_PROGRESS = "teacher-progress.pt"  # its training after each epoch but the last, until teacher.pt is written
TENSORBOARD = "tensorboard"  # --tensorboard's event files (training/tracking.py)
PRETRAINING_FILE = "pretraining.csv"  # each self-supervised pre-training epoch's loss (training/pretrain.py)
VALIDATION_FILE = "validation.jsonl"  # with --validate-on, each validation photo's answer (training/report.py)
LOCK_FILE, OWNER_FILE = ".foodvit.lock", ".foodvit.owner"  # RunLock's
# every file a run writes, with what it holds: a failed start removes these, and only these
RUN_FILES = {
    "config.json": (
        "the resolved settings, the data source the run really used included (a path made absolute), in sections: "
        "`vit` (the model settings set over the variant), `data`, `optim` (the optimiser and its step), one per "
        "training objective named after it (`drloc`, `masked`, `guidance`, `distill`, `contrast`: its `weight`, 0 = "
        "off, and its own settings), `teacher` (the CNN teacher), `pretrain` (the self-supervised stage) and `train`;"
        " a file with the objectives', teacher's and pre-training's settings inside `optim` under their option names "
        "(`drloc`, `mask_ratio`, `teacher_epochs` ...) loads to the same settings (`settings.layout.MOVED`); "
        "`--resume` refuses one edited since, but for `data.source`: where the photos are (`--resume --data` moves "
        "them; the checkpoint's counts of photos hold them to its own)"
    ),
    "metrics.csv": (
        "one row per epoch: every `*_loss` is the plain cross-entropy per image; `train_objective` is what the "
        "optimiser minimised (auxiliary losses included); accuracies per image; `model_share` (the share of the "
        "epoch spent in the model step)"
    ),
    "checkpoint.pt": "everything `--resume` needs, written atomically after every epoch (the teacher's included)",
    "model.safetensors": "the trained model's weights (rundir/trained.py)",
    "model.json": "the trained model's configuration, class names, preprocessing and final metrics",
    "curves.png": "the loss and accuracy curves",
    "confusion.png": "the confusion matrix of the test split",
    "most_wrong.png": "the most confidently wrong test photos",
    "report.md": "the run's summary: settings, data, final metrics per class, time, threads",
    TEACHER_FILE: "the CNN teacher, when the recipe trains one first (guidance, distillation)",
    TEACHER_PROGRESS: "the CNN teacher after its last finished epoch while it trains (removed once teacher.pt is in)",
    PRETRAINING_FILE: "the self-supervised stage's loss by epoch, with `--pretrain-epochs`",
    VALIDATION_FILE: "with `--validate-on`: each validation photo's answer by the final model",
}
RUN_FOLDERS = {TENSORBOARD: "event files, with `--tensorboard`"}
LOCKS = {
    LOCK_FILE: "the operating-system lock (flock) of the process writing the run: an empty file that stays",
    OWNER_FILE: "which process holds the lock, for the message of a second writer refused",
}
# *_loss: plain cross-entropy per image, comparable across splits; train_objective: what was minimised
METRIC_COLUMNS = (
    "epoch",
    "train_loss",
    "train_objective",
    "train_acc",
    "val_loss",
    "val_acc",
    "test_loss",
    "test_acc",
    "lr",
    "seconds",
    "images_per_s",
    "model_share",
)


# ------------------------------------------------------------------------------------ one writer


class LockedError(RunError):
    """Another live process holds the run's lock."""


class RunLock:
    """One writer per run directory: an OS lock (filelock's flock) on .foodvit.lock, which the
    kernel releases when its process dies, so there are no stale locks and no race between
    creating the file and writing it. Who holds it is written beside it (.foodvit.owner), for the
    message only: filelock truncates the lock file on every attempt, so it cannot carry that."""

    NAME = LOCK_FILE
    OWNER = OWNER_FILE

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.NAME
        self.lock = FileLock(self.path, timeout=0)

    def acquire(self) -> RunLock:
        try:
            self.lock.acquire()
        except Timeout:
            raise LockedError(
                f"{self.folder} is in use by another foodvit process ({self.holder() or 'owner unknown'}); "
                "wait for it to finish or choose another --out"
            ) from None
        (self.folder / self.OWNER).write_text(
            f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}\n"
        )
        return self

    def release(self) -> None:
        if self.lock.is_locked:
            (self.folder / self.OWNER).unlink(missing_ok=True)
            self.lock.release()

    def remove(self) -> None:
        """Release, and remove the lock's own files (a start that leaves the folder as it found it)."""
        self.release()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def holder(self) -> str | None:
        """'pid N on HOST, since T' while a live process holds the lock, else None."""
        probe = FileLock(self.path, timeout=0)
        if not self.path.exists():
            return None
        try:
            probe.acquire()
        except Timeout:
            try:
                return (self.folder / self.OWNER).read_text().strip() or "owner unknown"
            except OSError:
                return "owner unknown"
        probe.release()
        return None


def training_now(folder: str | os.PathLike) -> str | None:
    """Which process is training the run in folder right now ('pid N on HOST, since T'), or None."""
    return RunLock(folder).holder() if Path(folder).is_dir() else None


# ------------------------------------------------------------------------------------ a new run


def default_out() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


class NewRunDirectory:
    """A new run's folder, for the time of its start: created (or an empty one taken), locked, and,
    if the run fails before its first checkpoint, left as it was found (nothing to resume)."""

    def __init__(self, out: Path) -> None:
        self.out, self.created = Path(out), False
        self.lock = RunLock(self.out)

    def __enter__(self) -> NewRunDirectory:
        out = self.out
        if out.exists() and not out.is_dir():
            raise RunError(f"--out {out} is a file; a run directory is a folder: choose another --out")
        blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise RunError(f"{blocker} is a file; a run directory is a folder (--out {out}): choose another --out")
        self.created = not out.exists()
        self.lock_was_there = self.lock.path.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        except FoodVitError:
            raise
        except OSError as err:
            self._forget()
            raise RunError(f"cannot write to {out} ({err.strerror or err}); choose a writable --out") from None
        others = sorted(p.name for p in out.iterdir() if p.name not in (RunLock.NAME, RunLock.OWNER))
        if others:
            self.lock.release() if self.lock_was_there else self.lock.remove()  # the user's folder as it was
            if "checkpoint.pt" in others or "model.safetensors" in others:
                raise RunError(
                    f"{out} already holds a run; continue it with `foodvit train --resume {out}` "
                    "or choose another --out"
                )
            if "config.json" in others:
                raise RunError(
                    f"{out} holds a run stopped before its first checkpoint (config.json, no checkpoint.pt): "
                    f"nothing of it can be resumed; remove {out} to start again there, or choose another --out"
                )
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise RunError(
                f"{out} is not empty ({shown}) and holds no foodvit run; foodvit writes a new run only into a new "
                "or empty folder, so that nothing of yours is overwritten: choose another --out"
            )
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is not None and not (self.out / "checkpoint.pt").exists():
            self._forget()
        else:
            self.lock.release()

    def _forget(self) -> None:
        """Remove what this start wrote (foodvit's own files and folders only), and the folder if it made it."""
        self.lock.remove()
        forget_start(self.out)
        if self.created and self.out.is_dir() and not any(self.out.iterdir()):
            self.out.rmdir()


def forget_start(out: Path) -> None:
    """Remove a run's own files and folders (and temporary files a killed writer left), nothing else:
    a start that failed, or was killed, before its first checkpoint, so that the folder can take a run again."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_FOLDERS:
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (*RUN_FILES, RunLock.OWNER):  # atomic_write's .<name>.<hex>.tmp of a process killed mid-write
        for leftover in out.glob(f".{name}.*.tmp"):
            leftover.unlink(missing_ok=True)
    if not (RunLock(out).holder()):
        (out / RunLock.NAME).unlink(missing_ok=True)
        (out / RunLock.OWNER).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ files


def write_rows(path: Path, rows: list[dict], columns: tuple[str, ...]) -> Path:
    """An epoch table (metrics.csv, pretraining.csv): the columns named, floats to 6 significant digits,
    written whole."""

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})

    return atomic_write(path, write)


def write_metrics(path: Path, history: list[dict]) -> Path:
    return write_rows(path, history, METRIC_COLUMNS)


def read_config(path: Path) -> RunConfig:
    """A run's config.json, or a RunError that names the file once and says what is wrong with it."""
    try:
        values = read_json(path)
    except (OSError, UnicodeDecodeError) as err:
        raise RunError(f"cannot read {path} ({err})") from None
    except ValueError as err:
        raise RunError(
            f"{path} is not valid JSON ({err}); restore it from the checkpoint's settings or start a new run"
        ) from None
    try:
        return RunConfig.from_dict(values, where=str(path))
    except (ConfigError, TypeError) as err:
        message = str(err)
        raise RunError(message if message.startswith(str(path)) else f"{path}: {message}") from None


def save_checkpoint(path: Path, state: dict) -> Path:
    import torch

    return atomic_write(path, lambda tmp: torch.save(state, tmp))


CHECKPOINT_FORMAT = "foodvit-checkpoint"  # a run's checkpoint.pt (training/trainer.Trainer.state)
CHECKPOINT_KEYS = ("epoch", "model", "optimizer", "scheduler", "history", "classes")  # what a resume reads of it


def load_checkpoint(path: Path) -> dict:
    import torch

    path = Path(path)
    if not path.is_file():
        raise RunError(
            f"{path} does not exist: the run stopped before its first checkpoint (written after its first epoch, "
            f"or its CNN teacher or pre-training stage), so nothing of it can be resumed; remove {path.parent} "
            "to start again there with foodvit train --out, or choose another --out"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many kinds for a damaged or foreign file; all mean the same here
        # its own message is PyTorch's (pages of it, advising to load the file unsafely): the kind alone is kept
        raise RunError(
            f"{path} is damaged or not a foodvit checkpoint ({type(err).__name__}); {DAMAGED.get(path.name, OTHER)}"
        ) from err


DAMAGED = {  # what to do about each file of a run that cannot be read
    "checkpoint.pt": "the run cannot go on from it: train again into a new --out (or remove this folder first)",
    TEACHER_PROGRESS: "remove it and run the same command again: the CNN teacher's training starts over",
    TEACHER_FILE: "remove it and run the same command again: the CNN teacher is trained again",
}
OTHER = "restore it from a copy, or train again into a new --out"


# ------------------------------------------------------------------------------------ a stored run


def with_source(config: RunConfig) -> RunConfig:
    """The config with the data source it will really use (FOODVIT_DATA's, or the course's URL,
    when none is given), so that config.json says where the photos came from; a path given relative to
    the working folder, there and for the validation source, made absolute, so that a command run
    from another folder finds them (they were looked for there, and said to be gone)."""
    data = config.data
    source = str(DataSource.parse(data.source or None).absolute())
    validate_on = str(DataSource.parse(data.validate_on).absolute()) if data.validate_on else data.validate_on
    return replace(config, data=replace(data, source=source, validate_on=validate_on))


def stored_device(out: Path) -> str:
    """The device setting a run was started with (to pick this process's device before reading the run)."""
    try:
        return read_config(out / "config.json").train.device
    except FoodVitError:
        return "auto"  # read_for_resume says what is wrong


def check_is_run(out: Path) -> None:
    """A folder --resume can take, or a one-line error whose advice the other commands would follow."""
    if (out / "config.json").is_file():
        return
    if not out.exists():
        raise RunError(f"{out} does not exist; --resume takes a run directory written by foodvit train")
    if not out.is_dir():
        raise RunError(f"{out} is a file; --resume takes a run directory written by foodvit train")
    if any(p.name not in (RunLock.NAME, RunLock.OWNER) for p in out.iterdir()):
        raise RunError(
            f"{out} holds no foodvit run (no config.json): --resume takes a run directory written by foodvit train, "
            "and a new run needs a new or empty folder (--out)"
        )
    raise RunError(
        f"{out} holds no foodvit run (no config.json), nothing to resume; start one with foodvit train --out {out}"
    )


def read_for_resume(out: Path, data: str | None, quiet: bool = False) -> tuple[RunConfig, dict]:
    """A run's settings and last checkpoint, checked against each other; a finished run is refused
    (resuming it would train nothing and only rewrite its results). Says (logging, unless quiet) where
    the photos come from."""
    config_path = out / "config.json"
    config = read_config(config_path)
    state = load_checkpoint(out / "checkpoint.pt")
    if (
        not isinstance(state, dict)
        or state.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT  # the oldest checkpoints name no format
        or any(key not in state for key in CHECKPOINT_KEYS)
    ):
        raise RunError(
            f"{out / 'checkpoint.pt'} is not a foodvit checkpoint (another program's file, or a file of another "
            f"kind); {DAMAGED['checkpoint.pt']}"
        )
    if state.get("config") is not None:
        # settings added since the run started are not edits; nor is where the photos are (resume --data stores
        # their new place, and check_same_data holds them to the checkpoint's)
        changed = [
            change
            for change in differences(settings_sectioned(state["config"]), config.to_dict())
            if change[0] != "data.source"
        ]
        if changed:
            shown = "; ".join(f"{key}: {a!r} -> {b!r}" for key, a, b in changed)
            raise RunError(
                f"{config_path} differs from the settings the run started with ({shown}); "
                "a resumed run continues with its own settings: undo the edit, or start a new run with --out"
            )
    # finished: its model and its report written, the last of its results (report.write_results); a run stopped
    # before them has every epoch and resumes to evaluate and write them again
    finished = all((out / name).is_file() for name in ("model.safetensors", "report.md"))
    if int(state.get("epoch", 0)) >= config.train.epochs and finished:
        raise RunError(
            f"{out} is finished ({config.train.epochs} of {config.train.epochs} epochs, model saved); nothing to "
            f"resume and nothing was changed: evaluate it with `foodvit evaluate {out}`, "
            "or train more in a new run with --out"
        )
    if data:
        started = config.data.source or "the default source"
        given = str(DataSource.parse(str(data)).absolute())  # stored as a new run stores it
        said = f"data: {given} (given with --resume; the run started with {started})"
        config = replace(config, data=replace(config.data, source=given))
    elif config.data.source:
        said = f"data: {config.data.source} (stored with the run)"
    else:  # a run whose config.json stores "" for the default source
        config = with_source(config)
        said = f"data: {config.data.source} (the run stored no source: the default source, as it is set here)"
    if not quiet:
        logger.info(said)
    return config, state


def check_same_data(state: dict, classes, counts: dict, root: Path) -> None:
    """A checkpoint resumes only on the photos it was trained on: the same classes and counts, in all and a class
    (a checkpoint that records the totals alone is checked on those)."""
    if list(state["classes"]) != list(classes):
        raise RunError(
            f"the checkpoint was trained on classes {state['classes']}, the data in {root} has "
            f"{list(classes)}; resume with the run's own data (--data) or start a new run"
        )
    photos = state.get("photos")
    if photos is None:
        return
    if any(photos[key] != counts[key] for key in ("train", "test")):
        raise RunError(
            f"the run was trained on {photos['train']} train / {photos['test']} test photos, the data in "
            f"{root} has {counts['train']} / {counts['test']}; resume with the same photos, or start a new run"
        )
    for split in ("train", "test"):  # the same totals, a photo moved from one class to another
        was, now = photos.get(f"{split}_by_class"), counts[f"{split}_by_class"]
        if was is not None and list(was) != list(now):
            differ = ", ".join(f"{c} {a} -> {b}" for c, a, b in zip(classes, was, now, strict=True) if a != b)
            raise RunError(
                f"the run was trained on other {split} photos a class than the data in {root} holds ({differ}); "
                "resume with the same photos, or start a new run"
            )


def resume_command(out: Path) -> str:
    """How to continue a run, in the launcher it was started with."""
    if place().world_size > 1:
        return f"resume with `torchrun --nproc_per_node N -m foodvit train --resume {out}` (any number of processes)"
    return f"resume with `foodvit train --resume {out}`"
