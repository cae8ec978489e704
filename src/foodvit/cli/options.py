"""The command line's view of the settings: one option per settings field, generated from the
dataclasses of foodvit.settings (never written out one by one); a run's settings are resolved from a recipe
and the options given by model/resolve.py, the path every caller takes. The resolved configuration is
saved with every run (config.json) and checkpoint. No PyTorch here unless pre-trained weights are named.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from foodvit.errors import ConfigError
from foodvit.model.resolve import resolve
from foodvit.settings.fields import Range, check_value, flag_of
from foodvit.settings.model import VIT_OPTIONS
from foodvit.settings.objectives import OBJECTIVES
from foodvit.settings.overrides import is_setting_key
from foodvit.settings.run import DEFAULT_RECIPE, SECTIONS, RunConfig

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class BoolFlag(argparse.BooleanOptionalAction):
    """--name turns a setting on, --no-name off; --name true/false is still accepted (help: SettingsHelp)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        try:
            setattr(namespace, self.dest, True if values is None else parse_bool(values))
        except argparse.ArgumentTypeError as err:
            parser.error(f"argument {option_string}: {err}")


class SettingsHelp(argparse.HelpFormatter):
    """A command's help where a setting's switch reads "--name [true|false], --no-name": argparse would offer the
    value to --no-name too, which refuses it."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BoolFlag):
            on, off = action.option_strings
            return f"{on} [{action.metavar}], {off}"
        return super()._format_action_invocation(action)


def number_type(kind: type, allowed: Range | None = None, several: bool = False):
    """An argparse type: a number (or comma-separated numbers) of `kind`, checked against `allowed`."""

    def parse(text: str):
        try:
            values = tuple(kind(v) for v in text.replace(" ", "").split(",") if v) if several else kind(text)
        except ValueError:
            what = "comma-separated numbers" if several else ("a whole number" if kind is int else "a number")
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if allowed is not None:
            try:
                check_value("value", values, allowed)
            except ConfigError:
                hint = f"; {allowed.hint}" if allowed.hint else ""
                each = "each " if several else ""
                raise argparse.ArgumentTypeError(f"{each}must be {allowed}, got {text}{hint}") from None
        return values

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _arg_type(f):
    """The option's parser, from the field's default (every field has one) and its range."""
    default, allowed = f.default, f.metadata.get("range")
    if isinstance(default, tuple):
        return number_type(float, allowed, several=True)
    if isinstance(default, (int, float)):
        return number_type(type(default), allowed)
    if f.metadata.get("flag") == "data":
        return data_source
    return str


def data_source(text: str) -> str:
    """argparse type of every command's --data: never empty. An unset shell variable (--data "$PHOTOS") was the
    default source, and a run trained on the course's photos, or downloaded them, in place of the user's. (An empty
    --pretrained or --validate-on stays a way to turn a recipe's off.)"""
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a folder, a zip or a URL, or leave --data out for its default")
    return text


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per field of ViTConfig (model) and of every section of RunConfig (settings.run.SECTIONS), named
    after the field or its `flag`."""
    parser.formatter_class = SettingsHelp
    seen: set[str] = set()
    titles = {
        "teacher": "CNN teacher",
        "pretrain": "self-supervised pre-training",
        **{o.name: o.title for o in OBJECTIVES},
    }
    groups = [("model", VIT_OPTIONS, "vit")]
    groups += [(titles.get(name, name), fields(cls), name) for name, cls in SECTIONS.items()]
    for title, group_fields, dest_prefix in groups:
        group = parser.add_argument_group(f"{title} settings (override the recipe)")
        for f in group_fields:
            flag = flag_of(f)
            if flag in seen:
                raise RuntimeError(f"duplicate option {flag}: config field names must be unique across sections")
            seen.add(flag)
            help_text, dest, choices = f.metadata.get("help", ""), f"{dest_prefix}.{f.name}", f.metadata.get("choices")
            if isinstance(f.default, bool):
                group.add_argument(flag, dest=dest, action=BoolFlag, default=None, help=help_text, metavar="true|false")
                continue
            allowed = f.metadata.get("range")
            if allowed is not None and allowed != Range():
                help_text += f" [{allowed}]"
            group.add_argument(
                flag,
                dest=dest,
                type=_arg_type(f),
                choices=choices,
                default=None,
                help=help_text,
                metavar=None if choices else (f.metadata.get("flag") or f.name).upper(),
            )


def settings_given(args: argparse.Namespace) -> dict:
    """The settings options of a command line ("section.name" -> value, None where not given): the command's own
    options (--out, --quiet ...) are no settings."""
    return {key: value for key, value in vars(args).items() if is_setting_key(key)}


def given_overrides(args: argparse.Namespace) -> list[str]:
    """The settings options present on a command line (for refusing them with --resume)."""
    return [key for key, value in settings_given(args).items() if value is not None]


def build_config(
    recipe: str = DEFAULT_RECIPE, overrides: argparse.Namespace | dict | None = None, model: str | None = None
) -> RunConfig:
    """A run's settings as `foodvit train` resolves them from its options (model/resolve.py)."""
    if isinstance(overrides, argparse.Namespace):
        overrides = settings_given(overrides)
    return resolve(recipe, overrides, model=model)
