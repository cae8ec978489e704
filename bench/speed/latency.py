"""Single-photo CPU latency of a prediction: what a demo user waits for, as the course measured it.

    python -m bench.speed.latency                                  # ViT-B/16, 3 classes, the test photos
    python -m bench.speed.latency --models ViT-B/16 ViT-Ti/16 --photos 20 --rounds 5

Each implementation (foodvit, timm, torchvision) runs the same `foodvit.deploy.inference.predict`: read
the JPEG from disk, decode, resize and crop to 224, normalise, forward pass, softmax, top-k, one
photo at a time (batch 1). Rounds are interleaved across implementations; each figure is the
median seconds per photo. The model-only column is the forward pass alone on a ready tensor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.speed.throughput import PEERS, build, implementations, machine
from foodvit.data.datasource import DataSource
from foodvit.data.folders import Split
from foodvit.data.preprocess import make_preprocess  # noqa: E402
from foodvit.deploy.inference import predict  # noqa: E402
from foodvit.deploy.predictor import Predictor  # noqa: E402


def spread_photos(split: Split, n: int) -> list[Path]:
    """n photos spread evenly over the split (so every class is in)."""
    step = max(1, len(split.samples) // n)
    return [path for path, _ in split.samples[::step][:n]]


def prepare(impl: str, name: str, classes: list[str]) -> Predictor:
    """A randomly initialised model in a Predictor with ImageNet preprocessing, as a trained run."""
    torch.manual_seed(0)
    model = build(impl, name, num_classes=len(classes)).eval()
    return Predictor(model, classes, make_preprocess(224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))


def model_only(model: torch.nn.Module, repeats: int) -> float:
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        model(x)
        started = time.perf_counter()
        for _ in range(repeats):
            model(x)
    return (time.perf_counter() - started) / repeats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT-B/16"], choices=list(PEERS))
    parser.add_argument(
        "--data", help="data source whose test photos are predicted (default: $FOODVIT_DATA, else the course's zip)"
    )
    parser.add_argument("--photos", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    split = DataSource.parse(args.data).open_split("test")
    photos, classes = spread_photos(split, args.photos), list(split.classes)
    where = machine(torch.device("cpu"))
    print(f"{where} | {time.strftime('%Y-%m-%d')} | {len(photos)} photos, {len(classes)} classes, batch 1, fp32")
    print(f"{'model':<10} {'impl':<12} {'s/photo':>9} {'model only':>11} {'vs fastest peer':>16}")
    results = []
    for name in args.models:
        models = {impl: prepare(impl, name, classes) for impl in implementations(name)}
        for model in models.values():
            predict(model, photos[:1])  # warm-up
        seconds = {impl: [] for impl in models}
        for _ in range(args.rounds):
            for impl, model in models.items():
                seconds[impl] += [r["seconds"] for r in predict(model, photos)]
        median = {impl: statistics.median(s) for impl, s in seconds.items()}
        forward = {impl: model_only(p.model, max(3, args.photos // 2)) for impl, p in models.items()}
        fastest_peer = min(v for impl, v in median.items() if impl != "foodvit")
        for impl in models:
            ratio = fastest_peer / median[impl]
            print(f"{name:<10} {impl:<12} {median[impl]:>9.4f} {forward[impl]:>11.4f} {ratio:>15.2f}x")
            results.append(
                {
                    "model": name,
                    "impl": impl,
                    "seconds_per_photo": median[impl],
                    "model_only": forward[impl],
                    "speed_vs_fastest_peer": ratio,
                }
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": where, "date": time.strftime("%Y-%m-%d"), "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
