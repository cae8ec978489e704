"""`foodvit export-web RUN --out SITE`: the demo as a folder of static files, the model run in the
browser by ONNX Runtime Web (the library side: deploy/web/)."""

from __future__ import annotations

import argparse
import shlex

from foodvit.cli.common import count, export_interrupted, need
from foodvit.settings.fields import Range


def register(sub) -> None:
    """Add export-web to the `foodvit` subparsers `sub`."""
    from foodvit.deploy.web.runtime import PACK, REGISTRY_ENV, VERSION

    p = sub.add_parser(
        "export-web",
        help="a static web page that classifies photos in the browser (no server to run)",
        description="Writes index.html, its script, the model (.onnx, fp32 unless --quantize, with its attention "
        "output), the preprocessing and the attention overlay as two ONNX graphs, the class names and model card "
        "(JSON), "
        f"ONNX Runtime Web {VERSION}'s JavaScript and WebAssembly, example photos and a README "
        "into a new or empty folder. The page needs no network: serve the folder from any static "
        "host, or locally with `python -m http.server`.",
    )
    p.add_argument("run", help="a trained run directory")
    p.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p.add_argument(
        "--quantize",
        choices=["int8", "int8-dynamic", "int8-static"],
        help="an int8 model, made as foodvit export --quantize makes it: a file about 3.5x smaller; for the default "
        "recipe's model slower in the browser than fp32 (the default) and less close to foodvit predict",
    )
    p.add_argument(
        "--ort-web",
        metavar="PATH",
        help="ONNX Runtime Web's files: its dist/ folder, a folder above it, or the "
        f"package's .tgz (`{PACK}`); default: foodvit's download cache, else "
        f"the npm registry (${REGISTRY_ENV} to use another)",
    )
    p.add_argument(
        "--examples",
        type=count(Range(0)),
        default=1,
        help="example photos per class from the run's test photos (default 1)",
    )
    p.set_defaults(func=cmd_export_web, on_interrupt=export_interrupted)


def cmd_export_web(args: argparse.Namespace) -> int:
    import logging

    from foodvit.deploy.web.site import export_web

    need("export", "onnx", "onnxruntime", "onnxscript")
    logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's quantiser's generic advice (as cmd_export)
    result = export_web(
        args.run,
        args.out,
        quantize=args.quantize,
        ort_web=args.ort_web,
        examples_per_class=args.examples,
    )
    measured = result["agreement"]
    same = "no test photos at hand to compare"
    if measured["photos"]:
        same = (
            f"same top class as foodvit predict on {measured['agreement']:.0%} of {measured['photos']} test "
            f"photos, largest probability difference {measured['max_difference']:.3f}"
        )
    size, model = result["bytes"] / 1e6, result["model_bytes"] / 1e6
    # what was run: the page's graphs, in this Python; ONNX Runtime Web runs only in a browser (its files are the
    # published package's, checked by their hashes)
    print(
        f"{result['path']}: {size:.1f} MB (model {model:.1f} MB); the page's graphs in Python's ONNX Runtime "
        f"(ONNX Runtime Web itself runs only in a browser): {same}"
    )
    print(
        f"open it: cd {shlex.quote(str(result['path']))} && python -m http.server 8000, then http://localhost:8000/ ; "
        "publish: copy the folder to any static host (see its README.md)"
    )
    return 0
