"""Training at scale: images/s of one epoch over 10,000 generated JPEG photos (512 px, like
Food-101's), in Food-101's layout, on 1 and 2 processes (torchrun, gloo on the CPU; NCCL on GPUs),
with the decode cache on and off and 0, 1 or 2 loader workers; the share of the epoch spent in
the model step (not waiting for batches, from metrics.csv's model_share); the wall time of the
whole command (start, listing and checking the photos, the cache's decoding, the epoch, the test
evaluation); and the peak resident memory of the largest process.

    python -m bench.speed.scale                        # the full grid on this machine
    python -m bench.speed.scale --photos 2000 --grid 1,off,0 1,on,0 2,off,1
    python -m bench.speed.scale --gpu                  # on a GPU machine: batch 256, workers 0/4/8

The photos are generated once into bench/.cache/scale-<n> (smooth random colour fields with
noise, so that they compress like photos: 682 x 512 px, about 95 KB each). Each configuration is a fresh
`foodvit train` (tiny recipe, 64 px, batch 32, 1 epoch); figures are from that one epoch.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def generate(root: Path, n: int, classes: int = 10, size: int = 512, test_share: float = 0.05) -> Path:
    """n training photos (and test_share as many test photos) in Food-101's layout, once."""
    from PIL import Image
    from tqdm import tqdm

    if (root / "meta" / "test.json").is_file():
        return root
    rng = np.random.default_rng(0)
    meta = {"train": {}, "test": {}}
    per_class = n // classes
    n_test = max(1, int(per_class * test_share))
    with tqdm(total=classes * (per_class + n_test), desc=f"generating {root.name}", unit="photo") as bar:
        for c in range(classes):
            name = f"class_{c:03d}"
            (root / "images" / name).mkdir(parents=True, exist_ok=True)
            for split, count in (("train", per_class), ("test", n_test)):
                ids = []
                for i in range(count):
                    coarse = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
                    image = Image.fromarray(coarse).resize((size * 4 // 3, size), Image.BICUBIC)
                    pixels = np.asarray(image, dtype=np.int16) + rng.integers(
                        -12, 13, (size, size * 4 // 3, 3), dtype=np.int16
                    )
                    entry = f"{name}/{split}{i:05d}"
                    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
                        root / "images" / f"{entry}.jpg", quality=90
                    )
                    ids.append(entry)
                    bar.update(1)
                meta[split][name] = ids
    (root / "meta").mkdir(exist_ok=True)
    for split in ("train", "test"):
        (root / "meta" / f"{split}.json").write_text(json.dumps(meta[split]))
    return root


def run(data: Path, processes: int, cache: bool, workers: int, batch: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        args = [
            "--recipe",
            "tiny",
            "--data",
            str(data),
            "--epochs",
            "1",
            "--batch-size",
            str(batch),
            "--workers",
            str(workers),
            "--cache" if cache else "--no-cache",
            "--device",
            device,
            "--quiet",
            "--out",
            str(out),
        ]
        if processes == 1:
            command = [sys.executable, "-m", "foodvit", "train", *args]
        else:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(processes),
                "-m",
                "foodvit",
                "train",
                *args,
            ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall = time.perf_counter() - started
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with (out / "metrics.csv").open() as f:
            row = list(csv.DictReader(f))[-1]
    return {
        "processes": processes,
        "cache": cache,
        "workers": workers,
        "images_per_s": float(row["images_per_s"]),
        "model_share": float(row["model_share"]),
        "epoch_s": float(row["seconds"]),
        "wall_s": wall,
        # ru_maxrss of the children is the largest single process so far: only a new maximum shows
        "peak_gib": peak_kib / 2**20 if peak_kib > before else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=int, default=10_000)
    parser.add_argument(
        "--grid", nargs="*", help="processes,cache(on|off),workers triples (default: all of 1-2 x on/off x 0-2)"
    )
    parser.add_argument("--gpu", action="store_true", help="on a GPU: batch 256, workers 0, 4, 8")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    data = generate(HERE / ".cache" / f"scale-{args.photos}", args.photos)
    batch, device = (256, "cuda") if args.gpu else (32, "cpu")
    worker_counts = (0, 4, 8) if args.gpu else (0, 1, 2)
    if args.grid:
        grid = [(int(p), c == "on", int(w)) for p, c, w in (g.split(",") for g in args.grid)]
    else:  # cache off first: ru_maxrss only ever grows, so the smaller peaks must come first
        grid = [(p, c, w) for c in (False, True) for p in (1, 2) for w in worker_counts]
    import torch

    print(
        f"# {args.photos} photos of 512 px, {os.cpu_count()} CPU cores, torch {torch.__version__}, device {device}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(
        "| processes | cache | workers | images/s (epoch) | model step share | epoch s | wall s (whole command) "
        "| peak RSS GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for processes, cache, workers in grid:
        r = run(data, processes, cache, workers, batch, device)
        results.append(r)
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "<= above"
        print(
            f"| {processes} | {'on' if cache else 'off'} | {workers} | {r['images_per_s']:.0f} | "
            f"{r['model_share']:.0%} | {r['epoch_s']:.1f} | {r['wall_s']:.1f} | {peak} |",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
