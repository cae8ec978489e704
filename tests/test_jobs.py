"""foodvit cv --jobs (tuning/jobs.py): the folds on several processes, each with its share of the cores; the study
the same as one process on as many threads gives; the teachers trained once a fold, borrowed, never again."""

import json
import signal
from pathlib import Path

import pytest
import torch
from helpers import make_photo_folder

from foodvit.cli.main import main
from foodvit.errors import StudyError
from foodvit.rundir.directory import load_checkpoint
from foodvit.tuning.jobs import Plan, plan

GUIDED = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "2", "--guidance", "1"]


def test_the_plan_splits_the_cores_between_the_processes():
    assert plan(None, tasks=5, available=2) == Plan(2, 1)  # a process a core
    assert plan(1, tasks=5, available=2) == Plan(1, 2)  # one process on every core
    assert plan(2, tasks=1, available=4) == Plan(1, 2)  # never more processes than folds; threads as --jobs says
    assert plan(3, tasks=6, available=2) == Plan(3, 1)  # at least a thread each
    with pytest.raises(StudyError, match="--jobs must be 1 or more"):
        plan(0, tasks=2, available=2)


@pytest.mark.slow  # three studies of two processes, each importing PyTorch; the plan stays in the fast tier
def test_jobs_give_the_study_one_process_gives_and_train_each_teacher_once(tmp_path: Path):
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    a, b, alone = tmp_path / "a", tmp_path / "b", tmp_path / "alone"
    common = ["cv", "--data", str(photos), "--folds", "2", "--quiet", *GUIDED]
    assert main([*common, "--out", str(a), "--jobs", "2"]) == 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the two processes trained
    try:
        assert main([*common, "--out", str(alone)]) == 0
    finally:
        torch.set_num_threads(threads)
    with_jobs, in_one = (json.loads((s / "cv.json").read_text()) for s in (a, alone))
    assert with_jobs["photos"] == in_one["photos"] and with_jobs["accuracy"] == in_one["accuracy"]
    for k in range(2):
        mine, theirs = (json.loads((s / f"fold-{k}.json").read_text())["predictions"] for s in (a, alone))
        assert [p["probabilities"] for p in mine] == [p["probabilities"] for p in theirs]
        assert load_checkpoint(a / f"fold-{k}" / "teacher.pt")["trained_on"]["threads"] == 1
    kept = {k: (a / f"fold-{k}" / "teacher.pt").stat().st_mtime_ns for k in range(2)}
    assert main([*common, "--out", str(a), "--jobs", "2"]) == 0  # finished: read, nothing trained again
    assert main([*common, "--out", str(b), "--jobs", "2", "--teachers", str(a)]) == 0  # borrowed, not trained
    for k in range(2):
        assert (a / f"fold-{k}" / "teacher.pt").stat().st_mtime_ns == kept[k]
        lent = load_checkpoint(b / f"fold-{k}" / "teacher.pt")
        assert (
            lent["lent_by"] == str(a / f"fold-{k}")
            and lent["history"] == load_checkpoint(a / f"fold-{k}" / "teacher.pt")["history"]
        )
    assert json.loads((b / "cv.json").read_text())["photos"] == with_jobs["photos"]
    assert not list(a.glob(".*.stages.json"))  # each teacher task's seconds went into its fold's result


def test_a_fold_is_evaluated_once_and_learns_what_an_evaluated_run_does(tmp_path: Path):
    """A fold's run evaluates its held-out photos at its end alone (the study reads nothing else of it); evaluating
    every epoch changes nothing of what a run learns."""
    import csv

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    tiny = ["--recipe", "tiny", "--epochs", "2", "--image-size", "32", "--depth", "1", "--quiet"]
    assert (
        main(["cv", "--data", str(photos), "--folds", "2", "--fold", "0", "--out", str(tmp_path / "study"), *tiny]) == 0
    )
    fold = tmp_path / "study" / "fold-0"
    assert (
        main(
            [
                "train",
                "--data",
                str(fold.parent / "folds" / "seed-42" / "fold-0"),
                "--out",
                str(tmp_path / "every"),
                *tiny,
                "--seed",
                "42",
            ]
        )
        == 0
    )

    def rows(run: Path) -> list[dict]:
        with (run / "metrics.csv").open(newline="") as f:
            return [
                {k: v for k, v in row.items() if k not in ("seconds", "images_per_s", "model_share")}
                for row in csv.DictReader(f)
            ]

    once, every = rows(fold), rows(tmp_path / "every")
    assert [r["test_acc"] != "" for r in once] == [False, True] and all(r["test_acc"] != "" for r in every)
    assert once[-1] == every[-1] and [{**r, "test_acc": "", "test_loss": ""} for r in every[:-1]] == once[:-1]


