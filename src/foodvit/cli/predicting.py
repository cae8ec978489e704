"""`foodvit evaluate` (accuracy on a split) and `foodvit predict` (a few photos printed, or every
photo a row of a CSV / JSON Lines file, batched and resumable, on one process or many under torchrun:
the library side is deploy/labelling.py)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from foodvit.cli.common import (
    VERBOSE,
    count,
    evaluation_source,
    number,
    writable,
)
from foodvit.cli.options import data_source
from foodvit.errors import ConfigError
from foodvit.markup import terminal
from foodvit.settings.fields import POSITIVE, Range
from foodvit.torchrun import DEFAULT_TIMEOUT_S, place


def register(sub) -> None:
    """Add evaluate, predict to the subcommands."""
    p = sub.add_parser("evaluate", help="per-image accuracy of a trained run on a split")
    p.add_argument("run", help="a run directory (or its model.safetensors), or an exported .onnx file")
    p.add_argument("--data", type=data_source, help="data source (default: the one stored with the run)")
    p.add_argument(
        "--split", default="test", help="the split folder to evaluate: test (default), train, or any <root>/<split>/"
    )
    p.add_argument("--strict", action="store_true", help="refuse unreadable files instead of skipping them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verbose", **VERBOSE)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "predict",
        help="classify photos with a trained run: a few, or whole folders into a CSV / JSONL file",
        description="Classify local photos: files, folders (every photo under them, hidden ones left out) or a "
        "list file. A photo that cannot be read is reported and skipped (exit status 1); URLs are "
        "not read: download the photo first. With --out, rows are written a batch at a time and "
        "running the same command again continues where it stopped; under torchrun each process "
        "labels its share and the first merges them.",
    )
    p.add_argument("run", help="a run directory (or its model.safetensors), or an exported .onnx file")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="photo files (JPEG, PNG, WebP, ...) or folders of them")
    p.add_argument(
        "--files-from", metavar="FILE", help="also the photos listed in FILE, one path a line (- reads standard input)"
    )
    p.add_argument(
        "--files-from0",
        metavar="FILE",
        help="also the photos listed in FILE, each path ended by a NUL byte, as "
        "find -print0 writes them (for names that hold a newline; - reads "
        "standard input)",
    )
    p.add_argument(
        "--top-k", type=count(), default=3, help="how many classes to list per photo, most probable first (default 3)"
    )
    p.add_argument("--plot", metavar="FILE", help="save the photos with their labels and probabilities as a PNG")
    p.add_argument(
        "--json", action="store_true", help="print a JSON list, one object per photo (with 'error' for a skipped one)"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write a row per photo to FILE, .csv or .jsonl, as each batch finishes "
        "(path, label, probability, top_k, error); an existing FILE of the same model is "
        "continued: the photos already in it are skipped",
    )
    p.add_argument("--batch-size", type=count(), default=64, help="with --out: photos per forward pass (default 64)")
    p.add_argument(
        "--workers",
        type=count(Range(0)),
        default=2,
        help="with --out: threads decoding photos while the model runs (default 2; 0 decodes in line)",
    )
    p.add_argument(
        "--retry-errors",
        action="store_true",
        help="with --out: read again the photos whose row in the file is an error (a photo copied since, a mount "
        "back); each gets a new row, the last row of a photo being its answer",
    )
    p.add_argument("--quiet", action="store_true", help="with --out: no progress bar")
    p.add_argument(
        "--dist-timeout",
        type=number(POSITIVE),
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"under torchrun: how long the first process waits for the others' parts (default {DEFAULT_TIMEOUT_S})",
    )
    p.set_defaults(func=cmd_predict, on_interrupt=predict_interrupted)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import evaluate_split
    from foodvit.deploy.predictor import Predictor

    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    split = evaluation_source(args.run, args.data, predictor).open_split(args.split, strict=args.strict)
    result = evaluate_split(predictor, split, strict=args.strict)
    # every file left out, those whose header could not be read and those cut short alike, in one summary
    for line in replace(split, skipped=tuple(result["skipped"])).skipped_summary(args.verbose):
        print(terminal(line), file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    correct = round(result["accuracy"] * result["n"])
    print(f"{args.split} accuracy {result['accuracy']:.4f} ({correct}/{result['n']} photos), loss {result['loss']:.4f}")
    for name, acc in result["per_class"].items():
        print(f"  {terminal(name):<20} {acc:.3f}")
    for line in confusion_lines(list(result["per_class"]), result["confusion"]):
        print(line)
    return 0


def confusion_lines(classes: list[str], confusion: list[list[int]], most: int = 10) -> list[str]:
    """The confusion matrix as text, a row per true class and a column per predicted one; past `most` classes
    too wide to read, so a pointer to --json instead."""
    if len(classes) > most:
        return [f"confusion matrix: {len(classes)} classes, in --json"]
    names = [terminal(name)[:12] for name in classes]
    width = max(5, *(len(name) for name in names), *(len(str(c)) for row in confusion for c in row))
    lines = ["confusion matrix (a row per true class, a column per predicted class)"]
    lines.append(" " * 23 + " ".join(f"{name:>{width}}" for name in names))
    for name, row in zip(names, confusion, strict=True):
        lines.append(f"  {name:<20} " + " ".join(f"{count:>{width}}" for count in row))
    return lines


def cmd_predict(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import PLOT_MOST, predict
    from foodvit.deploy.predictor import Predictor

    if args.out:
        return label_to_file(args)
    args.images = list(photo_list(args))  # folders and the list file expanded: a few photos, printed at the end
    plot = writable(args.plot, (".png",)) if args.plot else None  # refused before any work, not after it
    if plot is not None and len(args.images) > PLOT_MOST:
        raise ConfigError(
            f"--plot draws at most {PLOT_MOST} photos, and {len(args.images)} are given; plot a few of them, or label "
            "them all with --out labels.csv"
        )
    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    results = predict(predictor, args.images, top_k=args.top_k)
    if plot is not None:
        from foodvit.deploy.inference import plot_predictions
        from foodvit.viz.plotting import save_figure

        save_figure(plot_predictions(args.images, results), plot)
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"foodvit predict: skipped {terminal(r['error'])}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            if "error" in r:
                continue
            others = ", ".join(f"{terminal(label)} {p:.3f}" for label, p in r["top_k"][1:])
            print(
                f"{terminal(r['image'])}: {terminal(r['label'])} ({r['probability']:.3f})"
                f"{'; then ' + others if others else ''}  [{r['seconds'] * 1000:.0f} ms]"
            )
        if args.plot:
            print(f"plot: {args.plot}")
    return 1 if failed else 0


def label_to_file(args: argparse.Namespace) -> int:
    """predict --out: every photo a row in a CSV / JSONL file, batched, resumable (deploy/labelling.py)."""
    from foodvit.deploy.labelling import label, label_share
    from foodvit.deploy.predictions import Predictions, check_out, model_identity, read_rows
    from foodvit.deploy.predictor import Predictor
    from foodvit.errors import ConfigError

    if args.json or args.plot:
        raise ConfigError(
            f"--out writes every photo's row to {args.out}; {'--json' if args.json else '--plot'} is for a few photos "
            "printed or drawn: drop one of them"
        )
    here = place()
    rank, world = here.rank, here.world_size
    if world > 1 and args.retry_errors:
        raise ConfigError("--retry-errors runs as one process: run it without torchrun, then go on with torchrun")
    if world > 1 and "-" in (args.files_from, args.files_from0):
        raise ConfigError(
            "under torchrun each process reads the list itself: give --files-from a file, not standard input"
        )
    out = check_out(args.out)
    photos = photo_list(args)
    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    identity = model_identity(args.run, predictor.classes)
    if world > 1:
        done = label_share(
            predictor,
            photos,
            out,
            identity,
            rank=rank,
            world=world,
            top_k=args.top_k,
            batch_size=args.batch_size,
            workers=args.workers,
            quiet=args.quiet or rank != 0,
            timeout=args.dist_timeout,
        )
        if rank != 0:
            return 0  # rank 0 merges and reports for all
    else:
        predictions = Predictions(out, identity, args.top_k, retry_errors=args.retry_errors)
        try:
            done = label(
                predictor,
                photos,
                predictions,
                top_k=args.top_k,
                batch_size=args.batch_size,
                workers=args.workers,
                quiet=args.quiet,
            )
        finally:
            predictions.close()
    labelled = done.written + done.failed
    errors = len(read_rows(out)[1])  # this run's and any earlier run's: the file is not whole while it holds one
    print(
        f"{out}: {done.written} photos labelled, {done.failed} could not be read, {done.skipped} already there; "
        f"{errors} photo{'' if errors == 1 else 's'} whose row is an error"
        + (" (--retry-errors reads them again)" if errors else "")
        + f"; {labelled / max(done.seconds, 1e-9):.1f} photos/s",
        file=sys.stderr,
    )
    return 1 if errors else 0


def predict_interrupted(args: argparse.Namespace) -> str | None:
    """What an interrupted `predict --out` kept (a few photos printed keep nothing to say)."""
    if not args.out:
        return None
    return f"interrupted: every finished batch is kept in {args.out}; run the same command again to label the rest"


def photo_list(args: argparse.Namespace):
    """The photos named on the command line, in folders and in a list file (--files-from, --files-from0)."""
    from foodvit.deploy.labelling import PhotoList
    from foodvit.errors import ConfigError

    if args.files_from and args.files_from0:
        raise ConfigError(
            "--files-from and --files-from0 both name a list file; give one (--files-from0 for NUL-separated names)"
        )
    return PhotoList(args.images, args.files_from0 or args.files_from, nul=bool(args.files_from0))
