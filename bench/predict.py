"""Labelling a collection (issue 32): photos/s of `foodvit predict RUN FOLDER --out predictions.csv`
(deploy/labelling.label, in this process) with 0, 1 and 2 decoding threads, against the batched
forward pass alone on the same photos already decoded (the most labelling could reach here).

    python bench/predict.py                            # 10,000 photos of 512 px, the default recipe's model
    python bench/predict.py --photos 2000 --workers 0,2,4 --batch-size 128

The photos are bench/scale.py's (smooth random colour fields with noise, 682 x 512 px JPEGs, about
95 KB each, generated once into bench/.cache/scale-<n>). The model is the default recipe's
architecture (ViT-Ti/8, 6 blocks, 64 px, global average pooling), randomly initialised: labelling
costs the same whatever the weights. PyTorch keeps its own thread count for the forward pass; the
decoding threads come on top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale import generate  # noqa: E402

from foodvit.data.preprocess import make_preprocess  # noqa: E402
from foodvit.deploy.labelling import PhotoList, label  # noqa: E402
from foodvit.deploy.predictions import Predictions  # noqa: E402
from foodvit.deploy.predictor import Predictor  # noqa: E402


def default_predictor(device: str) -> Predictor:
    import torch

    from foodvit.model.variants import create_model

    torch.manual_seed(0)
    model = create_model("ViT-Ti/8", num_classes=101, image_size=64, depth=6, pool="gap", pos_embed="sincos2d").to(device)
    return Predictor(model, [f"class_{i:03d}" for i in range(101)], make_preprocess(64, (0.5,) * 3, (0.5,) * 3))


def forward_only(predictor: Predictor, photos: list[str], batch_size: int, total: int) -> float:
    """Photos/s of Predictor.probabilities alone: `total` photos in batches of batch_size, from one
    batch decoded beforehand (decoding, listing and writing left out)."""
    batch = np.stack([predictor.prepare(p) for p in photos[:batch_size]])
    predictor.probabilities(batch)  # warm-up
    started = time.perf_counter()
    for _ in range(total // batch_size):
        predictor.probabilities(batch)
    return (total // batch_size) * batch_size / (time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=10_000)
    parser.add_argument("--workers", default="0,1,2", help="decoding threads to measure, comma-separated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    root = generate(HERE / ".cache" / f"scale-{args.photos}", args.photos)
    photos = PhotoList([root / "images"])
    listed = list(photos)
    predictor = default_predictor(args.device)
    import torch

    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} "
                          f"PyTorch threads, device {args.device}", "photos": len(listed), "batch_size": args.batch_size,
               "forward_only_photos_per_s": forward_only(predictor, listed, args.batch_size, min(len(listed), 4096))}
    print(f"forward pass alone: {results['forward_only_photos_per_s']:.0f} photos/s", flush=True)
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = Predictions(Path(tmp) / "p.csv", {"model": "bench", "classes": predictor.classes, "sha256": "-"}, 3)
            try:
                done = label(predictor, photos, out, batch_size=args.batch_size, workers=workers, quiet=True)
            finally:
                out.close()
        assert done.written == len(listed) and done.failed == 0, done
        rate = done.written / done.seconds
        results[f"workers_{workers}_photos_per_s"] = rate
        print(f"--workers {workers}: {rate:.0f} photos/s ({done.seconds:.1f} s for {done.written} photos)", flush=True)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
