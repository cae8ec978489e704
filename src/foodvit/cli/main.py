"""The `foodvit` command: a thin shell over the library. One subcommand a function.

Errors a user can act on (FoodVitError) are printed on one line and exit 2; anything else is a
bug and keeps its traceback (so does every error under --debug). Heavy libraries (PyTorch,
torchvision, matplotlib) are imported by the subcommands that need them, never to show help.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from foodvit.errors import AT_LEAST_1, POSITIVE, FoodVitError, Range


def cmd_train(args: argparse.Namespace) -> int:
    from foodvit.cli.options import build_config, given_overrides
    from foodvit.errors import ConfigError
    from foodvit.training.trainer import default_out, resume, train

    main_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 alone speaks
    say = (lambda text: print(text, file=sys.stderr)) if main_process else (lambda text: None)

    if args.resume:
        extra = [o for o in given_overrides(args) if o != "data.source"] + (["--recipe"] if args.recipe else []) + \
            (["--model"] if args.model else [])
        if extra or args.out:
            flags = ["--" + o.split(".", 1)[1].replace("_", "-") if "." in o else o for o in extra] + (["--out"] if args.out else [])
            raise ConfigError(f"--resume continues the run exactly as configured in {args.resume}/config.json; "
                              f"drop {', '.join(flags)}, or start a new run with --out (--data may point at the run's photos moved elsewhere)")
        args.run_dir = args.resume
        say(f"run directory: {args.resume}")
        result = resume(args.resume, quiet=args.quiet, data=getattr(args, "data.source"), verbose=args.verbose,
                        timeout_s=args.dist_timeout)
    else:
        config = build_config(args.recipe or "default", args, model=args.model)
        args.run_dir = args.out or str(default_out())
        say(f"run directory: {args.run_dir}")
        result = train(config, args.run_dir, quiet=args.quiet, verbose=args.verbose, timeout_s=args.dist_timeout)
    if not main_process:
        return 0
    print(f"test accuracy {result.test['acc']:.3f} ({round(result.test['acc'] * result.test['n'])}/{result.test['n']} photos); "
          f"report: {result.run / 'report.md'}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import evaluate_split
    from foodvit.deploy.predictor import Predictor

    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    split = _evaluation_source(args.run, args.data, predictor).open_split(args.split, strict=args.strict)
    for line in split.skipped_summary(args.verbose):
        print(line, file=sys.stderr)
    result = evaluate_split(predictor, split)
    if args.json:
        print(json.dumps(result))
        return 0
    correct = round(result["accuracy"] * result["n"])
    print(f"{args.split} accuracy {result['accuracy']:.4f} ({correct}/{result['n']} photos), loss {result['loss']:.4f}")
    for name, acc in result["per_class"].items():
        print(f"  {name:<20} {acc:.3f}")
    return 0


def _evaluation_source(run: str, data: str | None, predictor):
    """The photos to evaluate a model on: --data; else, for a run directory, the source stored with
    it (its class subset included); for an exported file, the first of its own data and
    $FOODVIT_DATA that is at hand (an export never starts a download)."""
    from foodvit.data.datasource import DataSource
    from foodvit.errors import DataError

    if data:
        return DataSource.parse(data)
    config = Path(run) / "config.json"
    if config.is_file():
        from foodvit.rundir.directory import read_config

        return DataSource.parse(read_config(config).data.source)
    for source in predictor.data_sources():
        if source.root_at_hand() is not None:
            return source
    raise DataError(f"the photos {Path(run).name} was trained on are not at hand here; name them with --data PATH "
                    "(a folder with test/<class>/, or a folder of class folders)")


def cmd_predict(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import predict
    from foodvit.deploy.predictor import Predictor

    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    results = predict(predictor, args.images, top_k=args.top_k)
    if args.plot:
        from foodvit.deploy.inference import plot_predictions
        from foodvit.viz.plotting import save_figure

        save_figure(plot_predictions(args.images, results), _writable(args.plot))
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"foodvit predict: skipped {r['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            if "error" in r:
                continue
            others = ", ".join(f"{label} {p:.3f}" for label, p in r["top_k"][1:])
            print(f"{r['image']}: {r['label']} ({r['probability']:.3f}){'; then ' + others if others else ''}  [{r['seconds'] * 1000:.0f} ms]")
        if args.plot:
            print(f"plot: {args.plot}")
    return 1 if failed else 0


def _writable(path: str) -> Path:
    """An output file's path, or a one-line error before any work is lost to an unwritable place."""
    from foodvit.errors import RunError

    out = Path(path)
    if out.is_dir():
        raise RunError(f"{out} is a folder; give a file name, e.g. {out / 'picture.png'}")
    folder = out.parent if str(out.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot create the folder {folder} for {out} ({err.strerror or err}); choose another path") from None
    if not os.access(folder, os.W_OK):
        raise RunError(f"cannot write to {folder} (read-only or not yours); choose another path for {out.name}")
    return out


def cmd_data(args: argparse.Namespace) -> int:
    from foodvit.data.datasource import DataSource
    from foodvit.data.folders import check, is_food101

    source = DataSource.parse(args.source)
    root = source.root()
    if args.print_path:
        print(root)
        return 0
    print(f"data: {root}" + (" (Food-101 layout)" if is_food101(root) else "") + (f", classes {', '.join(source.classes)}" if source.classes else ""))
    for split in ("train", "test"):
        if is_food101(root) or (root / split).is_dir():
            s = check(source.listing(split, root), quiet=False)
            print(f"  {split}: {len(s)} photos, {len(s.classes)} classes; " + ", ".join(f"{k} {v}" for k, v in list(s.counts().items())[:12])
                  + (" ..." if len(s.classes) > 12 else ""))
            for line in s.skipped_summary(args.verbose):
                print(f"  {line}")
    return 0


def cmd_patches(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.viz.attention import feature_maps
    from foodvit.viz.figures import add_feature_maps, patches_figure
    from foodvit.viz.plotting import save_figure

    out = _writable(args.out)
    photo = load_or_explain(Path(args.image))
    predictor = model = None
    if args.feature_maps:
        from foodvit.deploy.predictor import Predictor

        predictor = Predictor.from_run(args.feature_maps)
        model = predictor.model
    size = args.image_size or (model.config.image_size if model else 224)
    patch = args.patch_size or (model.config.patch_size if model else 16)
    fig = patches_figure(photo, size, patch, predictor.preprocess if predictor is not None else None)
    if predictor is not None:
        import torch

        x = torch.from_numpy(predictor.prepare(photo))[None]
        fig = add_feature_maps(fig, feature_maps(model, x, args.channels))
    print(save_figure(fig, out))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.viz.figures import explain_figure
    from foodvit.viz.plotting import save_figure

    out = _writable(args.out)
    predictor = Predictor.from_run(args.run)
    photo = load_or_explain(Path(args.image))
    print(save_figure(explain_figure(predictor, photo, args.top_k, args.heads), out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.errors import RunError
    from foodvit.viz.attention import attention_distances_over
    from foodvit.viz.figures import attention_distance_figure, filters_figure, pos_similarity_figure
    from foodvit.viz.plotting import save_figure

    predictor = Predictor.from_run(args.run)
    model = predictor.model
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file; inspect writes three pictures into a folder: choose a folder")
    _writable(str(out / "filters.png"))
    written = []
    if model.config.stem == "patch":
        written.append(save_figure(filters_figure(model), out / "filters.png"))
    else:
        print("filters.png: skipped, the model's convolutional stem has no single set of P x P filters", file=sys.stderr)
    if model.config.pos_embed == "learned":
        written.append(save_figure(pos_similarity_figure(model), out / "pos_similarity.png"))
    else:
        print(f"pos_similarity.png: skipped, the model's position embedding is {model.config.pos_embed!r}, not learned, "
              "so there is nothing learned to compare", file=sys.stderr)
    split = _evaluation_source(args.run, args.data, predictor).open_split(args.split)
    photos = split.samples[:: max(1, len(split.samples) // args.images)][: args.images]  # spread over the classes
    images = torch.stack([torch.from_numpy(predictor.prepare(load_or_explain(path), str(path))) for path, _ in photos])
    distances = attention_distances_over(model, images)
    written.append(save_figure(attention_distance_figure(distances, model.config.image_size), out / "attention_distance.png"))
    for path in written:
        print(path)
    return 0


def _need(extra: str, *modules: str) -> None:
    """A one-line error naming the extra to install when an optional library is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise FoodVitError(f"this command needs {', '.join(missing)}, which come with the {extra} extra: "
                           f"pip install 'foodvit[{extra}]'")


def cmd_serve(args: argparse.Namespace) -> int:
    _need("serve", "fastapi", "uvicorn", "gradio", "multipart")
    from foodvit.deploy.serve import serve

    if not Path(args.run).exists():
        from foodvit.errors import RunError

        raise RunError(f"{args.run} does not exist; give a run directory written by foodvit train (or an exported Space's model/ folder)")
    serve(args.run, host=args.host, port=args.port, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, top_k=args.top_k,
          max_upload_mb=args.max_upload_mb, max_megapixels=args.max_megapixels, threads=args.threads, examples=not args.no_examples)
    return 0


def cmd_export_space(args: argparse.Namespace) -> int:
    from foodvit.deploy.space import export_space

    folder = export_space(args.run, args.folder, examples_per_class=args.examples)
    print(f"Space ready in {folder}: cd {folder} && python app.py  (offline, http://127.0.0.1:7860/); "
          "to publish, push the folder to a Hugging Face Space")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        _need("export", "onnx", "onnxruntime", "onnxscript")
    from foodvit.deploy.export import export

    result = export(args.run, args.out, args.format, args.quantize, args.opset, photos=args.photos or (), force=args.force)
    what = args.format + (f" {args.quantize}" if args.quantize else "")
    print(f"{result['path']}: {what}, {result['bytes'] / 1e6:.1f} MB; parity on {result['photos']} photos: max relative logit "
          f"difference {result['parity']:.2e}, same top class on {result['agreement']:.0%}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    import torch

    from foodvit.model.summary import format_summary
    from foodvit.model.variants import create_model

    with torch.device("meta"):
        model = create_model(args.model, num_classes=args.num_classes, image_size=args.image_size)
    print(format_summary(model, (args.batch_size, 3, args.image_size, args.image_size), args.depth))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from foodvit.rundir.compare import compare_runs

    print(compare_runs([Path(r) for r in args.runs]))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from foodvit.model.variants import get_variant, list_models

    for name in list_models():
        v = get_variant(name)
        print(f"{name:<10} layers {v.size.depth:>2}  D {v.size.embed_dim:>4}  MLP {v.size.mlp_dim:>4}  heads {v.size.num_heads:>2}  "
              f"params {v.num_params:>13,}  ({v.size.source})")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from foodvit.config import list_recipes, recipe_path

    for name in list_recipes():
        first = recipe_path(name).read_text().splitlines()[0].lstrip("# ").strip()
        print(f"{name:<18} {first}")
    return 0


def number(allowed: Range):
    """argparse type: a float in range, refused with the range otherwise."""
    from foodvit.cli.options import number_type

    return number_type(float, allowed)


def count(allowed: Range = AT_LEAST_1):
    """An argparse type for a whole number in a range, with the range in its message."""
    from foodvit.cli.options import number_type

    return number_type(int, allowed)


def build_parser() -> argparse.ArgumentParser:
    from foodvit.cli.options import add_config_options

    parser = argparse.ArgumentParser(prog="foodvit", description="A paper-faithful Vision Transformer for FoodVision Mini and your own photos.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verbose = {"action": "store_true", "help": "list every skipped (unreadable) photo, not only how many"}

    p = sub.add_parser("train", help="train a model; writes a run directory with report, metrics and model",
                       description="Train from a recipe (default: the best small-data recipe). Any setting can be overridden. "
                                   "Boolean settings are flags with a --no- form (--freeze-backbone, --no-cache); true/false also work.")
    p.add_argument("--recipe", help="a recipe name (see `foodvit recipes`) or a .toml file")
    p.add_argument("--model", help="a paper name, e.g. ViT-B/16, ViT-Ti/8 (default: the recipe's)")
    p.add_argument("--out", help="run directory, a new or empty folder (default: runs/<date>-<time>)")
    p.add_argument("--resume", metavar="DIR", help="finish the interrupted run in DIR, with its own settings and data "
                                                   "(--data: the same photos moved elsewhere)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines (the run directory and the result are still printed)")
    p.add_argument("--verbose", **verbose)
    p.add_argument("--dist-timeout", type=number(POSITIVE), default=600, metavar="SECONDS",
                   help="under torchrun: how long a process waits for the others before it stops with a message (default 600)")
    add_config_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="several runs side by side: the settings that differ and the final metrics",
                       description="For people without TensorBoard: each run's differing settings and its final metrics, as a table.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories written by foodvit train")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("evaluate", help="per-image accuracy of a trained run on a split")
    p.add_argument("run", help="a run directory (or its model.safetensors), or an exported .onnx file")
    p.add_argument("--data", help="data source (default: the one stored with the run)")
    p.add_argument("--split", default="test", help="the split folder to evaluate: test (default), train, or any <root>/<split>/")
    p.add_argument("--strict", action="store_true", help="refuse unreadable files instead of skipping them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verbose", **verbose)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("predict", help="classify photos with a trained run",
                       description="Classify local photo files. A photo that cannot be read is reported and skipped "
                                   "(exit status 1); URLs are not read: download the photo first.")
    p.add_argument("run", help="a run directory (or its model.safetensors), or an exported .onnx file")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="photo files (JPEG, PNG, WebP, ...)")
    p.add_argument("--top-k", type=count(), default=3, help="how many classes to list per photo, most probable first (default 3)")
    p.add_argument("--plot", metavar="FILE", help="save the photos with their labels and probabilities as a PNG")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per photo (with 'error' for a skipped one)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("patches", help="a photo cut into the model's patch grid (and the patch embedding's feature maps)")
    p.add_argument("image", help="a photo file")
    p.add_argument("--image-size", type=count(), help="default 224, or the run's with --feature-maps")
    p.add_argument("--patch-size", type=count(), help="default 16, or the run's with --feature-maps")
    p.add_argument("--feature-maps", metavar="RUN", help="add the patch embedding's output channels of this run's model")
    p.add_argument("--channels", type=count(), default=5, help="how many feature maps (default 5)")
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_patches)

    p = sub.add_parser("explain", help="a prediction with its top-k probabilities and attention rollout heat map")
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("image", help="a photo file")
    p.add_argument("--top-k", type=count(), default=3, help="how many classes to show (default 3)")
    p.add_argument("--heads", action="store_true", help="also each head's last-layer attention, read out as the model pools")
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("inspect", help="the paper's Figure 7 for a run: filters, position similarity, attention distance")
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("--data", help="photos for the attention distances (default: the run's data)")
    p.add_argument("--split", default="test", help="the split to take photos from (default test)")
    p.add_argument("--images", type=count(), default=32, help="how many photos to average the attention distance over (default 32)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the pictures into")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("export", help="a trained run as one file to ship: ONNX (fp32 or int8), TorchScript or torch.export",
                       description="Writes the model with its class names and preprocessing, then checks it against the "
                                   "PyTorch model on real photos (fp32 fails above 1e-4 relative logit difference). An .onnx "
                                   "file predicts without PyTorch: foodvit predict model.onnx photo.jpg (pip install 'foodvit[onnx]').")
    p.add_argument("run", help="a trained run directory")
    p.add_argument("--format", default="onnx", choices=["onnx", "torchscript", "exported-program"], help="default onnx")
    p.add_argument("--out", required=True, metavar="FILE", help="the file to write, named for its format: model.onnx (onnx), "
                                                                "model.pt (torchscript), model.pt2 (exported-program)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists (default: refuse)")
    p.add_argument("--quantize", choices=["int8"], help="ONNX only: int8 weights (ONNX Runtime's dynamic quantisation)")
    p.add_argument("--opset", type=count(Range(18, 30)), help="ONNX opset (default: the exporter's)")
    p.add_argument("--photos", nargs="+", metavar="PHOTO", help="photos for the parity check (default: the run's test photos)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("serve", help="a web demo and an HTTP prediction service for a trained run (needs foodvit[serve])",
                       description="One process serves the demo page (GET /), the JSON API (POST /predict with the photo in the "
                                   "form field 'file'; GET /health) and Gradio's own API, from one loaded model. Concurrent "
                                   "requests are batched.")
    p.add_argument("run", help="a run directory (or a folder with model.safetensors and model.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                                                       "0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=count(Range(1, 65535)), default=7860, help="port (default 7860)")
    p.add_argument("--max-batch", type=count(), default=16,
                   help="most requests run as one forward pass (default 16; 1 serves one at a time)")
    p.add_argument("--max-wait-ms", type=number(Range(0, 1000)), default=5.0,
                   help="how long the first request of a batch waits for others, in ms (default 5)")
    p.add_argument("--max-upload-mb", type=number(Range(0, lo_open=True)), default=10.0,
                   help="uploads over this size are refused with 413 (default 10 MB)")
    p.add_argument("--max-megapixels", type=number(Range(0, 89.4, lo_open=True)), default=50.0,
                   help="photos over this many pixels are refused with 413 before they are decoded (default 50, "
                        "a 48-megapixel phone's photos pass; the model needs far fewer, and larger photos are decoded reduced)")
    p.add_argument("--top-k", type=count(), default=3, help="how many classes each answer ranks (default 3)")
    p.add_argument("--threads", type=count(), help="PyTorch threads for the model (default: PyTorch's choice for this machine)")
    p.add_argument("--no-examples", action="store_true", help="no example photos on the page (default: one per class "
                                                              "from the run's test photos, when they are at hand)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("export-space", help="a folder ready for a Hugging Face Space: app.py, the model, examples, README",
                       description="Writes app.py, requirements.txt, model/ (model.safetensors + model.json), examples/, "
                                   "the foodvit package itself and a README with the Space's metadata into a new or empty "
                                   "folder. `python app.py` in that folder serves the demo offline.")
    p.add_argument("run", help="a trained run directory")
    p.add_argument("folder", help="the folder to write (new or empty)")
    p.add_argument("--examples", type=count(Range(0)), default=2, help="example photos per class from the run's test photos (default 2)")
    p.set_defaults(func=cmd_export_space)

    p = sub.add_parser("data", help="download / unpack a data source and show what it holds")
    p.add_argument("source", nargs="?", help="URL, zip or folder (default: $FOODVIT_DATA, else the course's zip)")
    p.add_argument("--print-path", action="store_true", help="print only the local folder")
    p.add_argument("--verbose", **verbose)
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("summary", help="layer-by-layer table of a model: shapes, parameters, trainable")
    p.add_argument("model", help="a paper name, e.g. ViT-B/16 (see `foodvit models`)")
    p.add_argument("--num-classes", type=count(), default=1000, help="classes of the head (default 1000, ImageNet's)")
    p.add_argument("--image-size", type=count(), default=224, help="input resolution in pixels (default 224)")
    p.add_argument("--batch-size", type=count(), default=1, help="batch size in the shapes (default 1)")
    p.add_argument("--depth", type=count(), default=2, help="how deep to list nested modules (default 2)")
    p.set_defaults(func=cmd_summary)

    sub.add_parser("models", help="list the registered model names").set_defaults(func=cmd_models)
    sub.add_parser("recipes", help="list the built-in recipes").set_defaults(func=cmd_recipes)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command not in ("recipes", "models", "summary", "compare"):
            from foodvit.data.photos import limit_pixels

            limit_pixels()  # every photo this command opens: over the pixel limit is refused, not warned about
        return args.func(args)
    except FoodVitError as err:
        if args.debug:
            raise
        print(f"foodvit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "train":
            where = getattr(args, "run_dir", None)
            if where and (Path(where) / "checkpoint.pt").exists():
                print(f"\ninterrupted: every finished epoch is saved in {where}; continue with `foodvit train --resume {where}`",
                      file=sys.stderr)
            else:
                print("\ninterrupted before the first epoch finished: nothing was saved", file=sys.stderr)
        else:
            print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `foodvit models | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
