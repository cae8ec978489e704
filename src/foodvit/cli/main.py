"""The `foodvit` command: its parser and its entry point. Each subcommand (or small group of them)
is a module of cli/ holding its parser's registration (`register(sub)`) beside its handler, a thin
shell over the library; a new subcommand is one more module in COMMANDS. What this entry point does
around a command, the command's parser says in its defaults: `func` (the handler), `opens_photos=False`
(a listing: no photo decoder to load and limit), `on_interrupt` (the line after ctrl-C: what was kept).

Errors a user can act on (FoodVitError, and an OSError on a named file: a read-only or full disk, a
folder that is not theirs) are printed on one line and exit 2; anything else is a bug and keeps its
traceback (so does every error under --debug). Heavy libraries (PyTorch,
torchvision, matplotlib) are imported by the subcommands that need them, never to show help.
The library's messages go through Python's logging ("foodvit" and below): plain lines on
standard error, INFO by default, WARNING with a command's --quiet, DEBUG with --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import logging
import os
import signal
import sys
import threading

from foodvit.cli import data, export_web, listings, pictures, predicting, shipping, studies, training
from foodvit.errors import FoodVitError, OutputError, Terminated
from foodvit.markup import terminal

# the subcommands in the order `foodvit --help` lists them; each module's register(sub) adds its parsers
COMMANDS = (training, studies, predicting, pictures, shipping, export_web, data, listings)


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("foodvit")
    except PackageNotFoundError:
        from foodvit import __version__

        return __version__


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of an option is a short usage line and the error, as git's is: the whole
    synopsis of a command's fifty options would hide the one line that matters, and `-h` lists them."""

    def error(self, message: str):
        formatter = self._get_formatter()
        # the positionals alone, every option folded into "[options]"
        formatter.add_usage(None, [a for a in self._actions if not a.option_strings], [], prefix="")
        arguments = formatter.format_help().strip().removeprefix(self.prog).strip()
        usage = " ".join(filter(None, (self.prog, "[options]", arguments)))
        self.exit(2, f"usage: {usage}  (see {self.prog} -h)\n{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="foodvit", description="A paper-faithful Vision Transformer for FoodVision Mini and your own photos."
    )
    parser.add_argument(
        "--version", action="version", version=f"foodvit {version()}", help="print foodvit's version and exit"
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of every error, and the library's debug messages"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


class _StandardError(logging.StreamHandler):
    """A handler writing to sys.stderr as it is at each message (a caller or test may replace it)."""

    foodvit_cli = True

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Line(logging.Formatter):
    """Each message one line, its control characters shown escaped (markup.terminal): a class or file name's line
    break or colour code cannot make a line that reads as foodvit's own (a traceback under --debug stays as it is)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return terminal(super().formatMessage(record))


def configure_logging(args: argparse.Namespace) -> None:
    """The library's messages (logger "foodvit" and its children) as plain lines on standard error."""
    logger = logging.getLogger("foodvit")
    level = logging.DEBUG if args.debug else logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    logger.setLevel(level)
    if not any(getattr(h, "foodvit_cli", False) for h in logger.handlers):
        handler = _StandardError()
        handler.setFormatter(_Line("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _StandardOutput:
    """sys.stdout while a command runs: a write or flush the system refuses (a full disk behind `> file`, /dev/full,
    an I/O error) becomes an OutputError, one line; a closed pipe stays BrokenPipeError, for `foodvit ... | head`."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def _refused(self, err: OSError) -> OutputError:
        reason = err.strerror or type(err).__name__
        advice = "free some space where it goes, or send it elsewhere" if err.errno in FULL else "send it elsewhere"
        return OutputError(f"cannot write to standard output ({reason}); {advice}")

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._refused(err) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise self._refused(err) from None

    def __getattr__(self, name: str):  # the rest (fileno, isatty, encoding, buffer) as the stream has it
        return getattr(self.stream, name)


def _drop_output(stream) -> None:
    """What `stream` still buffers goes to the null device: the interpreter's exit then flushes it without failing
    again after the command's one line (a stream with no descriptor of its own is left as it is)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The command line, its options anywhere: `foodvit predict RUN --out labels.csv photos/` as well as with the
    photos last (argparse takes a list of positionals only before the first option after them). Whatever is left
    over is refused by the command's own parser, which names the command."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    listed = [a for a in command._actions if not a.option_strings and a.nargs in ("*", "+")]
    cut = extra.index("--") if "--" in extra else len(extra)  # after --, a name that starts with - is a name
    before, after = extra[:cut], extra[cut + 1 :]
    unknown = [s for s in before if s.startswith("-")]
    if listed and not unknown:
        setattr(args, listed[-1].dest, [*getattr(args, listed[-1].dest), *before, *after])
        return args
    command.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    raise AssertionError("unreachable: error() exits")


@contextlib.contextmanager
def _sigterm_as_interrupt(wanted: bool):
    """Within the block, SIGTERM (kill, a scheduler stopping the command) ends a command that says what an
    interruption keeps (`on_interrupt`: train, cv, tune, predict, the exports) as ctrl-C does: Terminated is raised,
    its work unwinds (no temporary file left, the last checkpoint or batch kept) and the command says what was kept,
    exiting with 143. Left as it is where the process ignores SIGTERM or this is not the main thread; torchrun's ranks
    and cv's processes set their own handlers inside."""
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:  # ignored, or handled by whoever runs this (a caller's own handler)
        yield
        return

    def terminated(signum, frame):
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    configure_logging(args)
    stdout = sys.stdout
    if getattr(stdout, "errors", None) == "strict" and hasattr(stdout, "reconfigure"):
        # a file name that is not valid in the output's encoding (bytes of another locale) is printed escaped,
        # not a UnicodeEncodeError: Python is strict on a UTF-8 locale's output, lenient only under C.UTF-8
        stdout.reconfigure(errors="backslashreplace")
    if stdout is not None:
        sys.stdout = _StandardOutput(stdout)
    try:
        if getattr(args, "opens_photos", True):
            from foodvit.data.photos import limit_pixels, quiet_exif_warnings

            limit_pixels()  # every photo this command opens: over the pixel limit is refused, not warned about
            quiet_exif_warnings()  # a photo whose EXIF block is damaged decodes: no warning of Pillow's for it
        from foodvit.viz.plotting import quiet_missing_glyphs

        quiet_missing_glyphs()  # a class name's characters the figures' font lacks: one log line, not one each
        with _sigterm_as_interrupt(getattr(args, "on_interrupt", None) is not None):
            code = args.func(args)
        if stdout is not None:
            sys.stdout.flush()  # what is still buffered fails here, in one line, not at the interpreter's exit
        return code
    except FoodVitError as err:
        if args.debug:
            raise
        if isinstance(err, OutputError) and stdout is not None:
            _drop_output(stdout)
        print(f"foodvit {args.command}: error: {terminal(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        said = getattr(args, "on_interrupt", None)
        print(f"\n{terminal((said(args) if said else None) or 'interrupted')}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
    except BrokenPipeError:  # e.g. `foodvit models | head`
        return 0
    except OSError as err:
        # a place the system refuses (read-only, not yours, full, not a place files can be made): the user's to change
        if args.debug or not err.filename or err.errno is None:  # errno None: not the system's (a URL's error)
            raise
        print(f"foodvit {args.command}: error: {terminal(place_refused(err))}", file=sys.stderr)
        return 2
    finally:
        if stdout is not None:
            sys.stdout = stdout


FULL = {errno.ENOSPC, errno.EDQUOT}
REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM}


def place_refused(err: OSError) -> str:
    """An OSError on a named file as one line: the file, the system's reason, and what to do about that reason."""
    where = err.filename if not err.filename2 else f"{err.filename} -> {err.filename2}"
    reason = err.strerror or type(err).__name__
    if err.errno in FULL:
        advice = "free some space there, or choose another place"
    elif err.errno in REFUSED:
        advice = "choose a place you can write to, or check its permissions"
    else:
        advice = "check the path"
    return f"cannot use {where} ({reason}); {advice}"


if __name__ == "__main__":
    sys.exit(main())
