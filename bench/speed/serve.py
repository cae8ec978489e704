"""Serving side by side: `foodvit serve` on a run (PyTorch) and on its .onnx exports (fp32 and int8, no
PyTorch), against the course's demo design, on the same model, photo and machine.

    python -m bench.speed.serve --run runs/demo              # a trained run (static int8 calibrates on its photos)
    python -m bench.speed.serve --servers peer ours-torch --clients 1 8 --seconds 8
    python -m bench.speed.serve --model ViT-B/16             # random weights of another model

Servers, each in its own process on 127.0.0.1:
- peer: the course's chapter-09 app: a `gr.Interface` around the eager PyTorch model
  (inputs=gr.Image(type="pil"), outputs a gr.Label and the prediction time), torchvision's
  transforms, one photo per call, Gradio's default queue; called as its page calls it (Gradio's
  API, through gradio_client);
- ours-torch: `foodvit serve RUN` (POST /predict; requests batched, up to 16);
- ours-torch-1: the same with --max-batch 1 (what batching buys);
- ours-onnx: `foodvit serve RUN.onnx` (`foodvit export`, fp32), ONNX Runtime, no PyTorch;
- ours-int8: `foodvit serve RUN-int8.onnx` (`foodvit export --quantize int8`), ONNX Runtime, no PyTorch.
N client threads (1, 8, 32) each keep one request in flight (the load is bounded), posting the same
FoodVision Mini photo as fast as the answers come back, for --seconds. Reported per row:
requests/s, latency p50/p95, errors; each server's resident memory after warm-up; the machine's
limit for the model: decode + preprocess of the photo + the batched forward pass (batch 16) per
photo, measured here in this process for each backend; throughput as a share of it. Clients and
servers share the machine (2 cores here): the clients' own cost is part of every row alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the test suite's server helpers
from helpers import free_port, start_server, stop_server  # noqa: E402

from bench.speed.models import in_work_folder, random_run  # noqa: E402
from foodvit.data.datasource import DataSource  # noqa: E402
from foodvit.deploy.predictor import Predictor  # noqa: E402

# The course's chapter-09 app.py, its design kept (a gr.Interface, one photo per call, the default
# queue), around the same trained model and its preprocessing written as torchvision transforms.
PEER_APP = """
import sys, time
import gradio as gr
import torch
from torchvision import transforms
from foodvit.rundir.trained import read_trained

model, class_names, pre, _ = read_trained(sys.argv[1])
model.eval()
resize = (transforms.Resize(pre.resize_size) if pre.mode == "crop"
          else transforms.Resize((pre.image_size, pre.image_size)))
model_transforms = transforms.Compose([resize, transforms.CenterCrop(pre.image_size), transforms.ToTensor(),
                                       transforms.Normalize(pre.mean, pre.std)])

def predict(img):
    start_time = time.perf_counter()
    img = model_transforms(img.convert("RGB")).unsqueeze(0)
    with torch.inference_mode():
        pred_probs = torch.softmax(model(img), dim=1)
    pred_labels_and_probs = {class_names[i]: float(pred_probs[0][i]) for i in range(len(class_names))}
    return pred_labels_and_probs, round(time.perf_counter() - start_time, 5)

demo = gr.Interface(fn=predict, inputs=gr.Image(type="pil"),
                    outputs=[gr.Label(num_top_classes=3, label="Predictions"), gr.Number(label="Prediction time (s)")],
                    title="FoodVision Mini", analytics_enabled=False)
demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[2]))
"""


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (Gradio starts none; uvicorn neither), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(make, clients: int, seconds: float) -> dict:
    """N threads, one request in flight each, for `seconds`. make() connects a client and returns
    its send() -> whether the answer was right; every client connects before the clock starts."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    ready, go, deadline = threading.Barrier(clients + 1), threading.Event(), [0.0]

    def client():
        send = make()
        ready.wait()
        go.wait()
        while time.monotonic() < deadline[0]:
            began = time.perf_counter()
            ok = send()
            elapsed = time.perf_counter() - began
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    began = time.monotonic()
    deadline[0] = began + seconds
    go.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    q = (
        statistics.quantiles(latencies, n=100)
        if len(latencies) > 1
        else [latencies[0] if latencies else float("nan")] * 99
    )
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors[0],
        "rps": len(latencies) / wall,
        "p50": q[49],
        "p95": q[94],
    }


def ours(url: str, photo: bytes):
    def make():
        http = httpx.Client(timeout=300)

        def send() -> bool:
            return http.post(url + "/predict", files={"file": ("photo.jpg", photo, "image/jpeg")}).status_code == 200

        return send

    return make


def peer(url: str, photo_path: Path):
    from gradio_client import Client, handle_file

    def make():
        client = Client(url + "/", verbose=False)

        def send() -> bool:
            label, _ = client.predict(handle_file(str(photo_path)), api_name="/predict")
            return bool(label.get("label"))

        return send

    return make


def limit(model: str, photo: bytes, batch: int = 16, seconds: float = 6.0) -> dict:
    """The machine's limit for the model: decode + preprocess one photo, plus the batched forward
    pass per photo; photos/s = 1 / (their sum)."""
    predictor = Predictor.open(model)
    prepare = []
    for _ in range(30):
        began = time.perf_counter()
        x = predictor.prepare(photo)
        prepare.append(time.perf_counter() - began)
    inputs = np.stack([x] * batch)
    predictor.probabilities(inputs)
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds or done < 3:
        predictor.probabilities(inputs)
        done += 1
    forward = (time.perf_counter() - began) / (done * batch)
    decode = statistics.median(prepare)
    return {
        "decode_preprocess_ms": decode * 1e3,
        "forward_ms_per_photo": forward * 1e3,
        "photos_per_s": 1 / (decode + forward),
    }


