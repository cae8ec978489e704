"""The static page of `foodvit export-web` in Chromium against `foodvit serve model.onnx` over HTTP, on
the same model file (fp32 as the page ships it, or int8 with --quantize), photos and machine.

    OMP_NUM_THREADS=1 FOODVIT_DATA=.../pizza_steak_sushi .venv/bin/python -m bench.speed.web --run runs/demo \
        --ort-web .cache/npm/onnxruntime-web-1.31.1.tgz [--quantize int8]

Measured, every figure a row of results/web.csv (with its command, machine, commit and date):
- agreement: the page's top class against `foodvit predict RUN` (PyTorch, fp32) on every test photo,
  and against the same .onnx run by Python's ONNX Runtime on Pillow's preprocessing (what is left
  is the page's own decoding and preprocessing graph); the largest probability difference of each;
- load: from opening the page to the three graphs ready and warmed up (a fresh browser: files fetched from
  the local server, WebAssembly compiled), and the server's start until /health answers;
- latency: one photo classified 20 times after a warm-up, the median: in the page the model's time
  (preprocessing graph and forward pass) and the whole (decode, model, overlay); for the server the
  HTTP round trip (upload, decode, preprocess, forward pass, JSON) from this process on one kept-alive
  connection, and the part of it the server spends on the photo (its answer's seconds);
- size: the site folder, its model and ONNX Runtime Web's files.
The page runs ONNX Runtime Web on one thread (WebAssembly, SIMD); the server is given one thread.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import free_port, start_server, stop_server  # noqa: E402

from bench.results import record  # noqa: E402

REPEATS = 20
CHROMIUM = "/usr/bin/chromium"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve_folder(folder: Path) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def page_answers(url: str, photos: list[Path]) -> dict:
    """The page's answers for `photos`, its load time and one photo's latencies, in a fresh Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        elsewhere = []
        page.route(
            "**/*",
            lambda r: r.continue_() if r.request.url.startswith(url) else (elsewhere.append(r.request.url), r.abort()),
        )
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=120_000)
        load_wall = time.perf_counter() - started
        load_page = page.evaluate("window.foodvit.loadMs")
        answers, count = [], 0

        def upload(photo: Path) -> dict:
            nonlocal count
            count += 1
            page.locator("#photo").set_input_files(str(photo))
            page.wait_for_function(
                f"() => document.body.dataset.state === 'error' || document.body.dataset.answers === '{count}'",
                timeout=120_000,
            )
            if page.evaluate("document.body.dataset.state") == "error":
                raise RuntimeError(page.locator("#error").inner_text())
            return page.evaluate("window.foodvit.last")

        upload(photos[0])  # warm-up: the first run of each graph
        for photo in photos:
            answers.append(upload(photo))
        repeated = [upload(photos[0]) for _ in range(REPEATS)]
        browser.close()
    assert not elsewhere, f"the page asked for {elsewhere}"
    return {
        "answers": answers,
        "load_ms": load_page,
        "load_wall_s": load_wall,
        "model_ms": statistics.median(a["modelMs"] for a in repeated),
        "total_ms": statistics.median(a["totalMs"] for a in repeated),
    }


def server_figures(model: Path, photo: Path) -> dict:
    import httpx

    port = free_port()
    started = time.perf_counter()
    process, url = start_server(
        [sys.executable, "-m", "foodvit", "serve", str(model), "--port", str(port), "--threads", "1", "--no-examples"],
        port,
    )
    ready = time.perf_counter() - started
    try:
        data = photo.read_bytes()
        times, inside = [], []
        with httpx.Client(timeout=60) as client:  # one kept-alive connection, as a browser's
            for i in range(REPEATS + 1):
                t = time.perf_counter()
                response = client.post(url + "/predict", files={"file": (photo.name, data)})
                response.raise_for_status()
                if i:  # the first is the warm-up
                    times.append((time.perf_counter() - t) * 1000)
                    inside.append(1000 * response.json()["seconds"])
    finally:
        stop_server(process)
    return {"ready_s": ready, "http_ms": statistics.median(times), "server_ms": statistics.median(inside)}


