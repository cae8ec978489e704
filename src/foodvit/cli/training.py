"""`foodvit train` (a run directory from a recipe and options, or an interrupted one resumed) and
`foodvit compare` (runs side by side)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foodvit.cli.common import (
    VERBOSE,
    check_recipe,
    folder,
    number,
    recipe_options,
)
from foodvit.settings.fields import POSITIVE
from foodvit.torchrun import DEFAULT_TIMEOUT_S, place


def register(sub) -> None:
    """Add train, compare to the subcommands."""
    p = sub.add_parser(
        "train",
        help="train a model; writes a run directory with report, metrics and model",
        description="Train from a recipe (default: the best small-data recipe). Any setting can be overridden. "
        "Boolean settings are flags with a --no- form (--freeze-backbone, --no-cache); true/false also work.",
    )
    p.add_argument("--out", type=folder, help="run directory, a new or empty folder (default: runs/<date>-<time>)")
    p.add_argument(
        "--resume",
        type=folder,
        metavar="DIR",
        help="finish the interrupted run in DIR, with its own settings and data "
        "(--data: the same photos moved elsewhere)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars or per-epoch lines (the run directory and the result are still printed)",
    )
    p.add_argument("--verbose", **VERBOSE)
    p.add_argument(
        "--dist-timeout",
        type=number(POSITIVE),
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="under torchrun: how long a process waits for the others before it stops with a message (default "
        f"{DEFAULT_TIMEOUT_S})",
    )
    recipe_options(p, "a recipe name (see `foodvit recipes`) or a .toml file")
    p.set_defaults(func=cmd_train, on_interrupt=train_interrupted)

    p = sub.add_parser(
        "compare",
        help="several runs side by side: the settings that differ and the final metrics",
        description="For people without TensorBoard: each run's differing settings and its final metrics, as a table.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories written by foodvit train")
    p.set_defaults(func=cmd_compare, opens_photos=False)


def cmd_train(args: argparse.Namespace) -> int:
    from foodvit.cli.options import build_config, given_overrides
    from foodvit.errors import ConfigError
    from foodvit.rundir.directory import default_out
    from foodvit.settings.fields import flag_of
    from foodvit.settings.overrides import setting_field
    from foodvit.training.engine import silent
    from foodvit.training.run import resume, train

    main_process = place().is_main  # under torchrun, rank 0 alone speaks
    say = (lambda text: print(text, file=sys.stderr)) if main_process else silent

    if args.resume:
        extra = (
            [o for o in given_overrides(args) if o != "data.source"]
            + (["--recipe"] if args.recipe else [])
            + (["--model"] if args.model else [])
        )
        if extra or args.out:
            flags = [flag_of(setting_field(o)) if "." in o else o for o in extra] + (["--out"] if args.out else [])
            raise ConfigError(
                f"--resume continues the run exactly as configured in {args.resume}/config.json; "
                f"drop {', '.join(flags)}, or start a new run with --out (--data may point at the run's photos moved "
                "elsewhere)"
            )
        from pathlib import Path

        from foodvit.errors import RunError
        from foodvit.rundir.directory import check_is_run
        from foodvit.tuning.study import grown_run

        moved = grown_run(Path(args.resume))
        if moved is not None:
            raise RunError(
                f"{args.resume} does not exist: its study, of several seeds, keeps this run as {moved}; "
                f"continue it with foodvit train --resume {moved}"
            )
        check_is_run(Path(args.resume))  # before its name is printed as the run directory
        args.run_dir = args.resume
        say(f"run directory: {args.resume}")
        result = resume(
            args.resume,
            quiet=args.quiet,
            data=getattr(args, "data.source"),
            verbose=args.verbose,
            timeout_s=args.dist_timeout,
        )
    else:
        check_recipe(args.recipe)
        config = build_config(args.recipe or "default", args, model=args.model)
        args.run_dir = args.out or str(default_out())
        say(f"run directory: {args.run_dir}")
        result = train(config, args.run_dir, quiet=args.quiet, verbose=args.verbose, timeout_s=args.dist_timeout)
    if not main_process:
        return 0
    print(
        f"test accuracy {result.test['acc']:.3f} ({round(result.test['acc'] * result.test['n'])}/{result.test['n']} "
        "photos); "
        f"report: {result.run / 'report.md'}"
    )
    return 0


def train_interrupted(args: argparse.Namespace) -> str:
    """What an interrupted `train` kept, and how to go on."""
    where = getattr(args, "run_dir", None)  # set once the run directory is known
    if where and (Path(where) / "checkpoint.pt").exists():
        return (
            f"interrupted: every finished epoch (and stage) is saved in {where}; continue with `foodvit train "
            f"--resume {where}`"
        )
    return "interrupted before the first epoch finished: nothing was saved"


def cmd_compare(args: argparse.Namespace) -> int:
    from foodvit.rundir.compare import compare_runs

    print(compare_runs([Path(r) for r in args.runs]))
    return 0
