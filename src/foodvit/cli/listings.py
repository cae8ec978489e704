"""The listings: `foodvit summary` (a model's layers), `models` (the registered names), `recipes`."""

from __future__ import annotations

import argparse
import shutil
import textwrap

from foodvit.cli.common import count
from foodvit.errors import FoodVitError
from foodvit.settings.fields import Range

# the shapes are worked out on the meta device, so no memory bounds them; a number past these is a slip of the keys
SUMMARY_MOST = Range(1, 10**6, hint="the summary's shapes are text: a million shows as well as more")


def register(sub) -> None:
    """Add summary, models and recipes to the subcommands."""
    p = sub.add_parser("summary", help="layer-by-layer table of a model: shapes, parameters, trainable")
    p.add_argument("model", help="a paper name, e.g. ViT-B/16 (see `foodvit models`)")
    p.add_argument(
        "--num-classes", type=count(SUMMARY_MOST), default=1000, help="classes of the head (default 1000, ImageNet's)"
    )
    p.add_argument("--image-size", type=count(), default=224, help="input resolution in pixels (default 224)")
    p.add_argument("--batch-size", type=count(SUMMARY_MOST), default=1, help="batch size in the shapes (default 1)")
    p.add_argument("--depth", type=count(), default=2, help="how deep to list nested modules (default 2)")
    p.set_defaults(func=cmd_summary, opens_photos=False)

    sub.add_parser("models", help="list the registered model names").set_defaults(func=cmd_models, opens_photos=False)
    sub.add_parser("recipes", help="list the built-in recipes").set_defaults(func=cmd_recipes, opens_photos=False)


def cmd_summary(args: argparse.Namespace) -> int:
    import torch

    from foodvit.model.summary import format_summary
    from foodvit.model.variants import create_model

    with torch.device("meta"):
        model = create_model(args.model, num_classes=args.num_classes, image_size=args.image_size)
    try:
        table = format_summary(model, (args.batch_size, 3, args.image_size, args.image_size), args.depth)
    except RuntimeError as err:  # a tensor past PyTorch's 2^63 elements, e.g. ViT-B/1 at 1024 px and a large batch
        if "overflow" not in str(err).lower():
            raise
        raise FoodVitError(
            f"{args.model} at --image-size {args.image_size} and --batch-size {args.batch_size} has a tensor of more "
            "than 2^63 elements, which PyTorch cannot shape; give a smaller --batch-size or --image-size"
        ) from None
    print(table)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from foodvit.model.variants import get_variant, list_models

    for name in list_models():
        v = get_variant(name)
        print(
            f"{name:<10} layers {v.size.depth:>2}  D {v.size.embed_dim:>4}  MLP {v.size.mlp_dim:>4}  heads "
            f"{v.size.num_heads:>2}  "
            f"params {v.num_params:>13,}  ({v.size.source})"
        )
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from foodvit.recipes import list_recipes, recipe_summary

    width = max(shutil.get_terminal_size().columns, 60)
    for name in list_recipes():
        print(textwrap.fill(recipe_summary(name), width, initial_indent=f"{name:<18} ", subsequent_indent=" " * 19))
    return 0
