"""Figures drawn without pyplot (nothing process-wide changes), and written atomically as PNG."""

from __future__ import annotations

from pathlib import Path

from foodvit.files import atomic_write


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


def save_figure(fig, path: Path) -> Path:
    def write(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": MAKER})

    return atomic_write(path, write)


def made_here(path: Path) -> bool:
    """Whether the file at `path` is a picture save_figure wrote (a PNG whose Software text says foodvit)."""
    from PIL import Image

    try:
        with Image.open(path) as picture:
            return picture.format == "PNG" and getattr(picture, "text", {}).get("Software") == MAKER
    except (OSError, ValueError, SyntaxError):
        return False
