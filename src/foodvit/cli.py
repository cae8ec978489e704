"""The `foodvit` command: a thin shell over the library. One subcommand a function."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


def cmd_train(args: argparse.Namespace) -> int:
    from .config import apply_overrides, given_overrides, load_recipe
    from .trainer import resume, train

    if args.resume:
        extra = [o for o in given_overrides(args)] + (["--recipe"] if args.recipe else []) + (["--model"] if args.model else [])
        if extra or args.out:
            raise ValueError(f"--resume continues the run exactly as configured in {args.resume}/config.json; "
                             f"drop {', '.join(extra + (['--out'] if args.out else []))}, or start a new run with --out")
        result = resume(args.resume, quiet=args.quiet)
    else:
        recipe = load_recipe(args.recipe or "default")
        if getattr(args, "train.pretrained") and not recipe.train.pretrained:
            # a from-scratch recipe used for transfer: its model settings (size, pooling, 64 px ...)
            # are not meant for the weights; keep only its regularisation
            recipe = replace(recipe, vit={k: v for k, v in recipe.vit.items() if k in ("dropout", "attn_dropout", "drop_path")})
        config = apply_overrides(recipe, args, model=args.model)
        if config.train.pretrained:
            from .pretrained import adapt_config

            config = adapt_config(config, explicit_model=args.model)
        result = train(config, args.out, quiet=args.quiet)
    if not args.quiet:
        print(f"test accuracy {result.test['acc']:.3f} ({round(result.test['acc'] * result.test['n'])}/{result.test['n']} photos); "
              f"report: {result.run / 'report.md'}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from . import data as D
    from .inference import evaluate_split
    from .run import load_model

    model = load_model(args.run)
    split = D.open_split(args.data or _run_source(args.run), args.split, strict=args.strict)
    result = evaluate_split(model, split)
    if args.json:
        print(json.dumps(result))
        return 0
    correct = round(result["accuracy"] * result["n"])
    print(f"{args.split} accuracy {result['accuracy']:.4f} ({correct}/{result['n']} photos), loss {result['loss']:.4f}")
    for name, acc in result["per_class"].items():
        print(f"  {name:<20} {acc:.3f}")
    return 0


def _run_source(run: str) -> str | None:
    config = Path(run) / "config.json"
    return json.loads(config.read_text())["data"]["source"] or None if config.is_file() else None


def cmd_predict(args: argparse.Namespace) -> int:
    from .inference import plot_predictions, predict
    from .report import save_figure
    from .run import load_model

    model = load_model(args.run)
    results = predict(model, args.images, top_k=args.top_k)
    if args.plot:
        save_figure(plot_predictions(args.images, results), Path(args.plot))
    if args.json:
        print(json.dumps(results))
        return 0
    for r in results:
        others = ", ".join(f"{label} {p:.3f}" for label, p in r["top_k"][1:])
        print(f"{r['image']}: {r['label']} ({r['probability']:.3f}){'; then ' + others if others else ''}  [{r['seconds'] * 1000:.0f} ms]")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from . import data as D

    root = D.resolve(args.source)
    if args.print_path:
        print(root)
        return 0
    print(f"data: {root}")
    for split in ("train", "test"):
        if (root / split).is_dir():
            s = D.scan(root / split, strict=False)
            print(f"  {split}: {len(s)} photos; " + ", ".join(f"{k} {v}" for k, v in s.counts().items()))
    return 0


def cmd_patches(args: argparse.Namespace) -> int:
    from . import data as D
    from . import viz
    from .report import save_figure

    photo = D.load_or_explain(Path(args.image))
    model = None
    if args.feature_maps:
        from .run import load_model

        model = load_model(args.feature_maps)
    size = args.image_size or (model.config.image_size if model else 224)
    patch = args.patch_size or (model.config.patch_size if model else 16)
    fig = viz.patches_figure(photo, size, patch, model.preprocess if model is not None else None)
    if model is not None:
        from .transforms import eval_transform

        x = eval_transform(model.preprocess)(photo).unsqueeze(0)
        fig = viz.add_feature_maps(fig, viz.feature_maps(model, x, args.channels))
    print(save_figure(fig, Path(args.out)))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from . import data as D
    from . import viz
    from .report import save_figure
    from .run import load_model

    model = load_model(args.run)
    photo = D.load_or_explain(Path(args.image))
    print(save_figure(viz.explain_figure(model, photo, args.top_k, args.heads), Path(args.out)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from . import data as D
    from . import viz
    from .report import save_figure
    from .run import load_model
    from .transforms import eval_transform

    model = load_model(args.run)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if model.config.stem == "patch":
        written.append(save_figure(viz.filters_figure(model), out / "filters.png"))
    if model.config.pos_embed == "learned":
        written.append(save_figure(viz.pos_similarity_figure(model), out / "pos_similarity.png"))
    split = D.open_split(args.data or _run_source(args.run), args.split)
    transform = eval_transform(model.preprocess)
    photos = split.samples[:: max(1, len(split.samples) // args.images)][: args.images]  # spread over the classes
    images = torch.stack([transform(D.load_or_explain(path)) for path, _ in photos])
    distances = viz.attention_distances_over(model, images)
    written.append(save_figure(viz.attention_distance_figure(distances, model.config.image_size), out / "attention_distance.png"))
    for path in written:
        print(path)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    import torch

    from .summary import format_summary
    from .variants import create_model

    with torch.device("meta"):
        model = create_model(args.model, num_classes=args.num_classes, image_size=args.image_size)
    print(format_summary(model, (args.batch_size, 3, args.image_size, args.image_size), args.depth))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .variants import get_variant, list_models

    for name in list_models():
        v = get_variant(name)
        print(f"{name:<10} layers {v.size.depth:>2}  D {v.size.embed_dim:>4}  MLP {v.size.mlp_dim:>4}  heads {v.size.num_heads:>2}  "
              f"params {v.num_params:>13,}  ({v.size.source})")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from .config import list_recipes, recipe_path

    for name in list_recipes():
        first = recipe_path(name).read_text().splitlines()[0].lstrip("# ").strip()
        print(f"{name:<18} {first}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .config import add_config_options

    parser = argparse.ArgumentParser(prog="foodvit", description="A paper-faithful Vision Transformer for FoodVision Mini and your own photos.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a model; writes a run directory with report, metrics and model",
                       description="Train from a recipe (default: the best small-data recipe). Any setting can be overridden.")
    p.add_argument("--recipe", help="a recipe name (see `foodvit recipes`) or a .toml file")
    p.add_argument("--model", help="a paper name, e.g. ViT-B/16, ViT-Ti/8 (default: the recipe's)")
    p.add_argument("--out", help="run directory (default: runs/<date>-<time>)")
    p.add_argument("--resume", metavar="DIR", help="finish the interrupted run in DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    add_config_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="per-image accuracy of a trained run on a split")
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("--data", help="data source (default: the run's)")
    p.add_argument("--split", default="test")
    p.add_argument("--strict", action="store_true", help="refuse unreadable files instead of skipping them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("predict", help="classify photos with a trained run")
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--plot", metavar="FILE", help="save the photos with their labels and probabilities as a PNG")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("patches", help="a photo cut into the model's patch grid (and the patch embedding's feature maps)")
    p.add_argument("image")
    p.add_argument("--image-size", type=int, help="default 224, or the run's with --feature-maps")
    p.add_argument("--patch-size", type=int, help="default 16, or the run's with --feature-maps")
    p.add_argument("--feature-maps", metavar="RUN", help="add the patch embedding's output channels of this run's model")
    p.add_argument("--channels", type=int, default=5, help="how many feature maps (default 5)")
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_patches)

    p = sub.add_parser("explain", help="a prediction with its top-k probabilities and attention rollout heat map")
    p.add_argument("run")
    p.add_argument("image")
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--heads", action="store_true", help="also the last layer's class-token attention of each head")
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("inspect", help="the paper's Figure 7 for a run: filters, position similarity, attention distance")
    p.add_argument("run")
    p.add_argument("--data", help="photos for the attention distances (default: the run's data)")
    p.add_argument("--split", default="test")
    p.add_argument("--images", type=int, default=32, help="how many photos to average the attention distance over")
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("data", help="download / unpack a data source and show what it holds")
    p.add_argument("source", nargs="?", help="URL, zip or folder (default: $FOODVIT_DATA, else the course's zip)")
    p.add_argument("--print-path", action="store_true", help="print only the local folder")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("summary", help="layer-by-layer table of a model: shapes, parameters, trainable")
    p.add_argument("model", help="a paper name, e.g. ViT-B/16 (see `foodvit models`)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--depth", type=int, default=2, help="how deep to list nested modules (default 2)")
    p.set_defaults(func=cmd_summary)

    sub.add_parser("models", help="list the registered model names").set_defaults(func=cmd_models)
    sub.add_parser("recipes", help="list the built-in recipes").set_defaults(func=cmd_recipes)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .data import DataError
    from .engine import TrainingDiverged
    from .run import RunError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError, DataError, RunError, TrainingDiverged) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"foodvit {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "train":
            where = args.resume or args.out or "the run directory"
            print(f"\ninterrupted: every finished epoch is saved; continue with `foodvit train --resume {where}`", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `foodvit models | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
