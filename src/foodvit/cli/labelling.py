"""`foodvit predict ... --out FILE`: every photo a row in a CSV / JSON Lines file, batched and
resumable, on one process or many under torchrun (the library side: deploy/labelling.py). Kept
apart from commands.py, whose other predict path prints a few photos' answers."""

from __future__ import annotations

import argparse
import os
import sys


def label_to_file(args: argparse.Namespace) -> int:
    """predict --out: every photo a row in a CSV / JSONL file, batched, resumable (deploy/labelling.py)."""
    from foodvit.deploy.labelling import PhotoList, label, label_share
    from foodvit.deploy.predictions import Predictions, check_out, model_identity
    from foodvit.deploy.predictor import Predictor
    from foodvit.errors import ConfigError

    if args.json or args.plot:
        raise ConfigError(f"--out writes every photo's row to {args.out}; {'--json' if args.json else '--plot'} is for a few photos "
                          "printed or drawn: drop one of them")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    if world > 1 and args.files_from == "-":
        raise ConfigError("under torchrun each process reads the list itself: give --files-from a file, not standard input")
    out = check_out(args.out)
    photos = PhotoList(args.images, args.files_from)
    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    identity = model_identity(args.run, predictor.classes)
    if world > 1:
        done = label_share(predictor, photos, out, identity, rank=rank, world=world, top_k=args.top_k, batch_size=args.batch_size,
                           workers=args.workers, quiet=args.quiet or rank != 0, timeout=args.dist_timeout)
        if rank != 0:
            return 0  # rank 0 merges and reports for all
    else:
        predictions = Predictions(out, identity, args.top_k)
        try:
            done = label(predictor, photos, predictions, top_k=args.top_k, batch_size=args.batch_size, workers=args.workers,
                         quiet=args.quiet)
        finally:
            predictions.close()
    labelled = done.written + done.failed
    print(f"{out}: {done.written} photos labelled, {done.failed} could not be read (rows with an error), {done.skipped} already "
          f"there; {labelled / max(done.seconds, 1e-9):.1f} photos/s", file=sys.stderr)
    return 1 if done.failed else 0
