"""Publishing without PyTorch: the Space `foodvit export-space` writes for a run, as it is
(PyTorch) and with --onnx --quantize int8, each installed from its own requirements.txt into a fresh
virtual environment: the installed size, and the cold start to the first answer.

    python -m bench.speed.space --run runs/demo --work /tmp/spaces          # install, then time
    python -m bench.speed.space --run runs/demo --work /tmp/spaces --starts 5  # again: reuses the installs

Size: the bytes of the environment's files (du), an empty environment's taken off, so that what
remains is what the requirements bring. Cold start: `python app.py` started in the Space's folder
(its own environment, offline: FOODVIT_DATA unset), timed until POST /predict answers a
FoodVision Mini photo; median of --starts starts (the page cache of the files stays warm between
starts: a first start after a reboot is slower for both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import free_port  # noqa: E402

from foodvit.data.datasource import DataSource  # noqa: E402

KINDS = {"pytorch": [], "onnx-int8": ["--onnx", "--quantize", "int8"]}


def du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def install(space: Path, env: Path) -> dict:
    """A fresh virtual environment with the Space's requirements; its size over an empty one's."""
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    empty = du(env)
    started = time.perf_counter()
    done = subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(space / "requirements.txt")],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"installing {space / 'requirements.txt'} failed:\n{done.stderr[-3000:]}")
    frozen = subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True
    ).stdout.split()
    return {
        "install_s": time.perf_counter() - started,
        "bytes": du(env) - empty,
        "packages": len(frozen),
        "torch": any(line.lower().startswith("torch") for line in frozen),
    }


def cold_start(space: Path, env: Path, photo: bytes, timeout: float = 300) -> float:
    """Seconds from `python app.py` to the first answer of POST /predict."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if k not in ("FOODVIT_DATA", "PYTHONPATH")}
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(env / "bin" / "python"), "app.py"],
        cwd=space,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"},
    )
    try:
        while time.perf_counter() - started < timeout:
            if process.poll() is not None:
                raise SystemExit(f"{space}/app.py exited with {process.returncode}")
            try:
                answer = httpx.post(
                    f"http://127.0.0.1:{port}/predict", files={"file": ("photo.jpg", photo, "image/jpeg")}, timeout=60
                )
                if answer.status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise SystemExit(f"{space}/app.py did not answer within {timeout:.0f} s")
    finally:
        process.terminate()
        process.wait(timeout=30)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", required=True, help="a trained run (its photos at hand: the exports check parity on them)"
    )
    parser.add_argument(
        "--work", type=Path, required=True, help="where the Spaces and their environments go (kept, reused)"
    )
    parser.add_argument("--starts", type=int, default=3, help="cold starts timed per Space (median; 0: install only)")
    parser.add_argument("--data", help="data source of the photo (default: $FOODVIT_DATA)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--record", action="store_true", help="append each Space's row to results/space.csv")
    args = parser.parse_args(argv)
    photo = DataSource.parse(args.data).open_split("test").samples[0][0].read_bytes()
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()} | "
        f"{time.strftime('%Y-%m-%d')} | run {args.run}"
    )
    print(
        "| Space | installed MB | packages | torch installed | pip install s | cold start to first answer s (median) "
        "| starts |"
    )
    print("|---|---|---|---|---|---|---|")
    results = {}
    for kind, options in KINDS.items():
        space, env = args.work / f"space-{kind}", args.work / f"env-{kind}"
        if not (space / "app.py").is_file():
            subprocess.run(
                [sys.executable, "-m", "foodvit", "export-space", args.run, str(space), *options],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        record = args.work / f"install-{kind}.json"
        if not record.is_file():
            record.write_text(json.dumps(install(space, env)))
        r = json.loads(record.read_text())
        starts = [cold_start(space, env, photo) for _ in range(args.starts)]
        r.update(cold_start_s=statistics.median(starts) if starts else float("nan"), starts=starts)
        results[kind] = r
        if args.record:
            from bench.results import record

            record(
                "space",
                {
                    "space": f"foodvit export-space RUN DIR {' '.join(KINDS[kind])}".strip(),
                    "installed_mb": f"{r['bytes'] / 1e6:.0f}",
                    "packages": r["packages"],
                    "pytorch": "yes" if r["torch"] else "no",
                    "cold_start_s": f"{r['cold_start_s']:.1f}",
                },
            )
        print(
            f"| {kind} | {r['bytes'] / 1e6:,.0f} | {r['packages']} | {'yes' if r['torch'] else 'no'} | "
            f"{r['install_s']:.0f} | {r['cold_start_s']:.1f} | {', '.join(f'{s:.1f}' for s in starts)} |",
            flush=True,
        )
    a, b = results["pytorch"], results["onnx-int8"]
    print(
        f"onnx-int8 / pytorch: installed size {b['bytes'] / a['bytes']:.2f}x ({a['bytes'] / b['bytes']:.0f}x smaller), "
        f"cold start {b['cold_start_s'] / a['cold_start_s']:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
