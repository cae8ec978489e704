"""The folds of a study on several processes of this machine (`foodvit cv --jobs N`).

Each process trains one fold at a time with `threads` threads of its own; together they take the folds
from one queue (cv.train_on_processes makes it), so the cores stay busy until it is empty. The plan
splits the machine's cores: N processes x cores // N threads (never more processes than folds). A fold is run by
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
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from foodvit.errors import StudyError


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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


def _start(threads: int) -> None:
    """Each process's threads, set before it imports anything that would start a pool."""
    import torch

    torch.set_num_threads(threads)


def run_tasks(work: Callable, tasks: list[tuple], the_plan: Plan, progress: bool = False) -> None:
    """work(*task) for every task, on the plan's processes, in order of the list as processes come free; a task
    that fails stops the rest with its error. `work` must be a module's own function (the processes import it)."""
    from tqdm.auto import tqdm

    context = multiprocessing.get_context("spawn")  # fresh processes: no copy of this one's threads or open files
    with (
        ProcessPoolExecutor(
            the_plan.processes, mp_context=context, initializer=_start, initargs=(the_plan.threads,)
        ) as pool,
        tqdm(
            total=len(tasks), desc=f"folds ({the_plan.line()})", unit="fold", disable=not progress, leave=False
        ) as bar,
    ):
        futures = [pool.submit(work, *task) for task in tasks]
        try:
            for future in as_completed(futures):
                future.result()
                bar.update()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
