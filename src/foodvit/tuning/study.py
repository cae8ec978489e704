"""A study's folder and what it is: STUDY/study.json names the photos (their fingerprint), folds,
seeds and settings of a `foodvit cv` or `foodvit tune` study. Opening a folder makes it that study or
checks that it already is one; a study asked to borrow another's CNN teachers checks that the lender
is a study of the same photos, folds and seeds that trained the teachers this one would train. The arithmetic its
runs train in (bf16 or float32, on which device kind) is one for the whole study: STUDY/arithmetic.json, written by
the first process that trains, and each run's result.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from filelock import FileLock

from foodvit.errors import StudyError
from foodvit.files import read_json, write_text
from foodvit.rundir.compare import differences
from foodvit.rundir.directory import TEACHER_FILE
from foodvit.settings.layout import setting_key
from foodvit.settings.run import RunConfig, settings_sectioned
from foodvit.tuning.compare import result_files
from foodvit.tuning.fold import FoldBusy, fold_lock, result_path, stages_file
from foodvit.tuning.folds import Unit, fold_name, run_name

STUDY_FILE = "study.json"
TRIAL_FILE = "trial.json"  # a tuning trial's folder: the settings its folds train with


# section -> the settings no fold's result depends on
IDLE_SETTINGS = {"data": ("source", "validate_on"), "train": ("eval_every",)}


def study_settings(settings: dict) -> dict:
    """A config's settings as a study names its recipe: without the photos' folders (a study names its
    photos, and its validation pool's, by their fingerprint, so a moved copy of them is the same study) nor how
    often a run evaluates (a fold evaluates once, at its end: fold.fold_config), so that a study resumes under a
    recipe that evaluates more or less often."""
    return {
        section: {k: v for k, v in values.items() if k not in IDLE_SETTINGS[section]}
        if section in IDLE_SETTINGS and isinstance(values, dict)
        else values
        for section, values in settings.items()
    }


def read_identity(path: Path) -> dict | None:
    """What a study file (study.json, a trial's trial.json) says the folder holds; None when absent.
    A folder, unreadable text or anything but a JSON object there is a StudyError that says so."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        stored = read_json(path)
    except (OSError, ValueError) as err:
        why = "a folder" if path.is_dir() else f"not readable ({getattr(err, 'strerror', None) or err})"
        raise StudyError(
            f"{path} is {why}, not the file foodvit writes there: the folder's study cannot be read; "
            "choose a new --out (or restore the file)"
        ) from None
    if not isinstance(stored, dict):
        raise StudyError(
            f"{path} holds {type(stored).__name__} where foodvit writes a JSON object: the folder's study "
            "cannot be read; choose a new --out (or restore the file)"
        )
    return current_names(stored)


def current_names(stored: dict) -> dict:
    """A study's identity as it was written (study.json, a trial's trial.json, a database's note of its study) with
    its settings and its search space named as this version names them."""
    stored = dict(stored)
    if isinstance(stored.get("settings"), dict):
        stored["settings"] = study_settings(settings_sectioned(stored["settings"]))
    if isinstance(stored.get("space"), dict):  # a search space's settings as this version names them
        stored["space"] = {setting_key(key): param for key, param in stored["space"].items()}
    return stored


def changes(stored: dict, identity: dict) -> str:
    """The first few differences of two identities, as a message shows them ('' when the same)."""
    changed = differences(stored, identity)
    return "; ".join(f"{key}: {a!r} -> {b!r}" for key, a, b in changed[:4])


def check_folder(folder: Path) -> None:
    """A study folder's path is a folder or a new path: a file there, or above it, is refused in one line."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise StudyError(f"{blocker} is a file; a study is a folder: choose a new or empty folder for --out")


def check_outside(folder: Path, photos: Path) -> None:
    """A StudyError, before any work, when a study's folder is or would be among the class folders of the photos it
    trains on (`photos`, the folder of class folders): its fold runs' links would be read as photos of a class named
    after it, by this study and every later command on that data."""
    inside, classes = Path(os.path.abspath(folder)), Path(os.path.abspath(photos))
    if inside == classes or classes in inside.parents:
        raise StudyError(
            f"--out {folder} is inside {photos}, the folder of the class folders it trains on: its files would be "
            "read as photos of a class; choose a folder outside it"
        )


def open_study(folder: Path, identity: dict, *, grow: str | None = None) -> list[int] | None:
    """Make folder a study of `identity`, or check that it already is one: another data set,
    folds, seeds or settings are refused, never mixed in (settings added to foodvit since the study
    started count at their defaults). grow: the arithmetic this process trains in (study.training_arithmetic), given
    when the study may grow: one that differs only in holding fewer seeds, each of them among identity's, grows to
    identity's seeds (grow_study). Returns the seeds it held before (None when it did not grow)."""
    check_folder(folder)
    path = folder / STUDY_FILE
    stored = read_identity(path)
    if stored is not None:
        if (folder / GROWING_FILE).exists():
            _finish_growing(folder)
        held = stored.get("seeds")
        if grow is not None and isinstance(held, list) and held != identity["seeds"]:
            if not changes({**stored, "seeds": identity["seeds"]}, identity):
                return grow_study(folder, identity, grow)
        shown = changes(stored, identity)
        if shown:
            raise StudyError(
                f"{folder} holds a study of something else ({shown}); a study is resumed only as it started: "
                "choose another --out"
            )
        return None
    # not another starter's temporary file, nor the study another starter has just written
    if folder.is_dir() and any(not p.name.startswith(".") and p.name != STUDY_FILE for p in folder.iterdir()):
        raise StudyError(f"{folder} is not empty and holds no study; choose a new or empty --out")
    # Created only if absent: of two processes that start the same folder at once, the second checks
    # its study against the first's, never overwrites it.
    try:
        write_text(path, json.dumps(identity, indent=1), replace=False)
    except FileExistsError:
        return open_study(folder, identity, grow=grow)
    return None


SUMMARY_FILES = ("cv.json", "cv.md", "predictions.jsonl")  # a study's summary of its runs' results (cv.write_study)
GROWING_FILE = ".growing.json"  # a one-seed study's runs still to move under seed-S/ (grow_study)


def study_lock(folder: Path) -> FileLock:
    """The lock under which a study's study.json and summary change (grow_study, cv's summary)."""
    folder.mkdir(parents=True, exist_ok=True)
    return FileLock(folder / ".study.lock")


def grown_since(folder: Path, seeds: list[int]) -> list[int] | None:
    """The seeds the study holds now when another process has grown it beyond `seeds` (the seeds this process
    started with), else None."""
    now = held_seeds(folder)
    return now if now is not None and now != seeds else None


def held_seeds(folder: Path) -> list[int] | None:
    """The seeds the study's study.json names now (None when it names none, or cannot be read)."""
    try:
        seeds = read_json(folder / STUDY_FILE).get("seeds")
    except (OSError, ValueError, AttributeError):
        return None
    return seeds if isinstance(seeds, list) else None


def grown_run(run: Path) -> Path | None:
    """Where a one-seed study's fold run (STUDY/fold-K) is now that the study has grown to several seeds and keeps
    it as seed-S/fold-K, or None when `run` is there or is no such run: a path written down before the growth
    still leads to the run."""
    fold = run.name.removeprefix("fold-")
    if run.exists() or not fold.isdigit() or run.name != fold_name(0, int(fold), 1):  # named as a one-seed study does
        return None
    for seed in held_seeds(run.parent) or []:
        moved = run.parent / fold_name(seed, int(fold), 2)
        if moved.is_dir():
            return moved
    return None


def grow_study(folder: Path, identity: dict, here: str) -> list[int]:
    """A study grown by more seeds: `foodvit cv` with a larger --seeds (the same settings, photos and folds) keeps the
    runs of the seeds the study holds and trains the new ones, so a comparison that needs more seeds costs only those.
    Refused, with nothing changed, for fewer or other seeds, or on a machine of another arithmetic than the study's
    (`here`, against its arithmetic.json). The study's summary (cv.json, cv.md, predictions.jsonl) is removed: it spoke
    for the seeds it held, and the grown study's is written once every seed has its result. A study of one seed of
    folds names its runs fold-K and a study of several seeds seed-S/fold-K (folds.fold_name): the first seed's runs
    move there under every fold's lock (refused while another process runs one of them). The grown study.json is
    written before they move, and what is left to move is noted (GROWING_FILE) until it has, so a growth cut short
    is finished by the next process that opens the study, and a one-seed command meanwhile is refused, never
    trains those folds again. Returns the seeds it held."""
    with study_lock(folder):
        _finish_growing_locked(folder)  # a growth cut short (this process looked before its note was written)
        stored = read_identity(folder / STUDY_FILE) or {}
        held, wanted = stored.get("seeds"), identity["seeds"]
        if held == wanted:  # another process grew it meanwhile
            return held
        if not isinstance(held, list):
            raise StudyError(
                f"{folder} holds a study that names no seeds; a study is resumed only as it started: "
                "choose another --out"
            )
        if not set(held) < set(wanted):
            raise StudyError(
                f"{folder} holds a study of seeds {held} and this asks for seeds {wanted}; a study keeps the seeds it "
                f"holds: --seed {held[0]} --seeds {len(held)} resumes it, a larger --seeds grows it; for other seeds "
                "choose another --out"
            )
        # the study's arithmetic (its claim, else its results') before anything changes
        written = (_written_arithmetic(path) for path in result_files(folder))
        theirs = claimed(folder) or next((kind for kind in written if kind), None)
        if theirs is not None and theirs != here:
            raise StudyError(
                f"{folder} trains in {theirs} and this machine would train its new seeds in {here}; a study trains "
                f"every run in one arithmetic: {_finish(theirs, here)}"
            )
        one_seed = stored.get("kind") == "cv" and len(held) == 1
        folds = int(stored.get("folds", 0) or 0)
        missing = [name for name in _held_runs(stored) if not result_path(folder / name).is_file()]
        if missing and (folder / "cv.json").is_file():
            raise StudyError(
                f"{folder} holds the summary of seeds {', '.join(map(str, held))} but not their runs' results "
                f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}.json), as a study kept for its "
                "answers alone does: growing it would train them again; grow the study where its runs are"
            )
        with contextlib.ExitStack() as held_folds:
            if one_seed:
                _take_folds(folder, held[0], folds, held_folds)
            for name in SUMMARY_FILES:  # first: a summary of fewer seeds never outlives the growth
                (folder / name).unlink(missing_ok=True)
            if one_seed:
                write_text(folder / GROWING_FILE, json.dumps({"seed": held[0], "folds": folds}))
            write_text(folder / STUDY_FILE, json.dumps(identity, indent=1))
            if one_seed:
                _move_first_seed(folder, held[0], folds)
        return held


