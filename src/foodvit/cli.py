"""The `foodvit` command: a thin shell over the library. One subcommand a function."""

from __future__ import annotations

import argparse
import sys


def cmd_summary(args: argparse.Namespace) -> int:
    import torch

    from .summary import format_summary
    from .variants import create_model

    with torch.device("meta"):
        model = create_model(args.model, num_classes=args.num_classes, image_size=args.image_size)
    print(format_summary(model, (args.batch_size, 3, args.image_size, args.image_size), args.depth))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foodvit", description="A paper-faithful Vision Transformer for FoodVision Mini and your own photos.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("summary", help="layer-by-layer table of a model: shapes, parameters, trainable")
    p.add_argument("model", help="a paper name, e.g. ViT-B/16 (see `foodvit models`)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--depth", type=int, default=2, help="how deep to list nested modules (default 2)")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("models", help="list the registered model names")
    p.set_defaults(func=cmd_models)
    return parser


def cmd_models(args: argparse.Namespace) -> int:
    from .variants import get_variant, list_models

    for name in list_models():
        v = get_variant(name)
        print(f"{name:<10} layers {v.size.depth:>2}  D {v.size.embed_dim:>4}  MLP {v.size.mlp_dim:>4}  heads {v.size.num_heads:>2}  "
              f"params {v.num_params:>13,}  ({v.size.source})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"foodvit {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
