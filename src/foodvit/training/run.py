"""`foodvit train` and `foodvit train --resume`: a run started in a new folder, or resumed from its last
checkpoint, on one process or on many (torchrun): the processes' context, the run directory's lock and
the messages around the Trainer (trainer.py) that does the work.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

from foodvit.errors import RunError
from foodvit.files import write_text
from foodvit.model.resolve import resolve
from foodvit.model.variants import run_model_config
from foodvit.rundir import directory as rundir
from foodvit.settings.run import RunConfig
from foodvit.torchrun import DEFAULT_TIMEOUT_S
from foodvit.training.distributed import Context, OnMain
from foodvit.training.engine import silent
from foodvit.training.report import size_note
from foodvit.training.teacher import borrowed_teacher, trains_teacher
from foodvit.training.trainer import Result, Trainer

logger = logging.getLogger(__name__)


def train(
    config: RunConfig | str | Path,
    out: str | Path | None = None,
    *,
    overrides: dict | None = None,
    model: str | None = None,
    quiet: bool = False,
    log=print,
    verbose: bool = False,
    context: Context | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    teacher_from: Path | None = None,
) -> Result:
    """Start a new run in `out` (a new or empty folder; default runs/<date>-<time>). `config`: a RunConfig,
    or a recipe (a built-in name or a TOML file) resolved with `overrides` ("section.name" -> value) and
    `model` as `foodvit train` resolves its options (model/resolve.py). With pre-trained weights, the
    model is the one the weights dictate (pretrained.adapt_config).
    Under torchrun every rank calls this with the same arguments; rank 0 writes the run.
    teacher_from: a distilled or guided run on the same photos whose CNN teacher this run borrows
    instead of training it (checked to have this run's teacher settings; the photos are the caller's word)."""
    if not isinstance(config, RunConfig):
        config = resolve(str(config), overrides, model=model)
    out = Path(out) if out else rundir.default_out()
    with (
        memory_named(config),
        _started(
            config,
            out,
            quiet=quiet,
            log=log,
            verbose=verbose,
            context=context,
            timeout_s=timeout_s,
            teacher_from=teacher_from,
        ) as trainer,
    ):
        return trainer.fit()


def train_stages(config: RunConfig, out: str | Path, *, quiet: bool = True, log=print) -> None:
    """Start a new run in `out` as train() does, but train only its stages before the epochs (its CNN teacher, its
    pre-training) and stop: the run is left resumable from its first epoch, and `resume` then trains exactly what
    train() would have (`foodvit cv --jobs` trains a fold's teacher as a task of its own this way)."""
    with memory_named(config), _started(config, Path(out), quiet=quiet, log=log) as trainer:
        trainer.stages()


@contextlib.contextmanager
def _started(
    config: RunConfig,
    out: Path,
    *,
    quiet: bool,
    log,
    verbose: bool = False,
    context: Context | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    teacher_from: Path | None = None,
):
    """The Trainer of a new run in `out`: its photos' source made absolute and its model the one pre-trained weights
    dictate (pretrained.adapt_config), its processes joined, its folder taken and its config.json written."""
    config = rundir.with_source(config)
    if config.train.pretrained:
        from foodvit.model.pretrained import adapt_config

        config = adapt_config(config)
    teacher_file = borrowed_teacher(teacher_from, config) if teacher_from is not None else None
    with (
        contextlib.nullcontext(context) if context else Context.from_environment(config.train.device, timeout_s) as ctx
    ):
        log = log if ctx.is_main else silent
        with OnMain(rundir.NewRunDirectory(out), ctx):
            if ctx.is_main:
                write_text(out / "config.json", config.to_json())
            trainer = Trainer(
                config, out, quiet=quiet, log=log, verbose=verbose, context=ctx, teacher_file=teacher_file
            )
            warning = size_note(config, sum(p.numel() for p in trainer.trained.parameters()), trainer.device)
            if warning and ctx.is_main:
                logger.warning(warning)
            processes = f" on {ctx.world_size} processes" if ctx.distributed else ""
            if not quiet and ctx.is_main:
                logger.info(
                    "training %s (%s recipe) on %s: %d train / %d test photos, classes %s%s; run directory %s",
                    config.model,
                    config.recipe,
                    trainer.data.root,
                    len(trainer.data.train),
                    len(trainer.data.test),
                    ", ".join(trainer.classes),
                    processes,
                    out,
                )
            yield trainer


def resume(
    out: str | Path,
    *,
    quiet: bool = False,
    log=print,
    data: str | None = None,
    verbose: bool = False,
    context: Context | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Result:
    """Finish the run in `out` from its last checkpoint, exactly as configured when it started, on
    as many processes as given (rank 0 reads the run and hands it to the others).

    The photos come from the source stored with the run; `data` points at the same photos moved
    elsewhere (same classes and number of photos, checked)."""
    out = Path(out)
    with (
        contextlib.nullcontext(context)
        if context
        else Context.from_environment(rundir.stored_device(out), timeout_s) as ctx
    ):
        log = silent if quiet or not ctx.is_main else log
        ctx.on_main(rundir.check_is_run, out)
        with OnMain(rundir.RunLock(out), ctx):
            config, state = ctx.on_main(rundir.read_for_resume, out, data, quiet) or (None, None)
            if ctx.distributed:
                config, state = ctx.broadcast((config, state))
            assert config is not None and state is not None  # rank 0 read them (or raised); the others got them
            with memory_named(config):
                trainer = Trainer(config, out, quiet=quiet, log=log, saved=state, verbose=verbose, context=ctx)
                trainer.restore(state)
                if data and ctx.is_main:
                    write_text(out / "config.json", config.to_json())
                if not quiet and ctx.is_main:
                    processes = f" on {ctx.world_size} processes" if ctx.distributed else ""
                    logger.info(
                        "resuming %s after epoch %d of %d%s", out, trainer.start_epoch, config.train.epochs, processes
                    )
                return trainer.fit()


# what PyTorch's allocators say when memory runs out: on the CPU, "DefaultCPUAllocator: can't allocate memory: you tried
# to allocate 120000000768 bytes" ("not enough memory" on Windows); CUDA's and MPS's, "out of memory. Tried to allocate
# 2.00 GiB"
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "not enough memory")
ALLOCATION = re.compile(r"allocate (\d+) bytes|[Tt]ried to allocate ([\d.]+ ?[KMGT]i?B)")


def allocation(err: BaseException) -> str | None:
    """How much an allocation that memory could not hold asked for ("" where the error does not say), or None
    when err is not memory running out."""
    if not isinstance(err, MemoryError) and not (
        isinstance(err, RuntimeError) and any(words in str(err) for words in OUT_OF_MEMORY)
    ):
        return None
    found = ALLOCATION.search(str(err))
    if found is None:
        return ""
    return f"{int(found[1]) / 1e9:.1f} GB" if found[1] else found[2]


@contextlib.contextmanager
def memory_named(config: RunConfig):
    """Memory running out while a run is made or trained, as a RunError naming the sides it trains at and which
    to lower, rather than the allocator's traceback; every other error as it is."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        asked = allocation(err)
        if asked is None:
            raise
        sides = {"--image-size": run_model_config(config).image_size}
        sides |= {"--start-size": config.data.start_size, "--test-size": config.data.test_size}
        if trains_teacher(config):
            sides["--teacher-size"] = config.teacher.size
        sides = {flag: side for flag, side in sides.items() if side}
        largest = max(sides, key=lambda flag: sides[flag])
        patches = " (or raise --patch-size: fewer, larger patches)" if largest == "--image-size" else ""
        raise RunError(
            f"ran out of memory{f' (an allocation of {asked})' if asked else ''} training {config.model} at "
            f"{', '.join(f'{flag} {side}' for flag, side in sides.items())} with --batch-size "
            f"{config.train.batch_size}: lower {largest}{patches}, or --batch-size"
        ) from None
