"""The built-in recipes (the TOML files beside this module) and any recipe file: found, read and
checked into a RunConfig (foodvit.settings.run: the schema they fill)."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

from foodvit.errors import ConfigError
from foodvit.settings.layout import current_layout
from foodvit.settings.run import DEFAULT_RECIPE, SECTIONS, RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPES_DIR = Path(__file__).parent


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_path(name_or_file: str) -> Path:
    path = Path(name_or_file)
    if path.suffix.lower() == ".toml" and path.is_file():  # recipe.TOML, as a system that capitalises names saves it
        return path
    builtin = RECIPES_DIR / f"{name_or_file}.toml"
    if builtin.is_file():
        return builtin
    raise ConfigError(
        f"unknown recipe {name_or_file!r}: expected one of {', '.join(list_recipes())} or a path to a .toml file"
    )


def recipe_text(path: Path, what: str = "recipe") -> str:
    """A recipe file's text (or another TOML file of settings, a search space: `what`), as TOML is written: UTF-8,
    whatever the system's own encoding (a byte-order mark, as Windows' Notepad leaves one, is read past); other bytes
    are refused in one line."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise ConfigError(f"cannot read the {what} {path} ({err.strerror or err})") from None


def read_toml(path: Path, what: str = "recipe") -> dict:
    """A TOML file of settings (a recipe, a search space: `what`) as its tables; text that is not TOML, or that nests
    arrays or tables thousands deep (the parser's own recursion runs out), refused in one line naming the file."""
    text = recipe_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(
            f"{what} {path} nests arrays or tables thousands deep; its values are numbers, text, true/false or "
            "short lists of them"
        ) from None


def recipe_description(name_or_file: str) -> str:
    """The recipe's leading comment block as one paragraph: what it is, and why its settings are what they are."""
    lines = recipe_text(recipe_path(name_or_file)).splitlines()
    leading = itertools.takewhile(lambda line: line.startswith("#"), lines)
    return " ".join(line.lstrip("# ").strip() for line in leading).strip()


def recipe_summary(name_or_file: str) -> str:
    """The first sentence of the recipe's description, whole (for `foodvit recipes`)."""
    return re.split(r"(?<=[.!?])\s+", recipe_description(name_or_file), maxsplit=1)[0]


def load_recipe(name_or_file: str = DEFAULT_RECIPE) -> RunConfig:
    """A RunConfig with the recipe's values over the dataclass defaults."""
    path = recipe_path(name_or_file)
    values = read_toml(path)
    allowed = {"model", "vit", *SECTIONS}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"recipe {path}: unknown section(s) or key(s) {', '.join(unknown)}; expected {', '.join(sorted(allowed))}"
        )
    name = path.stem if path.parent == RECIPES_DIR else str(path)
    values = current_layout(values, f"recipe {path}")  # its one line names the recipe
    try:
        return RunConfig.from_dict({**values, "recipe": name})
    except ConfigError as err:
        raise ConfigError(f"recipe {path}: {err}") from None
