"""The folds of a study on several processes of this machine (`foodvit cv --jobs N`).

Each process runs one task at a time with `threads` threads of its own; together they take the tasks
from one queue (cv.train_on_processes makes it), so the cores stay busy until it is empty. The plan
splits the machine's cores: N processes x cores // N threads (never more processes than folds). A fold that
trains its CNN teacher is two tasks, the teacher's (fold.start_fold: the run started up to its first epoch, its
pre-training too if it has one), then, queued when it ends, the fold's own, which resumes the run to what one task
would have learnt: with 5 folds on 2 processes the teachers and folds pair up instead of one core idling while the
fifth fold trains (fully when a teacher costs what a ViT does, as in the default recipe). A fold is run by
fold.run_fold as in one process: its lock keeps any other process (of this study or another command) off
it, a finished fold is read rather than trained, and its CNN teacher is trained once, kept in the fold's
run (teacher.pt) or borrowed from a lender study, never trained twice.

The threads a fold trains on change its rounding: a fold trained on 1 thread is not the same run, to the
last bit, as on 2, and a teacher lent between studies must have trained on as many threads as the
borrower would (teacher.training_place). A study's --jobs (and so its threads) is best kept for the
studies that share its folds and teachers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from foodvit.errors import StudyError, Terminated
from foodvit.torchrun import cores


@dataclass(frozen=True)
class Plan:
    processes: int
    threads: int  # PyTorch threads of each process

    def line(self) -> str:
        processes, threads = ("es" if self.processes > 1 else ""), ("s" if self.threads > 1 else "")
        return f"{self.processes} process{processes} x {self.threads} thread{threads}"


def plan(jobs: int | None, tasks: int, available: int | None = None) -> Plan:
    """Processes and threads for `tasks` folds on `available` cores: `jobs` processes (default: one per
    core), never more than the folds, each with an equal share of the cores (at least one)."""
    available = available or cores()
    if jobs is not None and jobs < 1:
        raise StudyError(f"--jobs must be 1 or more (processes training folds at once), got {jobs}")
    wanted = jobs if jobs is not None else available
    processes = max(1, min(wanted, tasks))
    return Plan(processes, max(1, available // wanted))


@contextlib.contextmanager
def fold_threads(jobs: int | None):
    """Within the block, this process's PyTorch threads are those a fold of `jobs` processes trains on (as it was
    for jobs 1): what a lender's teachers are checked against (study.check_lender)."""
    import torch

    kept = torch.get_num_threads()
    if jobs != 1:
        torch.set_num_threads(plan(jobs, 1).threads)
    try:
        yield
    finally:
        torch.set_num_threads(kept)


_stop: Any = None  # in each process of run_tasks: the event that says the work has stopped
_ignored: frozenset[int] = frozenset()  # the signals the command ignores (ctrl-C, started so by its shell; SIGTERM)


def _start(threads: int, stop: Any, ignored: frozenset[int]) -> None:
    """Each process's threads, set before it imports anything that would start a pool; the work's stop event; and
    ctrl-C ignored while the process waits for a task (it stops a task, never kills a waiting process)."""
    import torch

    global _stop, _ignored
    _stop, _ignored = stop, ignored
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)


