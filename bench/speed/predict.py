"""Labelling a collection: photos/s of the real command, `foodvit predict MODEL --files-from
LIST --out predictions.csv`, against the machine's ceiling for that model, with its peak memory.

    python -m bench.speed.predict                          # the whole grid (about 30 minutes on 2 CPU cores)
    python -m bench.speed.predict --models default --backends torch --workers 0,2 --photos 2000

For each model (the default recipe's ViT-Ti/8 at 96 px; ViT-B/16 at 224 px) and backend (PyTorch from
a run folder; the int8 .onnx `foodvit export --quantize int8` writes, run by ONNX Runtime without
PyTorch), random weights (labelling costs the same whatever they are):
- the ceiling: the batched forward pass alone (Predictor.probabilities on a batch decoded
  beforehand), in this process: the most labelling could reach here;
- the command with 0, 1 and 2 decoding threads (--workers), each a fresh process, timed by the
  command itself (its photos/s line: listing, decoding, preprocessing, the model, writing rows);
  the share of the ceiling it reaches; the peak resident memory of the largest process;
- for the default model, the same command over 1,000 and over all photos (flat memory is the goal),
  and on 2 processes under torchrun (each its half; rank 0 merges).

The photos are bench/speed/scale.py's (smooth random colour fields with noise, 682 x 512 px JPEGs, about
95 KB each, generated once into bench/.cache/scale-<n>), listed in a file (no argument limit).
ViT-B/16 runs over the first --large-photos of them: at a few photos a second on a CPU, the rate is
steady long before 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.speed.models import in_work_folder, random_run
from bench.speed.scale import generate

HERE = Path(__file__).resolve().parents[1]  # bench/: its .cache folder

from foodvit.deploy.labelling import PhotoList  # noqa: E402
from foodvit.deploy.predictor import Predictor  # noqa: E402

# runs a command and prints the peak resident memory (KiB) of the largest process under it
PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print('peak-kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(done.returncode)"
)


def ceiling(model: str, photos: list[str], batch_size: int, seconds: float = 8.0) -> float:
    """Photos/s of the batched forward pass alone, on one batch decoded beforehand."""
    predictor = Predictor.open(model)
    batch = np.stack([predictor.prepare(p) for p in photos[:batch_size]])
    predictor.probabilities(batch)  # warm-up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done < 2:
        predictor.probabilities(batch)
        done += 1
    return done * len(batch) / (time.perf_counter() - started)


def label(model: str, listing: Path, workers: int, batch_size: int, processes: int = 1) -> dict:
    """The command, in a fresh process (or torchrun's): its photos/s, wall time and peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "predict",
            model,
            "--files-from",
            str(listing),
            "--out",
            str(Path(tmp) / "predictions.csv"),
            "--workers",
            str(workers),
            "--batch-size",
            str(batch_size),
            "--quiet",
        ]
        command = (
            [sys.executable, "-m", "foodvit"]
            if processes == 1
            else [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(processes),
                "-m",
                "foodvit",
            ]
        )
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PEAK, *command, *args], capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command + args)} failed:\n{done.stderr[-3000:]}")
        rows = sum(1 for _ in (Path(tmp) / "predictions.csv").open()) - 1
    rate = float(re.search(r"([\d.]+) photos/s", done.stderr).group(1))
    peak = int(re.search(r"peak-kib (\d+)", done.stderr).group(1))
    return {"photos_per_s": rate, "wall_s": wall, "rows": rows, "peak_mib": peak / 1024}


def measure(work: Path, argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=10_000)
    parser.add_argument("--large-photos", type=int, default=500, help="photos for ViT-B/16 (default 500)")
    parser.add_argument("--models", default="default,ViT-B/16")
    parser.add_argument("--backends", default="torch,int8")
    parser.add_argument("--workers", default="0,1,2", help="decoding threads to measure, comma-separated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-scaling", action="store_true", help="leave out the 1,000-photo and 2-process rows")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    import logging

    import onnxruntime
    import torch

    logging.getLogger().setLevel(
        logging.ERROR
    )  # ONNX Runtime's quantiser advises on the root logger (as the command line quiets it)

    from foodvit.deploy.export import export

    root = generate(HERE / ".cache" / f"scale-{args.photos}", args.photos)
    listed = list(PhotoList([root / "images"]))[: args.photos]
    lists = {}
    for n in sorted({args.photos, min(1000, args.photos), min(args.large_photos, args.photos)}):
        lists[n] = work / f"photos-{n}.txt"
        lists[n].write_text("\n".join(map(str, listed[:n])) + "\n")
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), onnxruntime {onnxruntime.__version__}, {time.strftime('%Y-%m-%d')}; "
        f"batch {args.batch_size}; photos: 682 x 512 px JPEGs"
    )
    print(
        "| model | backend | photos | processes | workers | photos/s | share of the ceiling | wall s (whole command) "
        "| peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    results = []

    def row(name, backend, n, processes, workers, r, top):
        r = {
            "model": name,
            "backend": backend,
            "photos": n,
            "processes": processes,
            "workers": workers,
            **r,
            "ceiling": top,
        }
        results.append(r)
        assert r["rows"] == n, r
        print(
            f"| {name} | {backend} | {n:,} | {processes} | {workers} | {r['photos_per_s']:.1f} | "
            f"{r['photos_per_s'] / top:.0%} | {r['wall_s']:.1f} | {r['peak_mib']:.0f} |",
            flush=True,
        )

    for name in args.models.split(","):
        run = random_run(name, work / name.replace("/", "-"))
        n = args.photos if name == "default" else min(args.large_photos, args.photos)
        for backend in args.backends.split(","):
            model = str(run)
            if backend == "int8":
                model = export(
                    run, work / f"{name.replace('/', '-')}-int8.onnx", quantize="int8", photos=listed[:16], quiet=True
                )["path"]
            top = ceiling(model, listed, args.batch_size)
            results.append({"model": name, "backend": backend, "ceiling": top})
            print(f"| {name} | {backend} | (forward pass alone) | | | {top:.1f} | 100% | | |", flush=True)
            for workers in (int(w) for w in args.workers.split(",")):
                row(name, backend, n, 1, workers, label(model, lists[n], workers, args.batch_size), top)
            if name == "default" and not args.no_scaling:
                best = max(
                    (r for r in results if r.get("rows") and r["model"] == name and r["backend"] == backend),
                    key=lambda r: r["photos_per_s"],
                )["workers"]
                small = min(1000, n)
                row(name, backend, small, 1, best, label(model, lists[small], best, args.batch_size), top)
                row(name, backend, n, 2, best, label(model, lists[n], best, args.batch_size, processes=2), top)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(in_work_folder(measure))