BACKEND = {"ours-onnx": "onnx", "ours-int8": "int8"}  # the others run the run directory's PyTorch model
LABEL = {  # each server as results/serving.csv names it
    "peer": "the course's gr.Interface design, PyTorch",
    "ours-torch": "foodvit serve RUN (PyTorch)",
    "ours-torch-1": "foodvit serve RUN --max-batch 1 (PyTorch)",
    "ours-onnx": "foodvit serve model.onnx (fp32, no PyTorch)",
    "ours-int8": "foodvit serve model-int8.onnx (int8, no PyTorch)",
}


def measure(work: Path, argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a trained run (default: the --model with random weights)")
    parser.add_argument(
        "--model", default="default", help="without --run: the architecture (default: the default recipe's)"
    )
    parser.add_argument(
        "--servers",
        nargs="+",
        default=["peer", "ours-torch", "ours-onnx", "ours-int8"],
        choices=["peer", "ours-torch", "ours-torch-1", "ours-onnx", "ours-int8"],
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=12.0, help="load time per row")
    parser.add_argument("--data", help="data source of the photo (default: $FOODVIT_DATA, else the course's zip)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--record", action="store_true", help="append each row to results/serving.csv")
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's quantiser advises on the root logger

    import torch

    from foodvit.deploy.export import export

    split = DataSource.parse(args.data).open_split("test")
    photo_path = split.samples[0][0]
    photo = photo_path.read_bytes()
    run = Path(args.run) if args.run else random_run(args.model, work / "run")
    models = {"peer": str(run), "ours-torch": str(run), "ours-torch-1": str(run)}
    if "ours-onnx" in args.servers:
        models["ours-onnx"] = export(run, work / "model.onnx", photos=[p for p, _ in split.samples[:16]], quiet=True)[
            "path"
        ]
    if "ours-int8" in args.servers:
        done = export(
            run, work / "model-int8.onnx", quantize="int8", photos=[p for p, _ in split.samples[:16]], quiet=True
        )
        models["ours-int8"] = done["path"]
        print(f"int8 export: {json.dumps({k: v for k, v in done.items() if k != 'path'})}")
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} | {time.strftime('%Y-%m-%d')} | "
        f"model {run} | photo {photo_path.name} ({len(photo) / 1000:.0f} kB) | {args.seconds:g} s a row"
    )
    limits = {}
    for name in args.servers:
        backend = BACKEND.get(name, "torch")
        if backend not in limits:
            limits[backend] = limit(models[name], photo)
            print(
                f"limit ({backend}): decode + preprocess {limits[backend]['decode_preprocess_ms']:.1f} ms + forward "
                f"{limits[backend]['forward_ms_per_photo']:.1f} ms/photo at batch 16 = "
                f"{limits[backend]['photos_per_s']:.0f} photos/s",
                flush=True,
            )
    print("| server | clients | requests/s | share of the limit | p50 ms | p95 ms | errors | RSS after warm-up MiB |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    env = {"GRADIO_ANALYTICS_ENABLED": "False"}
    for name in args.servers:
        port = free_port()
        if name == "peer":
            app = work / "peer_app.py"
            app.write_text(PEER_APP)
            process, url = start_server([sys.executable, str(app), str(run), str(port)], port, env=env, ready="/")
            make = peer(url, photo_path)
        else:
            batch = "1" if name == "ours-torch-1" else "16"
            process, url = start_server(
                [
                    sys.executable,
                    "-m",
                    "foodvit",
                    "serve",
                    models[name],
                    "--port",
                    str(port),
                    "--max-batch",
                    batch,
                    "--no-examples",
                ],
                port,
                env=env,
            )
            make = ours(url, photo)
        try:
            load(make, 2, 3.0)  # warm-up
            memory = rss_mib(process.pid)
            top = limits[BACKEND.get(name, "torch")]["photos_per_s"]
            for clients in args.clients:
                r = {"server": name, "rss_mib": memory, "limit": top, **load(make, clients, args.seconds)}
                results.append(r)
                if args.record:
                    from bench.results import record

                    record(
                        "serving",
                        {
                            "server": LABEL[name],
                            "clients": clients,
                            "requests_per_s": f"{r['rps']:.1f}",
                            "share_of_limit": f"{r['rps'] / top:.0%}",
                            "p50_ms": f"{r['p50'] * 1e3:.0f}",
                            "p95_ms": f"{r['p95'] * 1e3:.0f}",
                            "errors": r["errors"],
                            "resident_mib": f"{memory:.0f}",
                        },
                    )
                print(
                    f"| {name} | {clients} | {r['rps']:.1f} | {r['rps'] / top:.0%} | {r['p50'] * 1e3:.0f} | "
                    f"{r['p95'] * 1e3:.0f} | {r['errors']} | {memory:.0f} |",
                    flush=True,
                )
        finally:
            stop_server(process)
    by = {(r["server"], r["clients"]): r for r in results}
    for name in args.servers:
        if name != "peer" and ("peer", max(args.clients)) in by and (name, max(args.clients)) in by:
            c = max(args.clients)
            print(
                f"{name} / peer at {c} clients: {by[(name, c)]['rps'] / by[('peer', c)]['rps']:.1f}x requests/s; "
                f"p95 at {min(args.clients)} client(s): {by[(name, min(args.clients))]['p95'] * 1e3:.0f} ms vs "
                f"{by[('peer', min(args.clients))]['p95'] * 1e3:.0f} ms; memory {by[(name, c)]['rss_mib']:.0f} vs "
                f"{by[('peer', c)]['rss_mib']:.0f} MiB"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"limits": limits, "rows": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(in_work_folder(measure))