def _interrupt_once(signum: int, frame: Any) -> None:
    """ctrl-C or SIGTERM in a task: interrupted as in one process, once; a second one (the command passing on a
    signal its processes had already received) waits for the task to finish stopping."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _task(work: Callable, *task: Any) -> Any:
    """work(*task) in a process of run_tasks, unless the work has stopped (a task queued before it stopped is left
    for the next run); ctrl-C and SIGTERM interrupt it as they would in one process, unless the command ignores
    them. A process waiting for a task ignores ctrl-C and ends on SIGTERM (it holds no work)."""
    if _stop is not None and _stop.is_set():
        return None
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signum not in _ignored:
            signal.signal(signum, _interrupt_once)
    try:
        return work(*task)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN if signal.SIGTERM in _ignored else signal.SIG_DFL)


class _Signals:
    """SIGTERM to the command while run_tasks runs (in the main thread, the only one signals reach; unless the
    command ignores it): left to its default, the command would end at once and leave its processes training.
    The first raises Terminated (ctrl-C, KeyboardInterrupt); once the work is stopping (`passing_on`), any further
    one goes straight on to the processes, so that no wait for them (the grace, the pool's shutdown) is cut short
    with them still running."""

    def __init__(self, before: set[int]) -> None:
        import threading

        self.before = before  # processes that are not this work's
        main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM)
        self.ignored = frozenset(s for s in signals if signal.getsignal(s) is signal.SIG_IGN)  # the command's choice
        # the signals handled here, each with the handler it had (None: set outside Python, not restorable)
        self.handled: dict[int, Any] = dict.fromkeys(s for s in signals if main and s not in self.ignored)

    def __enter__(self) -> _Signals:
        if signal.SIGTERM in self.handled:
            self.handled[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._raise)
        if signal.SIGINT in self.handled:
            self.handled[signal.SIGINT] = signal.getsignal(signal.SIGINT)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self.handled.items():
            if previous is not None:
                signal.signal(signum, previous)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise Terminated

    def passing_on(self) -> None:
        """From now on ctrl-C and SIGTERM (those not ignored) go on to the processes, raising nothing here."""
        for signum in self.handled:
            signal.signal(signum, lambda signum, frame: self.pass_on(signum))

    def pass_on(self, signum: int) -> None:
        """`signum` sent to the work's processes still running."""
        for child in multiprocessing.active_children():
            if child.pid not in self.before and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)


GRACE_S = 3.0  # after ctrl-C or SIGTERM, how long the tasks running have to stop by themselves before being signalled


@dataclass(frozen=True)
class Task:
    """work(*args) on a process of run_tasks; `then`, when given, is queued once it has finished (a fold's training
    after its CNN teacher's, so that both cores train teachers and folds alike instead of one idling at the end)."""

    work: Callable
    args: tuple
    then: Task | None = None


def run_tasks(tasks: list[Task], the_plan: Plan, progress: bool = False, firsts: str = "first steps") -> None:
    """Every task, on the plan's processes, in order of the list as processes come free, each task's `then` queued
    when it has finished; a task that fails stops the rest with its error once the tasks running have ended (none
    starts after it), and ctrl-C stops them all (each running task interrupted as in one process, none started
    after). A task's work must be a module's own function (the processes import it). The bar counts the folds, the
    tasks that end a chain, and says how many of the chains' first tasks (`firsts`) have ended. SIGTERM stops them as
    ctrl-C does (Terminated, a KeyboardInterrupt, is raised), also when the command ignores ctrl-C."""
    from tqdm.auto import tqdm

    context = multiprocessing.get_context("spawn")  # fresh processes: no copy of this one's threads or open files
    stop = context.Event()
    chained = sum(task.then is not None for task in tasks)
    with (
        _Signals({p.pid for p in multiprocessing.active_children() if p.pid is not None}) as signals,
        ProcessPoolExecutor(
            the_plan.processes,
            mp_context=context,
            initializer=_start,
            initargs=(the_plan.threads, stop, signals.ignored),
        ) as pool,
        tqdm(
            total=len(tasks), desc=f"folds ({the_plan.line()})", unit="fold", disable=not progress, leave=False
        ) as bar,
    ):
        pending: dict = {}
        ended = 0
        try:
            for task in tasks:
                pending[pool.submit(_task, task.work, *task.args)] = task
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()  # a failure stops the rest before any follow-up of these is queued
                for future in done:
                    task = pending.pop(future)
                    if task.then is None:
                        bar.update()
                        continue
                    follow = pool.submit(_task, task.then.work, *task.then.args)
                    pending[follow] = task.then
                    ended += 1
                    bar.set_postfix_str(f"{firsts} {ended}/{chained}")
        except BaseException as error:
            signals.passing_on()  # a SIGTERM from here on stops the running tasks, while this process waits for them
            stop.set()  # a task a process has already taken from the queue is not started
            for future in pending:  # the futures not yet seen done
                future.cancel()
            if isinstance(error, KeyboardInterrupt):
                running = [f for f in pending if not f.done()]
                if wait(running, timeout=GRACE_S).not_done:  # the signal reached this process alone: pass it on
                    signals.pass_on(signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT)
            raise