def compare(answers: list[dict], reference: list[np.ndarray], classes: list[str]) -> tuple[float, float]:
    same, worst = 0, 0.0
    for answer, expected in zip(answers, reference, strict=True):
        shown = np.array([answer["probabilities"][c] for c in classes])
        same += int(shown.argmax() == expected.argmax())
        worst = max(worst, float(np.abs(shown - expected).max()))
    return same / len(answers), worst


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a run trained on FoodVision Mini")
    parser.add_argument(
        "--ort-web", help="onnxruntime-web's .tgz or dist/ (default: foodvit's cache, else npm's registry)"
    )
    parser.add_argument(
        "--quantize", choices=["int8", "int8-dynamic", "int8-static"], help="an int8 model, as export-web --quantize"
    )
    parser.add_argument(
        "--no-record", action="store_true", help="print the figures without appending them to results/web.csv"
    )
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(
        logging.ERROR
    )  # ONNX Runtime's quantiser's generic advice, as the command line quiets it

    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.web.site import export_web

    predictor = Predictor.from_run(args.run)
    photos = predictor.photos_at_hand(10_000)  # every test photo of every class
    if not photos:
        raise SystemExit("no test photos: set FOODVIT_DATA to FoodVision Mini")
    with tempfile.TemporaryDirectory(prefix="foodvit-bench-web-") as tmp:
        site = Path(tmp) / "site"
        exported = export_web(args.run, site, quantize=args.quantize, ort_web=args.ort_web, quiet=True)
        onnx_predictor = Predictor.from_onnx(site / "model.onnx", threads=1)
        torch_p = [predictor.classify(p)["probabilities"] for p in photos]
        onnx_p = [
            onnx_predictor.probabilities(onnx_predictor.prepare(load_or_explain(p), str(p))[None])[0] for p in photos
        ]
        torch_p = [np.array([d[c] for c in predictor.classes]) for d in torch_p]
        server, url = serve_folder(site)
        try:
            page = page_answers(url, photos)
        finally:
            server.shutdown()
            server.server_close()
        served = server_figures(site / "model.onnx", photos[0])
        sizes = {
            "site": sum(p.stat().st_size for p in site.rglob("*") if p.is_file()),
            "model": (site / "model.onnx").stat().st_size,
            "runtime": sum(p.stat().st_size for p in (site / "ort").iterdir()),
        }
    agree_torch, diff_torch = compare(page["answers"], torch_p, predictor.classes)
    agree_onnx, diff_onnx = compare(page["answers"], onnx_p, predictor.classes)
    precision = "int8" if args.quantize else "fp32"
    rows = [
        ("page top-1 agreement with foodvit predict (PyTorch fp32)", 100 * agree_torch, "%"),
        ("page max probability difference from foodvit predict", diff_torch, "probability"),
        (
            f"page top-1 agreement with the same {precision} .onnx in Python (Pillow preprocessing)",
            100 * agree_onnx,
            "%",
        ),
        (f"page max probability difference from the same {precision} .onnx in Python", diff_onnx, "probability"),
        (
            "export-web's own check (page path in Python vs predict), top-1 agreement",
            100 * exported["agreement"]["agreement"],
            "%",
        ),
        ("page model load (fetch + compile + 3 sessions + a warm-up photo, in the page)", page["load_ms"], "ms"),
        ("page open to ready (wall, from this process)", 1000 * page["load_wall_s"], "ms"),
        ("page per-photo model time (preprocess graph + forward), median of 20", page["model_ms"], "ms"),
        ("page per-photo total (decode + model + overlay), median of 20", page["total_ms"], "ms"),
        ("foodvit serve model.onnx: start until /health answers", 1000 * served["ready_s"], "ms"),
        ("foodvit serve model.onnx: POST /predict round trip, median of 20", served["http_ms"], "ms"),
        (
            "foodvit serve model.onnx: decode + preprocess + model in the server (its seconds), median of 20",
            served["server_ms"],
            "ms",
        ),
        ("site folder size", sizes["site"] / 1e6, "MB"),
        ("model.onnx size", sizes["model"] / 1e6, "MB"),
        ("ONNX Runtime Web files size", sizes["runtime"] / 1e6, "MB"),
    ]
    command = "python -m bench.speed.web " + " ".join(argv if argv is not None else sys.argv[1:])
    for what, value, unit in rows:
        print(f"{what}: {value:.4g} {unit}")
        if not args.no_record:
            record(
                "web",
                {
                    "what": what,
                    "value": float(f"{float(value):.4g}"),  # four significant digits: a 2e-5 difference stays one
                    "unit": unit,
                    "model": precision,
                    "photos": len(photos),
                    "run": Path(args.run).name,
                },
                command=command,
            )


if __name__ == "__main__":
    main()
