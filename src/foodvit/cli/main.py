"""The `foodvit` command: its parser and its entry point; each subcommand is a function of
cli/commands.py, a thin shell over the library.

Errors a user can act on (FoodVitError) are printed on one line and exit 2; anything else is a
bug and keeps its traceback (so does every error under --debug). Heavy libraries (PyTorch,
torchvision, matplotlib) are imported by the subcommands that need them, never to show help.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foodvit.cli.commands import (
    cmd_compare,
    cmd_cv,
    cmd_data,
    cmd_evaluate,
    cmd_explain,
    cmd_export,
    cmd_export_space,
    cmd_inspect,
    cmd_models,
    cmd_patches,
    cmd_predict,
    cmd_recipes,
    cmd_serve,
    cmd_summary,
    cmd_train,
    cmd_tune,
)
from foodvit.cli.options import add_config_options, number_type
from foodvit.errors import AT_LEAST_0, AT_LEAST_1, POSITIVE, FoodVitError, Range


def number(allowed: Range):
    """argparse type: a float in range, refused with the range otherwise."""

    return number_type(float, allowed)


def count(allowed: Range = AT_LEAST_1):
    """An argparse type for a whole number in a range, with the range in its message."""

    return number_type(int, allowed)


def recipe_options(parser: argparse.ArgumentParser, recipe_help: str) -> None:
    """What train, cv and tune share: a recipe, a model, and an option per setting over them."""
    parser.add_argument("--recipe", help=recipe_help)
    parser.add_argument("--model", help="a paper name, e.g. ViT-B/16, ViT-Ti/8 (default: the recipe's)")
    add_config_options(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foodvit", description="A paper-faithful Vision Transformer for FoodVision Mini and your own photos.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verbose = {"action": "store_true", "help": "list every skipped (unreadable) photo, not only how many"}

    p = sub.add_parser("train", help="train a model; writes a run directory with report, metrics and model",
                       description="Train from a recipe (default: the best small-data recipe). Any setting can be overridden. "
                                   "Boolean settings are flags with a --no- form (--freeze-backbone, --no-cache); true/false also work.")
    p.add_argument("--out", help="run directory, a new or empty folder (default: runs/<date>-<time>)")
    p.add_argument("--resume", metavar="DIR", help="finish the interrupted run in DIR, with its own settings and data "
                                                   "(--data: the same photos moved elsewhere)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines (the run directory and the result are still printed)")
    p.add_argument("--verbose", **verbose)
    p.add_argument("--dist-timeout", type=number(POSITIVE), default=600, metavar="SECONDS",
                   help="under torchrun: how long a process waits for the others before it stops with a message (default 600)")
    recipe_options(p, "a recipe name (see `foodvit recipes`) or a .toml file")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("cv", help="k-fold cross-validation of a recipe over the training photos alone (never the test split)",
                       description="Each fold is a normal run inside STUDY (STUDY/fold-0, ...) trained on the other folds and "
                                   "scored on its own; every held-out photo's prediction is kept. Writes STUDY/cv.json, cv.md and "
                                   "predictions.jsonl. An interrupted study resumes: finished folds are kept. The same command in a "
                                   "second process (or machine sharing the folder) takes the folds the first is not training. "
                                   "--compare A B pairs two studies photo by photo.")
    p.add_argument("--out", metavar="STUDY", help="the study folder (new, empty, or this same study to resume)")
    p.add_argument("--folds", type=count(Range(2)), default=5, help="folds (default 5)")
    p.add_argument("--seeds", type=count(), default=1, help="repeat with this many seeds (the recipe's seed and on; default 1)")
    p.add_argument("--compare", nargs=2, metavar="STUDY", help="pair two studies photo by photo (no training); over the folds both have finished, while either is unfinished")
    p.add_argument("--teachers", metavar="STUDY", help="borrow the trained CNN teachers (--guidance, --distill) of a study of the same "
                   "photos, folds and teacher settings, instead of training them again: the same teachers, a third less time "
                   "for a study of a change to the ViT")
    p.add_argument("--fold", type=count(AT_LEAST_0), action="append", metavar="K",
                   help="run fold K of each seed alone (0 to --folds minus 1; again for more: --fold 0 --fold 2), e.g. to spread "
                        "a study over machines or a queue of jobs; the study's files are written once every fold has run")
    p.add_argument("--jobs", type=count(), default=1, metavar="N",
                   help="train N folds at once, in N processes on an equal share of the cores each "
                        "(default 1: one fold at a time on every core; --jobs 2 on 2 cores keeps both busy)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    recipe_options(p, "a recipe name (see `foodvit recipes`) or a .toml file")
    p.set_defaults(func=cmd_cv)

    p = sub.add_parser("tune", help="search settings for your photos with Optuna (TPE, pruning by fold), scored by k-fold CV",
                       description="Each trial is a k-fold cross-validation (over the training photos alone) of the recipe "
                                   "with sampled settings; a trial whose running mean accuracy after a fold is below the median "
                                   "of earlier trials at that fold is pruned. The study lives in STUDY/study.db (SQLite): "
                                   "rerun the command to resume or add trials, from several processes at once if you like. "
                                   "Writes STUDY/best.toml (foodvit train --recipe STUDY/best.toml), tune.md and plots.")
    p.add_argument("--out", required=True, metavar="STUDY", help="the study folder (new, empty, or this same study to continue)")
    p.add_argument("--trials", type=count(), help="trials this command runs (default: until --budget, else 20)")
    p.add_argument("--budget", metavar="TIME", help="wall-clock time for this command, e.g. 2h, 45m, 90s, 1h30m: no trial "
                                                    "starts after it, and no fold after a trial's first that would end past it")
    p.add_argument("--space", metavar="FILE", help="a TOML search space (default: lr, weight decay, augmentation, depth, width, "
                                                   "image size, drloc, init, drop_path, epochs around the recipe's values)")
    p.add_argument("--folds", type=count(Range(2)), default=3, help="folds per trial (default 3)")
    p.add_argument("--storage", metavar="URL", help="an Optuna RDB URL instead of STUDY/study.db, e.g. "
                                                    "postgresql://user@host/db or mysql://user@host/db (many machines, one study)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-trial lines")
    recipe_options(p, "the starting recipe (its values are the first trial; default: default)")
    p.set_defaults(func=cmd_tune)

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

    p = sub.add_parser("predict", help="classify photos with a trained run: a few, or whole folders into a CSV / JSONL file",
                       description="Classify local photos: files, folders (every photo under them, hidden ones left out) or a "
                                   "list file. A photo that cannot be read is reported and skipped (exit status 1); URLs are "
                                   "not read: download the photo first. With --out, rows are written a batch at a time and "
                                   "running the same command again continues where it stopped; under torchrun each process "
                                   "labels its share and the first merges them.")
    p.add_argument("run", help="a run directory (or its model.safetensors), or an exported .onnx file")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="photo files (JPEG, PNG, WebP, ...) or folders of them")
    p.add_argument("--files-from", metavar="FILE", help="also the photos listed in FILE, one path a line (- reads standard input)")
    p.add_argument("--top-k", type=count(), default=3, help="how many classes to list per photo, most probable first (default 3)")
    p.add_argument("--plot", metavar="FILE", help="save the photos with their labels and probabilities as a PNG")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per photo (with 'error' for a skipped one)")
    p.add_argument("--out", metavar="FILE", help="write a row per photo to FILE, .csv or .jsonl, as each batch finishes "
                                                 "(path, label, probability, top_k, error); an existing FILE of the same model is "
                                                 "continued: the photos already in it are skipped")
    p.add_argument("--batch-size", type=count(), default=64, help="with --out: photos per forward pass (default 64)")
    p.add_argument("--workers", type=count(Range(0)), default=2,
                   help="with --out: threads decoding photos while the model runs (default 2; 0 decodes in line)")
    p.add_argument("--quiet", action="store_true", help="with --out: no progress bar")
    p.add_argument("--dist-timeout", type=number(POSITIVE), default=600, metavar="SECONDS",
                   help="under torchrun: how long the first process waits for the others' parts (default 600)")
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
    p.add_argument("--quantize", choices=["int8", "int8-dynamic", "int8-static"],
                   help="ONNX only, ONNX Runtime's quantisation: int8-dynamic (int8 weights), int8-static (QDQ, calibrated on "
                        "the run's training photos), or int8: both measured, the faster that keeps top-1 within 1 point of fp32")
    p.add_argument("--with-attention", action="store_true",
                   help="ONNX only: a second output, the attention rollout over the patch grid (the map foodvit explain "
                        "draws), so that foodvit serve model.onnx shows the page's attention overlay")
    p.add_argument("--opset", type=count(Range(18, 30)), help="ONNX opset (default: the exporter's)")
    p.add_argument("--photos", nargs="+", metavar="PHOTO", help="photos for the parity check (default: the run's test photos)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("serve", help="a web demo and an HTTP prediction service for a trained run or an .onnx file (needs foodvit[serve])",
                       description="One process serves the demo page (GET /), the JSON API (POST /predict with the photo in the "
                                   "form field 'file'; GET /health) and Gradio's own API, from one loaded model. Concurrent "
                                   "requests are batched. An .onnx file (foodvit export) is served by ONNX Runtime, "
                                   "without PyTorch.")
    p.add_argument("run", help="a run directory (or a folder with model.safetensors and model.json), or an .onnx file "
                               "written by foodvit export (--with-attention for the page's attention overlay)")
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
    p.add_argument("--threads", type=count(), help="threads for the model: PyTorch's, or ONNX Runtime's for an .onnx file "
                                                   "(default: the library's choice for this machine)")
    p.add_argument("--no-examples", action="store_true", help="no example photos on the page (default: one per class "
                                                              "from the run's test photos, when they are at hand)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("export-space", help="a folder ready for a Hugging Face Space: app.py, the model, examples, README",
                       description="Writes app.py, requirements.txt, model/ (model.safetensors + model.json), examples/, "
                                   "the foodvit package itself and a README with the Space's metadata into a new or empty "
                                   "folder. `python app.py` in that folder serves the demo offline. With --onnx the model is an "
                                   ".onnx file and the Space needs no PyTorch.")
    p.add_argument("run", help="a trained run directory")
    p.add_argument("folder", help="the folder to write (new or empty)")
    p.add_argument("--examples", type=count(Range(0)), default=2, help="example photos per class from the run's test photos (default 2)")
    p.add_argument("--onnx", action="store_true", help="the model as model.onnx (with its attention output), run by ONNX "
                                                       "Runtime: the Space installs no PyTorch (needs foodvit[export] here)")
    p.add_argument("--quantize", choices=["int8", "int8-dynamic", "int8-static"],
                   help="with --onnx: an int8 model, as foodvit export --quantize makes it")
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
                print(f"\ninterrupted: every finished epoch (and stage) is saved in {where}; continue with `foodvit train --resume {where}`",
                      file=sys.stderr)
            else:
                print("\ninterrupted before the first epoch finished: nothing was saved", file=sys.stderr)
        elif args.command == "predict" and getattr(args, "out", None):
            print(f"\ninterrupted: every finished batch is kept in {args.out}; run the same command again to label the rest",
                  file=sys.stderr)
        elif args.command in ("cv", "tune") and getattr(args, "out", None):
            print(f"\ninterrupted: finished folds are kept in {args.out}; run the same command again to go on", file=sys.stderr)
        else:
            print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `foodvit models | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