SLOW_TASK = """
import pathlib, time

def work(folder, i, seconds, cleanup):
    folder = pathlib.Path(folder)
    (folder / f"started-{i}").touch()
    try:
        for _ in range(int(seconds * 10)):
            time.sleep(0.1)
    except KeyboardInterrupt:
        time.sleep(cleanup)  # a fold's stop takes its time: a checkpoint, the loader's workers
        (folder / f"stopped-{i}").touch()
        raise
    (folder / f"finished-{i}").touch()
"""
# the grace the command gives its tasks to stop by themselves before it passes the signal on: shorter than the
# command's 3 s (jobs.GRACE_S), the same path in a sixth of the wait
GRACE_S = 0.5
# each process of run_tasks imports PyTorch only to set its threads (jobs._start) before it takes a task: for tasks
# that sleep and touch files, this stand-in, found first on the processes' path, is that import without its seconds
TORCH_STAND_IN = "threads = None\n\n\ndef set_num_threads(n):\n    global threads\n    threads = n\n"
DRIVER = """
import signal, sys
from foodvit.errors import Terminated
from foodvit.tuning import jobs
from foodvit.tuning.jobs import Plan, Task, run_tasks
from slowtask import work
folder, seconds, cleanup, ignore = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "ignore"
jobs.GRACE_S = float(sys.argv[5])
# ctrl-C as a terminal delivers it, or ignored as a shell starts a command in the background of a script, whatever
# the test runner's process passed on (an ignored or blocked SIGINT survives exec)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.SIG_IGN if ignore else signal.default_int_handler)
try:
    run_tasks([Task(work, (folder, i, seconds, cleanup)) for i in range(4)], Plan(2, 1))
except Terminated:
    sys.exit(143)
except KeyboardInterrupt:
    sys.exit(130)
"""


def interrupted(
    tmp_path: Path,
    to: str,
    seconds: float = 60,
    cleanup: float = 0,
    ignore: bool = False,
    sent: str = "SIGINT",
    times: int = 1,
):
    """Four tasks of `seconds` on two processes, ctrl-C (or the signal `sent`, `times` times half a second apart)
    sent `to` the command once two have started: its exit status, its stderr and the files the tasks left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "slowtask.py").write_text(SLOW_TASK)
    (tmp_path / "torch.py").write_text(TORCH_STAND_IN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    command = [
        sys.executable,
        "-c",
        DRIVER,
        str(tmp_path),
        str(seconds),
        str(cleanup),
        "ignore" if ignore else "-",
        str(GRACE_S),
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"started-{i}").exists() for i in (0, 1)):
            assert process.poll() is None and time.monotonic() < deadline, "the two first tasks never started"
            time.sleep(0.1)
        for _ in range(times):
            time.sleep(0.5)
            if to == "the command alone":
                process.send_signal(getattr(signal, sent))
            else:
                os.killpg(process.pid, getattr(signal, sent))
        _, errors = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, errors, sorted(p.name for p in tmp_path.glob("*-[0-9]"))


def test_a_fold_that_trains_its_teacher_queues_it_as_a_task_before_its_own(tmp_path: Path, monkeypatch):
    """Guided folds: each a chain, its teacher's task then its training; a fold whose teacher is lent, or whose run is
    under way (a checkpoint), or a recipe without a teacher: the fold's task alone."""
    import foodvit.tuning.cv as cv
    from foodvit.recipes import load_recipe
    from foodvit.rundir.directory import TEACHER_FILE
    from foodvit.settings.overrides import with_settings
    from foodvit.tuning.folds import training_photos

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    queued = {}
    monkeypatch.setattr(cv, "run_tasks", lambda tasks, plan, **kwargs: queued.setdefault("tasks", tasks))
    config = with_settings(load_recipe("tiny"), {"data.source": str(photos), "guidance.weight": 1.0})
    lender, study = tmp_path / "lender", tmp_path / "study"
    (lender / "fold-1").mkdir(parents=True)
    (lender / "fold-1" / TEACHER_FILE).touch()
    (study / "fold-2").mkdir(parents=True)
    (study / "fold-2" / "checkpoint.pt").touch()

    def queue(config, teachers=None) -> list:
        queued.clear()
        cv.train_on_processes(
            config, study, training_photos(config), folds=3, seeds=[0], teachers=teachers, only=None, jobs=2
        )
        return [(t.work.__name__, t.then.work.__name__ if t.then else None) for t in queued["tasks"]]

    chain, alone = ("_teacher_task", "_fold_task"), ("_fold_task", None)
    assert queue(config) == [chain, chain, alone]
    # each task of a one-seed study carries the check that stops it once another process has grown the study
    checks = [t.args[-1] for t in queued["tasks"]] + [t.then.args[-1] for t in queued["tasks"] if t.then]
    assert all(c.func is cv._same_seeds and c.args == (study, [0]) for c in checks) and len(checks) == 5
    assert queue(config, teachers=lender) == [chain, alone, alone]
    assert queue(with_settings(config, {"guidance.weight": 0.0})) == [alone, alone, alone]


