"""Figures drawn without pyplot (nothing process-wide changes), and written atomically as PNG."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

from foodvit.files import atomic_write

log = logging.getLogger(__name__)


LABEL_WIDTH = 28  # characters: a class name of this length fits a photo's title or a tick of the confusion figure


def drawable(text: object, width: int = LABEL_WIDTH) -> str:
    """A name (a class's, a photo's) as a figure draws it: bytes of a file name that are not UTF-8 (held as
    surrogates, which matplotlib's text layout refuses with a TypeError) drawn as U+FFFD, and a name past `width`
    characters cut in its middle with an ellipsis, so that it stays inside its panel and two long names that share a
    beginning still differ (the report's tables, the JSON and the CSV keep every name whole)."""
    text = re.sub("[\ud800-\udfff]", "\ufffd", str(text))
    if len(text) <= width:
        return text
    tail = (width - 1) // 3
    return f"{text[: width - 1 - tail]}\u2026{text[len(text) - tail :]}"


def new_figure(figsize):
    """A figure drawn without pyplot: nothing global changes (no backend switch, no figure kept
    open), so a notebook's own matplotlib set-up is left as it was. matplotlib is imported here,
    when the first picture is drawn, not when foodvit is."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize, **kwargs):
    """A new_figure() and its axes."""
    fig = new_figure(figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


MAKER = "foodvit"  # the PNG's Software text: a picture foodvit made, which a later command may write over


# matplotlib's warning for each character its font cannot draw (a class name in CJK, an emoji): the codepoint
# and the font's name
MISSING_GLYPH = re.compile(r"Glyph (\d+) \(.*\) missing from font\(s\) (.+?)\.?$")
_told: set[str] | None = None  # characters named so far; None: the process keeps matplotlib's own warnings


def quiet_missing_glyphs() -> None:
    """A process-wide policy the command line sets once, as it sets the photos' pixel limit: matplotlib's warning
    for each character a figure's font lacks is silenced (laying a figure out warns too, before it is saved), and
    save_figure names the characters once in the log instead. A library caller's process is left as it is."""
    global _told
    warnings.filterwarnings("ignore", message=MISSING_GLYPH.pattern)
    if _told is None:
        _told = set()


def save_figure(fig, path: Path) -> Path:
    """The figure written as a PNG at `path`, atomically. Under quiet_missing_glyphs, characters its font cannot
    draw (drawn as boxes) are named once in the log, and any other warning is shown as it would have been."""

    def write(tmp: Path) -> None:
        if _told is None:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": MAKER})
            return
        with warnings.catch_warnings(record=True) as caught:  # the command line draws in one thread
            warnings.filterwarnings("always", message=MISSING_GLYPH.pattern)  # the rest keep the process's filters
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": MAKER})
        missing, fonts = [], set()
        for warning in caught:
            found = MISSING_GLYPH.match(str(warning.message))
            if found is None:  # recorded through the process's filters: shown as it would have been
                warnings.showwarning(
                    warning.message, warning.category, warning.filename, warning.lineno, warning.file, warning.line
                )
            elif chr(int(found.group(1))) not in missing:
                missing.append(chr(int(found.group(1))))
                fonts.add(found.group(2))
        new = [c for c in missing if c not in _told]
        if new:
            _told.update(new)
            log.warning(
                "the figures draw %s as empty boxes: matplotlib's font (%s) lacks them; to draw them, install a "
                "font that has them and put it first in matplotlib's font.family",
                " ".join(new),
                ", ".join(sorted(fonts)),
            )

    return atomic_write(path, write)


def made_here(path: Path) -> bool:
    """Whether the file at `path` is a picture save_figure wrote (a PNG whose Software text says foodvit)."""
    from PIL import Image

    try:
        with Image.open(path) as picture:
            return picture.format == "PNG" and getattr(picture, "text", {}).get("Software") == MAKER
    except (OSError, ValueError, SyntaxError):
        return False
