"""The deployment table: one trained model in each way it can ship, measured on this machine.

    .venv/bin/foodvit train --out runs/deploy                      # the default recipe (or any run)
    python -m bench.speed.deploy --run runs/deploy [--models default ViT-B/16] [--photos 100]

For the run's model ("default") and for ViT-B/16 with 3 classes (random weights, paper recipe's
preprocessing), each backend behind the same Predictor: PyTorch eager fp32, torch.compile, ONNX
Runtime fp32, ONNX Runtime int8 with dynamic quantisation and (for a trained run) static, QDQ, calibrated on
the run's training photos. Columns: file size, parameters,
single-photo latency p50/p95 (Predictor.classify on the photo's bytes: decode, preprocess, forward,
softmax; `--photos` test photos), throughput at batch 16 (prepared inputs, forward only), both
measured in interleaved rounds (10 photos and a 1 s burst per backend in turn), and test
accuracy over the whole test split (for ViT-B/16's random weights: the largest relative logit
difference from eager instead). Like the course's model-choice table, on this CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.speed.models import random_run
from foodvit.data.datasource import DataSource
from foodvit.deploy.export import export, relative_difference
from foodvit.deploy.inference import evaluate_split
from foodvit.deploy.predictor import Predictor
from foodvit.deploy.torch_backend import TorchBackend
from foodvit.errors import FoodVitError

ROUND = 10  # photos per backend per round


def throughput(predictor: Predictor, batch: np.ndarray, seconds: float) -> tuple[int, float]:
    """(images, seconds) of forward passes on a prepared batch for about `seconds` (at least one)."""
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done < 1:
        predictor.logits(batch)
        done += 1
    return done * len(batch), time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a trained run directory (its model is the 'default' row)")
    parser.add_argument("--models", nargs="+", default=["default", "ViT-B/16"])
    parser.add_argument("--photos", type=int, default=100, help="photos for the latency percentiles")
    parser.add_argument("--data", help="data source (default: the run's)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row")
    parser.add_argument(
        "--burst", type=float, default=1.0, help="seconds of batch-16 forward passes per backend per round"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(os.cpu_count() or 1)
    logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's quantiser advises on the root logger
    run = Path(args.run)
    source = args.data or json.loads((run / "config.json").read_text())["data"]["source"] or None
    split = DataSource.parse(source).open_split("test")
    photos = [path.read_bytes() for path, _ in (split.samples * (args.photos // len(split.samples) + 1))[: args.photos]]
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} | {time.strftime('%Y-%m-%d')} | "
        f"{len(photos)} photos for latency, {len(split)} test photos"
    )
    header = (
        f"{'model':<10} {'backend':<18} {'MB':>7} {'params':>8} {'p50 ms':>8} {'p95 ms':>8} {'img/s b16':>10} "
        f"{'test acc / parity':>18}"
    )
    print(header)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            folder = run if name == "default" else random_run(name, Path(tmp) / name.replace("/", "-"))
            eager = Predictor.from_run(folder)
            params = sum(p.numel() for p in eager.model.parameters())
            onnx32, onnx8 = (
                Path(tmp) / f"{name.replace('/', '-')}.onnx",
                Path(tmp) / f"{name.replace('/', '-')}-int8.onnx",
            )
            parity_photos = [path for path, _ in split.samples[:: max(1, len(split) // 8)]][:8]
            export(folder, onnx32, photos=parity_photos)
            export(folder, onnx8, quantize="int8-dynamic", photos=parity_photos)
            onnx8s = Path(tmp) / f"{name.replace('/', '-')}-int8-static.onnx"
            try:  # calibrated on the run's training photos: a random-weights model has none
                export(folder, onnx8s, quantize="int8-static", photos=parity_photos, quiet=True)
            except FoodVitError as err:
                print(f"{name}: no static int8 ({err})")
            backends = {"pytorch eager": (eager, (folder / "model.safetensors").stat().st_size)}
            if not args.no_compile:
                compiled = Predictor(
                    TorchBackend(torch.compile(eager.model)), eager.classes, eager.preprocess, eager.card
                )
                backends["torch.compile"] = (compiled, (folder / "model.safetensors").stat().st_size)
            backends["onnxruntime fp32"] = (Predictor.from_onnx(onnx32), onnx32.stat().st_size)
            backends["onnxruntime int8"] = (Predictor.from_onnx(onnx8), onnx8.stat().st_size)
            if onnx8s.is_file():
                backends["onnxruntime int8 st"] = (Predictor.from_onnx(onnx8s), onnx8s.stat().st_size)
            batch = np.stack([eager.prepare(data) for data in photos[:16]])
            reference = eager.logits(np.stack([eager.prepare(data) for data in photos[:32]]))
            # interleaved: every round measures every backend in turn, so that the machine's drift
            # (large on this shared CPU: one backend's p50 moved 50% between runs) falls on all alike
            seconds = {backend: [] for backend in backends}
            images = {backend: [0, 0.0] for backend in backends}
            for predictor, _ in backends.values():
                for data in photos[:3]:
                    predictor.classify(data)  # warm-up (and torch.compile's first compilation)
            for start in range(0, len(photos), ROUND):
                for backend, (predictor, _) in backends.items():
                    seconds[backend] += [predictor.classify(data)["seconds"] for data in photos[start : start + ROUND]]
                    done, took = throughput(predictor, batch, args.burst)
                    images[backend][0] += done
                    images[backend][1] += took
            for backend, (predictor, size) in backends.items():
                q = statistics.quantiles(seconds[backend], n=100)
                p50, p95, rate = q[49], q[94], images[backend][0] / images[backend][1]
                if name == "default":
                    quality = evaluate_split(predictor, split)["accuracy"]
                    shown = f"{quality:.3f}"
                else:
                    quality = relative_difference(
                        predictor.logits(np.stack([eager.prepare(d) for d in photos[:32]])), reference
                    )
                    shown = f"{quality:.1e}"
                row = {
                    "model": name,
                    "backend": backend,
                    "mb": size / 1e6,
                    "params": params,
                    "p50": p50,
                    "p95": p95,
                    "images_per_s_b16": rate,
                    "quality": quality,
                }
                results.append(row)
                print(
                    f"{name:<10} {backend:<18} {size / 1e6:>7.1f} {params / 1e6:>7.2f}M {p50 * 1e3:>8.1f} "
                    f"{p95 * 1e3:>8.1f} {rate:>10.1f} {shown:>18}",
                    flush=True,
                )
    for name in args.models:
        rows = {r["backend"]: r for r in results if r["model"] == name}
        eager = rows["pytorch eager"]
        for backend in ("onnxruntime int8", "onnxruntime int8 st"):
            if backend in rows:
                int8 = rows[backend]
                print(
                    f"{name}: {backend} (dynamic{'' if backend.endswith('int8') else ' -> static, QDQ'}) "
                    "single-photo p50 = "
                    f"{int8['p50'] / eager['p50']:.2f}x eager's; file {eager['mb'] / int8['mb']:.1f}x smaller"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