def test_a_fold_adds_the_seconds_of_its_teachers_task_and_forgets_a_stale_record(tmp_path: Path):
    from foodvit.recipes import load_recipe
    from foodvit.settings.overrides import with_settings
    from foodvit.tuning.fold import run_fold, stages_file, start_fold
    from foodvit.tuning.folds import fold_folders, training_photos

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    settings = {"data.source": str(photos), "guidance.weight": 1.0, "vit.image_size": 32, "vit.depth": 2}
    config = with_settings(load_recipe("tiny"), {**settings, "train.epochs": 1})
    study = tmp_path / "study"
    folders = fold_folders(training_photos(config), 2, 0, study / "folds")
    start_fold(config, study / "fold-0", folders[0], seed=0)
    assert (study / "fold-0" / "checkpoint.pt").is_file() and not (study / "fold-0" / "model.json").exists()
    teacher_s = json.loads(stages_file(study / "fold-0").read_text())["seconds"]
    assert run_fold(config, study / "fold-0", folders[0], seed=0, fold=0)["seconds"] >= teacher_s > 0
    assert not stages_file(study / "fold-0").exists()
    stages_file(study / "fold-1").write_text(json.dumps({"seconds": 5000}))  # left by a start whose run was removed
    assert run_fold(config, study / "fold-1", folders[1], seed=0, fold=1)["seconds"] < 5000
    assert not stages_file(study / "fold-1").exists()


CHAIN_TASK = """
import pathlib, time
def step(folder, name):
    (pathlib.Path(folder) / f"{name}.start").write_text(repr(time.monotonic()))
    time.sleep(0.3)
    (pathlib.Path(folder) / f"{name}.end").write_text(repr(time.monotonic()))
"""


def test_a_tasks_follow_up_is_queued_when_it_ends_so_the_first_tasks_go_first(tmp_path: Path, monkeypatch):
    """cv --jobs chains each fold's training to its teacher's: no fold starts before its teacher has ended, and the
    teachers, queued first, start before any fold (the processes never wait for a teacher while a fold could run)."""
    from foodvit.tuning.jobs import Task, run_tasks

    (tmp_path / "chaintask.py").write_text(CHAIN_TASK)
    (tmp_path / "torch.py").write_text(TORCH_STAND_IN)  # this process has the real one already (sys.modules)
    monkeypatch.syspath_prepend(str(tmp_path))  # the processes import the work (and torch) from there
    from chaintask import step

    folder = str(tmp_path)
    chains = [Task(step, (folder, f"teacher-{i}"), then=Task(step, (folder, f"fold-{i}"))) for i in range(3)]
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run_tasks([*chains, Task(step, (folder, "lent"))], Plan(2, 1))
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers  # as they were before
    at = {p.name: float(p.read_text()) for p in tmp_path.iterdir() if p.suffix in (".start", ".end")}
    assert len(at) == 14  # every task started and ended
    assert all(at[f"fold-{i}.start"] >= at[f"teacher-{i}.end"] for i in range(3))
    assert max(at[f"teacher-{i}.start"] for i in range(3)) <= min(at[f"fold-{i}.start"] for i in range(3))


# Each case starts three Pythons (the command and its two processes): the fast tier keeps
# ctrl-C as a terminal sends it (to the process group) and SIGTERM to the process group; the full suite adds the
# signal sent to the command alone, a second SIGTERM, and a command that ignores ctrl-C.
@pytest.mark.parametrize(
    "to", [pytest.param("the command alone", marks=pytest.mark.slow), "its process group, as a terminal's ctrl-C"]
)
def test_ctrl_c_stops_the_running_tasks_and_starts_no_other(tmp_path: Path, to: str):
    """The command ends within seconds, the two running tasks are interrupted, and the tasks the processes had
    queued never start; a task that takes longer than the grace to stop is not interrupted a second time in its
    stopping."""
    status, errors, left = interrupted(tmp_path, to, cleanup=GRACE_S + 1)
    assert status == 130, errors
    assert left == ["started-0", "started-1", "stopped-0", "stopped-1"]
    assert "Traceback" not in errors


@pytest.mark.parametrize(
    ("to", "ignore", "times"),
    [
        pytest.param("the command alone", True, 1, marks=pytest.mark.slow),
        ("its process group", False, 1),
        pytest.param("the command alone", False, 2, marks=pytest.mark.slow),
    ],
)
def test_sigterm_stops_the_running_tasks_as_ctrl_c_does(tmp_path: Path, to: str, ignore: bool, times: int):
    """kill (or a scheduler stopping the command) ends it as interrupted, with its processes: none is left training,
    whether the command ignores ctrl-C or not, and a second kill while the tasks stop still reaches them."""
    status, errors, left = interrupted(tmp_path, to, cleanup=GRACE_S + 1, ignore=ignore, sent="SIGTERM", times=times)
    assert status == 143, errors  # Terminated: the command says it was stopped by SIGTERM
    assert left == ["started-0", "started-1", "stopped-0", "stopped-1"]
    assert "Traceback" not in errors


@pytest.mark.slow  # three Pythons; the fast tier keeps the interrupted cases above
def test_a_command_that_ignores_ctrl_c_runs_its_tasks_to_the_end(tmp_path: Path):
    status, errors, left = interrupted(tmp_path, "its process group", seconds=2, ignore=True)
    assert status == 0, errors
    assert left == [f"{state}-{i}" for state in ("finished", "started") for i in range(4)]