def _held_runs(stored: dict) -> list[str]:
    """The names of the runs a study of `stored` (its study.json) holds: seed-S in a pool study, else
    folds.fold_name's."""
    seeds, pool = stored.get("seeds") or [], stored.get("kind") == "pool"
    folds = 1 if pool else int(stored.get("folds", 0) or 0)
    return [run_name(seed, fold, len(seeds), pool) for seed in seeds for fold in range(folds)]


def _take_folds(folder: Path, seed: int, folds: int, stack: contextlib.ExitStack) -> None:
    """Every fold lock of a one-seed study's runs, held until `stack` closes; a StudyError when another process runs
    one of them."""
    for k in range(folds):
        try:
            stack.enter_context(fold_lock(folder / fold_name(seed, k, 1)))
        except FoldBusy:
            raise StudyError(
                f"{folder / fold_name(seed, k, 1)} is being run by another process; a study grows by seeds once "
                "no fold of it is running: run the command again when it has finished (or stopped)"
            ) from None


def _move_first_seed(folder: Path, seed: int, folds: int) -> None:
    """A one-seed study's fold runs (fold-K, fold-K.json, .fold-K.stages.json) moved where a study of several seeds
    keeps them (seed-S/), with its fold locks held; what has moved already is left (a growth cut short, finished
    now). The note of what is left to move goes once all has."""
    for k in range(folds):
        for where in (lambda run: run, result_path, stages_file):
            source, target = where(folder / fold_name(seed, k, 1)), where(folder / fold_name(seed, k, 2))
            if not source.exists():
                continue
            if target.exists():
                raise StudyError(
                    f"{target} and {source} are both there: a grown study keeps its first seed's run in "
                    f"{target.parent}; keep the one whose fold-{k}.json holds a result (or the newer), move the other "
                    "away, and run the study again"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            source.rename(target)
    (folder / GROWING_FILE).unlink(missing_ok=True)


def _finish_growing(folder: Path) -> None:
    """A growth cut short after its study.json: the first seed's runs still to move (GROWING_FILE), moved now; a note
    whose study.json still names one seed (cut short before it was written) is dropped."""
    with study_lock(folder):
        _finish_growing_locked(folder)


def _finish_growing_locked(folder: Path) -> None:
    """_finish_growing with the study's lock held."""
    with contextlib.ExitStack() as held_folds:
        try:
            note = read_json(folder / GROWING_FILE)
            seed, folds = int(note["seed"]), int(note["folds"])
        except FileNotFoundError:
            return  # none, or another process finished it
        except (OSError, ValueError, KeyError, TypeError):
            raise StudyError(
                f"{folder / GROWING_FILE} is damaged (not the note foodvit writes while a study grows); move the "
                f"study's first seed's runs (fold-K/ and fold-K.json) into the folder seed-S/ of that seed beside "
                "them, remove the note, and run the study again"
            ) from None
        if len(held_seeds(folder) or []) < 2:
            (folder / GROWING_FILE).unlink(missing_ok=True)
            return
        _take_folds(folder, seed, folds, held_folds)
        _move_first_seed(folder, seed, folds)


def bind_trial(folder: Path, identity: dict, what: str) -> None:
    """Bind a tuning trial's folder to the settings its folds train with (folder/trial.json), or check
    that it is bound to these: folds trained under other settings are never reported under these."""
    if folder.exists() and not folder.is_dir():
        raise StudyError(
            f"{folder} is a file where {what}'s folder of folds belongs; move it away, or choose a new --out"
        )
    path = folder / TRIAL_FILE
    stored = read_identity(path)
    if stored is None:
        if folder.is_dir() and any(not p.name.startswith(".") for p in folder.iterdir()):
            raise StudyError(
                f"{folder} holds folds with no record of the settings they trained with, so they cannot be "
                f"reported as {what}'s; choose a new --out for the study"
            )
        write_text(path, json.dumps(identity, indent=1))
        return
    shown = changes(stored, identity)
    if shown:
        raise StudyError(
            f"{folder} holds folds trained with other settings than {what}'s ({shown}): the study's database "
            "does not match its folders; restore the study's own database, or choose a new --out"
        )


def check_lender(teachers: Path, study: Path, identity: dict, config: RunConfig) -> None:
    """A study may lend its CNN teachers to this one when its photos and folds are this study's, it holds some of this
    study's seeds (lender_run: the runs of those seeds lend theirs), and its recipe trains teachers with this config's
    teacher settings; else a StudyError that says why."""
    from foodvit.training.distributed import pick_device
    from foodvit.training.teacher import place_changes, read_teacher, teacher_changes, training_place, trains_teacher

    path = teachers / STUDY_FILE
    if teachers.resolve() == study.resolve():
        raise StudyError(
            f"--teachers {teachers} is the study itself: give another study, whose folds lend their teachers"
        )
    try:
        theirs = read_json(path)
        lender = RunConfig.from_dict(theirs["settings"], where=str(path))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise StudyError(
            f"--teachers {teachers} holds no readable study ({STUDY_FILE}: {err}): give a `foodvit cv` study "
            "of a distilled or guided recipe"
        ) from None
    if not trains_teacher(config):
        raise StudyError(
            "--teachers lends CNN teachers, and this recipe trains none (no --distill or --guidance): leave "
            "--teachers out"
        )
    if not trains_teacher(lender):
        raise StudyError(
            f"--teachers {teachers} is a study of a recipe that trains no CNN teacher: give a study with --guidance "
            "or --distill, or leave --teachers out"
        )
    changed = [
        f"{key}: {theirs.get(key)!r} there, {identity[key]!r} here"
        for key in ("kind", "data", "classes", "folds", "validation")
        if theirs.get(key) != identity.get(key)
    ]
    if not set(theirs.get("seeds") or []) & set(identity["seeds"]):  # a lender lends the seeds both studies hold
        changed.append(f"seeds: {theirs.get('seeds')!r} there, {identity['seeds']!r} here")
    if changed:
        raise StudyError(
            f"--teachers {teachers} is a study of other photos, folds or seeds ({'; '.join(changed)}): give a "
            "`foodvit cv` study with the same --data and --folds and some of these seeds, or leave --teachers out"
        )
    shown = teacher_changes(lender, config)
    if shown:
        raise StudyError(
            f"--teachers {teachers} trained its CNN teachers with other settings ({shown}): they are not the "
            "teachers this study would train; leave --teachers out"
        )
    # where they trained (fold runs only, not the folds' photo links): refused here when no teacher was trained
    # where this process trains; a study whose folds trained at different thread counts (one-thread workers
    # beside a two-thread one) lends each fold's teacher to a process like the one that trained it, which
    # each fold checks as it starts (training.teacher.lent_teacher)
    here = training_place(pick_device(config.train.device), 1, config)
    first = None  # the first teacher trained elsewhere, and how; the teachers are read until one serves here
    runs = [f"fold-*/{TEACHER_FILE}", f"seed-*/fold-*/{TEACHER_FILE}", f"seed-*/{TEACHER_FILE}"]  # a pool study's too
    for path in sorted(path for pattern in runs for path in teachers.glob(pattern)):
        # a file the glob found: read_teacher gives its state (None is for a missing file)
        where = place_changes(
            (read_teacher(path, lender.teacher.architecture, lent=True) or {}).get("trained_on"), here
        )
        if not where:
            return
        first = first or (path, where)
    if first is not None:
        raise StudyError(
            f"--teachers {teachers} trained its CNN teachers elsewhere ({first[0]}: {first[1]}): they are not the "
            "teachers this study would train; leave --teachers out"
        )


def lender_run(teachers: Path | None, unit: Unit) -> Path | None:
    """The run of study `teachers` that lends `unit` its trained CNN teacher: the lender's run of the unit's seed and
    fold, named as the lender names its runs (a lender of one seed of folds: fold-K); None when it has no such run
    with a trained teacher yet (the unit then trains its own)."""
    if teachers is None:
        return None
    try:
        lender = read_identity(teachers / STUDY_FILE) or {}
    except StudyError:
        lender = {}
    seeds = lender.get("seeds")
    if isinstance(seeds, list) and unit.seed not in seeds:
        return None
    # a folder that does not say its seeds (check_lender refuses one as a lender): the unit's own name
    run = teachers / (
        run_name(unit.seed, unit.fold, len(seeds), lender.get("kind") == "pool")
        if isinstance(seeds, list)
        else unit.name
    )
    return run if (run / TEACHER_FILE).is_file() else None


# ------------------------------------------------------------------ the arithmetic a study's runs train in

ARITHMETIC_FILE = "arithmetic.json"  # the arithmetic a study's runs train in, written by its first training process

# where a study's runs train in each arithmetic (engine.arithmetic; its --amp is the study's: on, a CPU trains in bf16
# only where it has native bf16; off, every device trains in float32)
ARITHMETIC_WHERE = {
    "bf16 on cpu": "on a CPU with native bf16 (AVX512-BF16 or AMX)",
    "float32 on cpu": "on a CPU that trains in float32 (without native bf16; on a GPU machine, CUDA_VISIBLE_DEVICES=)",
    "bf16 on cuda": "on a CUDA GPU",
    "float32 on cuda": "on a CUDA GPU",
}


def check_arithmetic(study: Path, units: list[Unit], todo: list[Unit], config: RunConfig) -> None:
    """Before `todo` (some of the study's `units`) train: the study trains every run in one arithmetic
    (engine.arithmetic, e.g. "bf16 on cpu"). One seed trained in bf16 and in float32, or on a CPU and on a GPU, gives
    two different models, so a study that machines of two kinds share, or that is resumed on another machine, would
    silently mix two recipes. The first process with runs to train claims the study's arithmetic (arithmetic.json,
    created only if absent); a process that would train in another is refused, as it is where the study's written
    results (all of them, whatever `todo` holds) are of another arithmetic. A StudyError says which and what to do."""
    written = {u.name: _written_arithmetic(result_path(study / u.name)) for u in units}
    known = {name: kind for name, kind in written.items() if kind}
    if not any(written[u.name] is None for u in todo):
        one_arithmetic(study, known, None)
        return
    here = training_arithmetic(config)
    one_arithmetic(study, known, here)
    claim_arithmetic(study, here, trained=any(kind is not None for kind in written.values()))


def _written_arithmetic(path: Path) -> str | None:
    """A run's written result's arithmetic: None when there is no result (its run is left to train), "" when the
    result does not say (written before foodvit recorded it, or damaged: run_fold scores it again)."""
    if not path.is_file():
        return None
    try:
        kind = read_json(path).get("arithmetic")
    except (OSError, ValueError, AttributeError):
        return ""
    return known_arithmetic(kind)


def known_arithmetic(kind) -> str:
    """A recorded arithmetic as engine.arithmetic names it ("bf16 on cpu"), else "" (not known): a bare "bf16" or
    "float32", as foodvit first recorded it without the device, is read as unknown rather than as another kind."""
    return kind if isinstance(kind, str) and " on " in kind else ""


def claim_arithmetic(study: Path, here: str, trained: bool = True) -> None:
    """The study's arithmetic written if no process has written it, else checked against `here`. trained: whether any
    run of the study has a result (else a claim of another arithmetic may be a start that trained nothing)."""
    path = study / ARITHMETIC_FILE
    study.mkdir(parents=True, exist_ok=True)
    try:
        write_text(path, json.dumps({"arithmetic": here}), replace=False)
        return
    except FileExistsError:
        pass
    theirs = claimed(study)
    if theirs is None:
        raise StudyError(
            f"{path} is damaged (not the arithmetic foodvit writes there); remove it, and the next run claims the "
            "study's arithmetic again (its written results are checked all the same)"
        )
    if theirs != here:
        unstarted = "" if trained else f" (if none of its runs has trained yet, remove {study / ARITHMETIC_FILE})"
        raise StudyError(
            f"{study} trains in {theirs} ({ARITHMETIC_FILE}, from the first process that started it) and this machine "
            f"would train in {here}; a study trains every run in one arithmetic: {_finish(theirs, here)}{unstarted}"
        )


def claimed(study: Path) -> str | None:
    """The arithmetic the study's arithmetic.json names; None when it names none (absent or damaged)."""
    try:
        kind = read_json(study / ARITHMETIC_FILE)["arithmetic"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return kind if isinstance(kind, str) else None


def one_arithmetic(study: Path, written: dict[str, str], here: str | None) -> None:
    """A StudyError when the study's written results (run name -> arithmetic) are of two arithmetics, or of one other
    than `here`, the arithmetic this process would train its runs left in (None: none left)."""
    kinds: dict[str, list[str]] = {}
    for name, kind in written.items():
        kinds.setdefault(kind, []).append(name)
    if len(kinds) > 1:
        # the runs to keep: those of the study's claimed arithmetic, else those of the most runs
        keep = claimed(study)
        (a, a_names), *others = sorted(kinds.items(), key=lambda item: (item[0] != keep, -len(item[1])))
        shown = "; ".join(f"{', '.join(names)} in {kind}" for kind, names in others)
        remove = " and ".join(f"{study / n} with {study / n}.json" for _, names in others for n in names)
        raise StudyError(
            f"{study} mixes arithmetic: {', '.join(a_names)} trained in {a}, {shown}; a study trains every run in "
            f"one: remove {remove} and run the study again {ARITHMETIC_WHERE.get(a, f'where training runs in {a}')}"
        )
    if kinds and here is not None and here not in kinds:
        ((theirs, names),) = kinds.items()
        raise StudyError(
            f"{study}: {', '.join(names)} trained in {theirs} and this machine would train the rest in {here}; a study "
            f"trains every run in one arithmetic: {_finish(theirs, here)}"
        )


def training_arithmetic(config: RunConfig) -> str:
    """The arithmetic this machine trains `config` in (engine.arithmetic: "bf16 on cpu", "float32 on cuda", ...)."""
    from foodvit.training.distributed import pick_device
    from foodvit.training.engine import arithmetic

    return arithmetic(pick_device(config.train.device), config.train.amp)


def search_arithmetic(study_dir: Path, trials, here: str, this: int | None = None) -> None:
    """A tuning study compares its trials' accuracies, so its trials train in one arithmetic as a `cv` study's runs do
    (a search keeps one --amp and --device for all its trials: space.py): the arithmetic of its first trial that
    records one (each trial's "arithmetic" user attribute; `this`, the trial about to train, left out). A StudyError,
    before anything trains, where this machine would train in another (`here`). The study's database is what machines
    sharing a search share, so the check reads it at the start and again at each trial's: of two machines of two kinds
    that began their first trials at once, the one whose trial came second is refused at its next."""
    recorded = sorted(
        (trial.number, kind)
        for trial in trials
        if trial.number != this and (kind := known_arithmetic(trial.user_attrs.get("arithmetic"))) and _trained(trial)
    )
    if recorded and recorded[0][1] != here:
        number, kind = recorded[0]
        raise StudyError(
            f"{study_dir}: its trials train in {kind} (trial {number}, its first) and this machine would train in "
            f"{here}; a search compares its trials in one arithmetic: {_finish(kind, here)}"
        )


def _trained(trial) -> bool:
    """Whether a trial counts for its search's arithmetic: it finished a fold, or is training (one that failed before
    its first fold trained nothing, and ties the search to no arithmetic)."""
    state = getattr(getattr(trial, "state", None), "name", "RUNNING")
    return state in ("RUNNING", "COMPLETE", "PRUNED") or bool(trial.user_attrs.get("fold_accuracy"))


def _finish(theirs: str, here: str) -> str:
    """What to do about a study of another arithmetic than this machine's."""
    where = f"finish it {ARITHMETIC_WHERE.get(theirs, f'where training runs in {theirs}')}"
    if theirs.endswith(" on cpu") and here.endswith(" on cpu"):
        return where + ", or start a new study with --amp false, which trains in float32 on every CPU"
    return where
