"""`foodvit cv` (k-fold cross-validation of a recipe over the training photos) and `foodvit tune`
(an Optuna search scored by cv): the shells over tuning/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foodvit.cli.common import (
    check_recipe,
    count,
    folder,
    need,
    recipe_options,
)
from foodvit.settings.fields import AT_LEAST_0, Range

FOLDS = 5  # cv's --folds when not given
MAX_SEEDS = 100  # cv's --seeds at most: a decision rests on a dozen or so, and each seed trains every fold


def register(sub) -> None:
    """Add cv, tune to the subcommands."""
    for add in (_add_cv, _add_tune):
        add(sub)


def _add_cv(sub) -> None:
    """The parser of `foodvit cv`."""
    p = sub.add_parser(
        "cv",
        help="k-fold cross-validation of a recipe over the training photos alone (never the test split)",
        description="Each fold is a normal run inside STUDY (STUDY/fold-0, ...; STUDY/seed-S/fold-0, ... with "
        "several seeds) trained on the other folds and "
        "scored on its own; every held-out photo's prediction is kept. With --validate-on POOL, a pool study "
        "instead: one run a seed (STUDY/seed-0, ...) on every training photo, scored on the pool's photos (those "
        "whose content is also in the training data dropped and counted). Writes STUDY/cv.json, cv.md and "
        "predictions.jsonl. An interrupted study resumes: finished folds are kept. The same command in a "
        "second process (or machine sharing the folder) takes the folds the first is not training. "
        "--compare A B pairs two studies photo by photo (each photo's answers averaged over the seeds first).",
    )
    p.add_argument(
        "--out", type=folder, metavar="STUDY", help="the study folder (new, empty, or this same study to resume)"
    )
    p.add_argument("--folds", type=count(Range(2)), help=f"folds (default {FOLDS}; none with --validate-on)")
    p.add_argument(
        "--seeds",
        type=count(Range(1, MAX_SEEDS, hint="each seed trains every fold again; grow a study by a few at a time")),
        default=1,
        help="repeat with this many seeds (the recipe's seed and on; default 1); a larger number on an existing study "
        "grows it, training the new seeds only",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        metavar="STUDY",
        help="pair two studies photo by photo (no training); over the folds both have finished, while either is "
        "unfinished",
    )
    p.add_argument(
        "--teachers",
        metavar="STUDY",
        help="borrow the trained CNN teachers (--guidance, --distill) of a study of the same "
        "photos, folds and teacher settings, instead of training them again: the same teachers, a third less time "
        "for a study of a change to the ViT",
    )
    p.add_argument(
        "--fold",
        type=count(AT_LEAST_0),
        action="append",
        metavar="K",
        help="run fold K of each seed alone (0 to --folds minus 1; again for more: --fold 0 --fold 2), e.g. to spread "
        "a study over machines or a queue of jobs; the study's files are written once every fold has run",
    )
    p.add_argument(
        "--jobs",
        type=count(),
        default=1,
        metavar="N",
        help="train N folds at once, in N processes on an equal share of the cores each "
        "(default 1: one fold at a time on every core; --jobs 2 on 2 cores keeps both busy)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    recipe_options(p, "a recipe name (see `foodvit recipes`) or a .toml file")
    p.set_defaults(func=cmd_cv, on_interrupt=study_interrupted)


def cmd_cv(args: argparse.Namespace) -> int:
    from foodvit.errors import ConfigError

    if args.compare:
        from foodvit.tuning.compare import compare_studies

        extra = [option for option, given in (("--teachers", args.teachers), ("--fold", args.fold)) if given]
        if extra:
            raise ConfigError(
                f"{' and '.join(extra)} {'are' if len(extra) > 1 else 'is'} for a study being run (borrowed teachers, "
                f"chosen folds); --compare only reads two studies: leave {' and '.join(extra)} out"
            )

        for study in args.compare:
            check_cv_study(study)
        print(compare_studies(*args.compare)[1])
        return 0
    if not args.out:
        raise ConfigError("foodvit cv needs --out STUDY (a folder for the fold runs), or --compare STUDY_A STUDY_B")
    from foodvit.cli.options import build_config
    from foodvit.tuning.cv import cross_validate

    check_recipe(args.recipe)
    config = build_config(args.recipe or "default", args, model=args.model)
    if config.data.validate_on and args.folds is not None:
        raise ConfigError(
            "--folds splits the training photos for cross-validation; a study on --validate-on trains each seed on "
            "all of them and scores the pool: leave --folds out (or --validate-on, for cross-validation)"
        )
    result = cross_validate(
        config,
        args.out,
        folds=args.folds or FOLDS,
        seeds=args.seeds,
        progress=not args.quiet,
        teachers=args.teachers,
        only=args.fold,
        jobs=args.jobs,
    )
    for f in result.folds:
        which = f"seed {f['seed']}" + ("" if config.data.validate_on else f" fold {f['fold']}")
        print(f"  {which}: {f['accuracy']:.3f} ({f['correct']}/{f['n']})", file=sys.stderr)
    if result.left:
        left, ran = result.left, sorted(set(args.fold))
        print(
            f"fold{'s' if len(ran) > 1 else ''} {', '.join(map(str, ran))} of "
            f"{args.folds or FOLDS}{' (of each seed)' if args.seeds > 1 else ''}: "
            f"accuracy {result.accuracy:.3f} over their {result.n} photos; fold{'s' if len(left) > 1 else ''} "
            f"{', '.join(map(str, left))} still to run (--fold, or the same command without it); the study is written "
            "once every fold has run"
        )
    elif not result.summarised:
        print(
            f"{result.line()}, over the seeds this process ran; the study grew meanwhile, and its summary is written "
            "by the process training its new seeds (or by this command with the --seed and --seeds of "
            f"{Path(args.out) / 'study.json'}, once they have run)"
        )
    else:
        print(f"{result.line()}; {Path(args.out) / 'cv.md'}")
    return 0


def study_interrupted(args: argparse.Namespace) -> str | None:
    """What an interrupted `cv` or `tune` kept (cv --compare only reads)."""
    if not args.out:
        return None
    return f"interrupted: finished folds are kept in {args.out}; run the same command again to go on"


def check_cv_study(folder: str) -> None:
    """--compare pairs two cv studies: a tune study is named for the cv studies it holds, its trials."""
    from foodvit.errors import StudyError
    from foodvit.tuning.study import STUDY_FILE, read_identity

    stored = read_identity(Path(folder) / STUDY_FILE)
    if stored is not None and stored.get("kind") == "tune":
        trials = sorted(p.name for p in Path(folder).glob("trial-*") if (p / "cv.json").is_file())
        example = f", e.g. {Path(folder) / trials[0]}" if trials else ""
        raise StudyError(
            f"{folder} is a tune study, which holds no folds of its own: its finished trials are the cv studies "
            f"to compare (its trial-NNNN folders{example})"
        )


def check_text(path: str, what: str) -> None:
    """A text file foodvit reads (a space file): refused in one line when its bytes are not UTF-8 text."""
    from foodvit.errors import ConfigError

    try:
        with open(path, encoding="utf-8") as f:
            while f.read(1 << 16):
                pass
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}); give a TOML file"
        ) from None
    except OSError:
        pass  # said by the reader, with its own words


def _add_tune(sub) -> None:
    """The parser of `foodvit tune`."""
    p = sub.add_parser(
        "tune",
        help="search settings for your photos with Optuna (TPE, pruning by fold), scored by k-fold CV",
        description="Each trial is a k-fold cross-validation (over the training photos alone) of the recipe "
        "with sampled settings; a trial whose running mean accuracy after a fold is below the median "
        "of earlier trials at that fold is pruned. The study lives in STUDY/study.db (SQLite): "
        "rerun the command to resume or add trials, from several processes at once if you like. "
        "Writes STUDY/best.toml (foodvit train --recipe STUDY/best.toml), tune.md and plots.",
    )
    p.add_argument(
        "--out",
        required=True,
        type=folder,
        metavar="STUDY",
        help="the study folder (new, empty, or this same study to continue)",
    )
    p.add_argument("--trials", type=count(), help="trials this command runs (default: until --budget, else 20)")
    p.add_argument(
        "--budget",
        metavar="TIME",
        help="wall-clock time for this command, e.g. 2h, 45m, 90s, 1h30m: no trial "
        "starts after it, and no fold after a trial's first that would end past it",
    )
    p.add_argument(
        "--space",
        metavar="FILE",
        help="a TOML search space (default: lr, weight decay, augmentation, depth, width, "
        "image size, drloc, init, drop_path, epochs around the recipe's values)",
    )
    p.add_argument("--folds", type=count(Range(2)), default=3, help="folds per trial (default 3)")
    p.add_argument(
        "--storage",
        metavar="URL",
        help="an Optuna RDB URL instead of STUDY/study.db, e.g. "
        "postgresql://user@host/db (its driver comes with the tune extra) or mysql+pymysql://user@host/db "
        "(many machines, one study)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-trial lines")
    recipe_options(p, "the starting recipe (its values are the first trial; default: default)")
    p.set_defaults(func=cmd_tune, on_interrupt=study_interrupted)


def cmd_tune(args: argparse.Namespace) -> int:
    need("tune", "optuna")
    import optuna

    from foodvit.cli.options import build_config
    from foodvit.tuning.search import parse_budget, tune

    # the command prints its own line per trial, a failed one's error included (Optuna's warning adds a traceback)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    check_recipe(args.recipe)
    config = build_config(args.recipe or "default", args, model=args.model)
    if args.space:
        check_text(args.space, "the space file")
    print(
        tune(
            args.out,
            config,
            trials=args.trials,
            budget_s=parse_budget(args.budget) if args.budget else None,
            space_file=args.space,
            folds=args.folds,
            storage=args.storage,
        )
    )  # its lines: the library's log
    return 0
