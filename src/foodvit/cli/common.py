"""What several subcommands share: argparse types for numbers in a range, the recipe options of
train, cv and tune, the check that an optional extra is installed, an output file's checks, and
the photos an evaluation reads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from foodvit.cli.options import add_config_options, number_type
from foodvit.errors import FoodVitError
from foodvit.settings.fields import AT_LEAST_1, Range

VERBOSE = {"action": "store_true", "help": "list every skipped (unreadable) photo, not only how many"}


def number(allowed: Range):
    """argparse type: a float in range, refused with the range otherwise."""

    return number_type(float, allowed)


def count(allowed: Range = AT_LEAST_1):
    """An argparse type for a whole number in a range, with the range in its message."""

    return number_type(int, allowed)


def folder(text: str) -> str:
    """argparse type: a folder's path, never empty (an unset shell variable): train read `--out ""` as no --out and
    started a new run in runs/<date>-<time>, tune made the working folder its study."""
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a folder's path")
    return text


def recipe_options(parser: argparse.ArgumentParser, recipe_help: str) -> None:
    """What train, cv and tune share: a recipe, a model, and an option per setting over them."""
    parser.add_argument("--recipe", help=recipe_help)
    parser.add_argument("--model", help="a paper name, e.g. ViT-B/16, ViT-Ti/8 (default: the recipe's)")
    add_config_options(parser)


def need(extra: str, *modules: str) -> None:
    """A one-line error naming the extra to install when an optional library is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise FoodVitError(
            f"this command needs {', '.join(missing)}, which come with the {extra} extra: "
            f"pip install 'foodvit[{extra}]'"
        )


def writable(path: str, suffixes: tuple[str, ...] = ()) -> Path:
    """An output picture's path, or a one-line error before any work is lost to an unwritable place or
    to a name that says another format than the one written (suffixes: those allowed, e.g. (".png",)).
    A file already there is written over only if it is a picture foodvit made (a run again); never the user's own."""
    from foodvit.errors import RunError
    from foodvit.viz.plotting import made_here

    out = Path(path)
    if out.is_dir():
        raise RunError(f"{out} is a folder; give a file name, e.g. {out / 'picture.png'}")
    if out.exists() and not made_here(out):
        raise RunError(f"{out} exists and is not a picture foodvit made; give another name, or move that file first")
    if suffixes and out.suffix.lower() not in suffixes:
        raise RunError(
            f"{out} does not end in {' or '.join(suffixes)}, the format written; give a name such as "
            f"{out.with_suffix(suffixes[0]).name}"
        )
    folder = out.parent if str(out.parent) else Path(".")
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise RunError(f"cannot write {out}: {blocker} is a file, not a folder; choose another path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(
            f"cannot create the folder {folder} for {out} ({err.strerror or err}); choose another path"
        ) from None
    if not os.access(folder, os.W_OK):
        raise RunError(f"cannot write to {folder} (read-only or not yours); choose another path for {out.name}")
    return out


def evaluation_source(run: str, data: str | None, predictor):
    """The photos to evaluate a model on: --data; else, for a run directory, the source stored with
    it (its class subset included); for an exported file, the first of its own data and
    $FOODVIT_DATA that is at hand (an export never starts a download)."""
    from foodvit.data.datasource import DataSource
    from foodvit.errors import DataError

    if data:
        return DataSource.parse(data)
    config = Path(run) / "config.json"
    if config.is_file():
        from foodvit.errors import FoodVitError
        from foodvit.rundir.directory import read_config

        try:
            source = DataSource.parse(read_config(config).data.source)
        except FoodVitError as err:
            raise DataError(f"{err}; or name the photos to evaluate on with --data PATH") from None
        if source.is_missing():
            raise DataError(
                f"the photos {Path(run).name} was trained on ({source.location}) are not there any more; name "
                "them with --data PATH (a folder with test/<class>/, or a folder of class folders)"
            )
        return source
    for source in predictor.data_sources():
        if source.root_at_hand() is not None:
            return source
    raise DataError(
        f"the photos {Path(run).name} was trained on are not at hand here; name them with --data PATH "
        "(a folder with test/<class>/, or a folder of class folders)"
    )


def check_recipe(recipe: str | None) -> None:
    """--recipe naming a file (a .toml name, or a path) that is not there: said as such, before the
    recipe loader's list of built-in names, which would suggest a file is not what was meant."""
    from foodvit.errors import ConfigError

    if recipe and (recipe.endswith(".toml") or os.sep in recipe) and not Path(recipe).is_file():
        what = "is a folder" if Path(recipe).is_dir() else "does not exist"
        raise ConfigError(
            f"the recipe file {recipe} {what}; give an existing .toml file, or a built-in recipe's name "
            "(foodvit recipes lists them)"
        )


def export_interrupted(args: argparse.Namespace) -> str:
    """What an interrupted export, export-space or export-web leaves (SIGTERM as ctrl-C: its temporary files and
    folders removed as it unwinds): the file or folder it writes as it was."""
    out = getattr(args, "folder", None) or args.out
    kept = "is as it was" if Path(out).exists() else "was not written"
    return f"interrupted: {out} {kept}, and nothing else is left; run the same command again to export"
