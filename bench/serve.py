"""Serving throughput and latency of `foodvit serve`, with and without request batching.

    .venv/bin/python bench/serve.py [--models default ViT-B/16] [--clients 1 8 32] [--seconds 12]

For each model (the default recipe's architecture, and ViT-B/16 with 3 classes; random weights:
speed does not depend on them) the real server is started in its own process on 127.0.0.1, once
with batching (--max-batch 16) and once serving one request at a time (--max-batch 1). N client
threads then post the same FoodVision Mini photo to /predict (decoding included) as fast as the
answers come back, for a fixed time. Reported: requests/s and latency p50/p95/p99 per number of
clients, and the batched/one-at-a-time throughput ratio. Clients and server share this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import free_port, start_server, stop_server  # noqa: E402
from models import random_run  # noqa: E402

from foodvit.data.datasource import DataSource  # noqa: E402


def load(url: str, photo: bytes, clients: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors = [0]
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client():
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < stop:
                started = time.perf_counter()
                response = http.post(url + "/predict", files={"file": ("photo.jpg", photo, "image/jpeg")})
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status_code == 200:
                        latencies.append(elapsed)
                    else:
                        errors[0] += 1

    began = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [latencies[0]] * 99
    return {"clients": clients, "requests": len(latencies), "errors": errors[0], "rps": len(latencies) / wall,
            "p50": q[49], "p95": q[94], "p99": q[98]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["default", "ViT-B/16"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=12.0, help="load time per measurement")
    parser.add_argument("--data", help="data source of the photo (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    split = DataSource.parse(args.data).open_split("test")
    photo = split.samples[0][0].read_bytes()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores | {time.strftime('%Y-%m-%d')} | "
          f"photo {split.samples[0][0].name} ({len(photo) / 1000:.0f} kB), {args.seconds:g} s per row")
    print(f"{'model':<10} {'batching':<16} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>6}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            run = random_run(name, Path(tmp) / name.replace("/", "-"))
            for mode, max_batch in (("batched (16)", 16), ("one at a time", 1)):
                port = free_port()
                process, url = start_server([sys.executable, "-m", "foodvit", "serve", str(run), "--port", str(port),
                                             "--max-batch", str(max_batch), "--no-examples"], port)
                try:
                    load(url, photo, 2, 2.0)  # warm-up
                    for clients in args.clients:
                        r = {"model": name, "batching": mode, **load(url, photo, clients, args.seconds)}
                        results.append(r)
                        print(f"{name:<10} {mode:<16} {clients:>7} {r['rps']:>8.1f} {r['p50'] * 1e3:>8.0f} {r['p95'] * 1e3:>8.0f} "
                              f"{r['p99'] * 1e3:>8.0f} {r['errors']:>6}", flush=True)
                finally:
                    stop_server(process)
    for name in args.models:
        for clients in args.clients:
            rows = {r["batching"]: r for r in results if r["model"] == name and r["clients"] == clients}
            if len(rows) == 2:
                ratio = rows["batched (16)"]["rps"] / rows["one at a time"]["rps"]
                print(f"{name}, {clients} clients: batched / one at a time = {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
