"""A trained model shipped: `foodvit export` (one file: ONNX, TorchScript, torch.export), `serve`
(a web demo and HTTP API) and `export-space` (a Hugging Face Space folder)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from foodvit.cli.common import (
    count,
    export_interrupted,
    need,
    number,
)
from foodvit.settings.fields import Range


def register(sub) -> None:
    """Add export, serve, export-space to the subcommands."""
    for add in (_add_export, _add_serve, _add_export_space):
        add(sub)


def _add_export(sub) -> None:
    """The parser of `foodvit export`."""
    p = sub.add_parser(
        "export",
        help="a trained run as one file to ship: ONNX (fp32 or int8), TorchScript or torch.export",
        description="Writes the model with its class names and preprocessing, then checks it against the "
        "PyTorch model on real photos (fp32 fails above 1e-4 relative logit difference). An .onnx "
        "file predicts without PyTorch: foodvit predict model.onnx photo.jpg (pip install 'foodvit[onnx]').",
    )
    p.add_argument("run", help="a trained run directory")
    p.add_argument("--format", default="onnx", choices=["onnx", "torchscript", "exported-program"], help="default onnx")
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="the file to write, named for its format: model.onnx (onnx), "
        "model.pt (torchscript), model.pt2 (exported-program)",
    )
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists (default: refuse)")
    p.add_argument(
        "--quantize",
        choices=["int8", "int8-dynamic", "int8-static"],
        help="ONNX only, ONNX Runtime's quantisation: int8-dynamic (int8 weights), int8-static (QDQ, calibrated on "
        "the run's training photos), or int8: both measured, the faster that keeps top-1 within 1 point of fp32 (when "
        "neither does, the more agreeing)",
    )
    p.add_argument(
        "--with-attention",
        action="store_true",
        help="ONNX only: a second output, the attention rollout over the patch grid (the map foodvit explain "
        "draws), so that foodvit serve model.onnx shows the page's attention overlay",
    )
    p.add_argument("--opset", type=count(Range(18, 30)), help="ONNX opset (default: the exporter's)")
    p.add_argument(
        "--photos",
        nargs="+",
        metavar="PHOTO",
        help="photos for the parity check, the first 8 used (default: a few of the run's test photos of each class)",
    )
    p.set_defaults(func=cmd_export, on_interrupt=export_interrupted)


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        need("export", "onnx", "onnxruntime", "onnxscript")
    import logging

    from foodvit.deploy.export import export

    # this process exports: ONNX Runtime's quantiser logs generic advice (pre-process the model first) on the
    # root logger, which the parity line below answers better
    logging.getLogger().setLevel(logging.ERROR)

    result = export(
        args.run,
        args.out,
        args.format,
        args.quantize,
        args.opset,
        photos=args.photos or (),
        force=args.force,
        with_attention=args.with_attention,
    )
    what = (
        args.format
        + (f" {args.quantize}" if args.quantize else "")
        + (" with attention" if args.with_attention else "")
    )
    attention = "" if result["attention"] is None else f", attention rollout within {result['attention']:.1e}"
    print(
        f"{result['path']}: {what}, {result['bytes'] / 1e6:.1f} MB; parity on {result['photos']} photos: max relative "
        f"logit difference {result['parity']:.2e}, same top class on {result['agreement']:.0%}{attention}"
    )
    if result["quantization"]:
        from foodvit.deploy.quantize import describe

        print(f"quantisation: {describe(result['quantization'])}")
    return 0


def _add_serve(sub) -> None:
    """The parser of `foodvit serve`."""
    p = sub.add_parser(
        "serve",
        help="a web demo and an HTTP prediction service for a trained run or an .onnx file (needs foodvit[serve])",
        description="One process serves the demo page (GET /), the JSON API (POST /predict with the photo in the "
        "form field 'file'; GET /health) and Gradio's own API, from one loaded model. Concurrent "
        "requests are batched. An .onnx file (foodvit export) is served by ONNX Runtime, "
        "without PyTorch.",
    )
    p.add_argument(
        "run",
        help="a run directory (or a folder with model.safetensors and model.json), or an .onnx file "
        "written by foodvit export (--with-attention for the page's attention overlay)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)",
    )
    p.add_argument("--port", type=count(Range(1, 65535)), default=7860, help="port (default 7860)")
    p.add_argument(
        "--max-batch",
        type=count(),
        default=16,
        help="most requests run as one forward pass (default 16; 1 serves one at a time)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=number(Range(0, 1000)),
        default=5.0,
        help="how long the first request of a batch waits for others, in ms (default 5)",
    )
    p.add_argument(
        "--max-upload-mb",
        type=number(Range(0, lo_open=True)),
        default=10.0,
        help="uploads over this size are refused with 413 (default 10 MB)",
    )
    p.add_argument(
        "--max-megapixels",
        type=number(Range(0, 89.4, lo_open=True)),  # photos.MAX_PIXELS, Pillow's own ceiling
        default=50.0,
        help="photos over this many pixels are refused with 413 before they are decoded (default 50, the limit "
        "of every foodvit command: a 48-megapixel phone's photos pass; the model needs far fewer, and larger "
        "photos are decoded reduced)",
    )
    p.add_argument("--top-k", type=count(), default=3, help="how many classes each answer ranks (default 3)")
    p.add_argument(
        "--threads",
        type=count(),
        help="threads for the model: PyTorch's, or ONNX Runtime's for an .onnx file "
        "(default: the library's choice for this machine)",
    )
    p.add_argument(
        "--no-examples",
        action="store_true",
        help="no example photos on the page (default: one per class from the run's test photos, when they are at hand)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    need("serve", "fastapi", "uvicorn", "gradio", "multipart")
    from foodvit.deploy.serve import serve

    onnx = str(args.run).lower().endswith(".onnx")
    if not Path(args.run).exists():
        from foodvit.errors import RunError

        raise RunError(
            f"{args.run} does not exist; give a run directory written by foodvit train (or an exported Space's "
            "model/ folder), or an .onnx file written by foodvit export"
        )
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # this process serves: nothing leaves the machine
    if onnx:
        need("onnx", "onnxruntime")  # and no PyTorch: ONNX Runtime takes --threads itself
    elif args.threads:
        import torch

        torch.set_num_threads(args.threads)
    serve(
        args.run,
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        top_k=args.top_k,
        max_upload_mb=args.max_upload_mb,
        max_megapixels=args.max_megapixels,
        examples=not args.no_examples,
        threads=args.threads if onnx else None,
    )
    return 0


def _add_export_space(sub) -> None:
    """The parser of `foodvit export-space`."""
    p = sub.add_parser(
        "export-space",
        help="a folder ready for a Hugging Face Space: app.py, the model, examples, README",
        description="Writes app.py, requirements.txt, model/ (model.safetensors + model.json), examples/, "
        "the foodvit package itself and a README with the Space's metadata into a new or empty "
        "folder. `python app.py` in that folder serves the demo offline. With --onnx the model is an "
        ".onnx file and the Space needs no PyTorch.",
    )
    p.add_argument("run", help="a trained run directory")
    p.add_argument("folder", help="the folder to write (new or empty)")
    p.add_argument(
        "--examples",
        type=count(Range(0)),
        default=2,
        help="example photos per class from the run's test photos (default 2)",
    )
    p.add_argument(
        "--onnx",
        action="store_true",
        help="the model as model.onnx (with its attention output), run by ONNX "
        "Runtime: the Space installs no PyTorch (needs foodvit[export] here)",
    )
    p.add_argument(
        "--quantize",
        choices=["int8", "int8-dynamic", "int8-static"],
        help="with --onnx: an int8 model, as foodvit export --quantize makes it",
    )
    p.set_defaults(func=cmd_export_space, on_interrupt=export_interrupted)


def cmd_export_space(args: argparse.Namespace) -> int:
    if args.onnx:
        need("export", "onnx", "onnxruntime", "onnxscript")
        import logging

        logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's quantiser's generic advice (as cmd_export)
    from foodvit.deploy.space import export_space

    folder = export_space(
        args.run, args.folder, examples_per_class=args.examples, onnx=args.onnx, quantize=args.quantize
    )
    if args.examples and not any((Path(folder) / "examples").iterdir()):
        print(
            "note: no example photos: the run's photos are not at hand here (set FOODVIT_DATA to a folder of them, "
            "or copy a few photos into the Space's examples/)",
            file=sys.stderr,
        )
    what = " (ONNX Runtime, no PyTorch)" if args.onnx else ""
    print(
        f"Space ready in {folder}{what}: cd {shlex.quote(str(folder))} && python app.py  "
        "(offline, http://127.0.0.1:7860/); to publish, push the folder to a Hugging Face Space"
    )
    return 0
