"""The pictures of a model: `foodvit patches` (a photo cut into the patch grid), `explain` (a
prediction with its attention rollout), `inspect` (the paper's Figure 7)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foodvit.cli.common import (
    count,
    evaluation_source,
    writable,
)
from foodvit.cli.options import data_source
from foodvit.errors import ConfigError
from foodvit.markup import terminal
from foodvit.settings.fields import Range

PATCHES_MAX_SIZE = 1024  # the side of the photo `patches` draws: a picture people look at, not a data set's
PATCHES_MAX_GRID = 64  # and its patch grid's side (ViT-B/16 at 224 px: 14)


def register(sub) -> None:
    """Add patches, explain, inspect to the subcommands."""
    p = sub.add_parser(
        "patches", help="a photo cut into the model's patch grid (and the patch embedding's feature maps)"
    )
    p.add_argument("image", help="a photo file")
    p.add_argument(
        "--image-size", type=count(Range(1, PATCHES_MAX_SIZE)), help="default 224, or the run's with --feature-maps"
    )
    p.add_argument("--patch-size", type=count(), help="default 16, or the run's with --feature-maps")
    p.add_argument(
        "--feature-maps", metavar="RUN", help="add the patch embedding's output channels of this run's model"
    )
    p.add_argument(
        "--channels", type=count(), default=5, help="how many feature maps (default 5; at most the model's width)"
    )
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_patches)

    p = sub.add_parser("explain", help="a prediction with its top-k probabilities and attention rollout heat map")
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("image", help="a photo file")
    p.add_argument("--top-k", type=count(), default=3, help="how many classes to show (default 3)")
    p.add_argument(
        "--heads", action="store_true", help="also each head's last-layer attention, read out as the model pools"
    )
    p.add_argument("--out", required=True, metavar="FILE", help="PNG to write")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "inspect", help="the paper's Figure 7 for a run: filters, position similarity, attention distance"
    )
    p.add_argument("run", help="a run directory (or its model.safetensors)")
    p.add_argument("--data", type=data_source, help="photos for the attention distances (default: the run's data)")
    p.add_argument("--split", default="test", help="the split to take photos from (default test)")
    p.add_argument(
        "--images", type=count(), default=32, help="how many photos to average the attention distance over (default 32)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the pictures into")
    p.set_defaults(func=cmd_inspect)


def cmd_patches(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.inference import local_photo
    from foodvit.viz.attention import feature_maps
    from foodvit.viz.figures import add_feature_maps, patches_figure
    from foodvit.viz.plotting import save_figure

    out = writable(args.out, (".png",))
    photo = load_or_explain(local_photo(args.image))
    predictor = model = None
    if args.feature_maps:
        from foodvit.deploy.predictor import Predictor

        predictor = Predictor.from_run(args.feature_maps)
        model = predictor.model
    if model is not None and (args.image_size, args.patch_size) != (None, None):
        own = model.config.image_size, model.config.patch_size
        if (args.image_size or own[0], args.patch_size or own[1]) != own:  # a grid beside maps of another one
            raise ConfigError(
                f"--feature-maps draws the run's model, which cuts {own[0]} px photos into patches of {own[1]} px; "
                "leave --image-size and --patch-size out, or give the run's"
            )
    size = args.image_size or (model.config.image_size if model else 224)
    patch = args.patch_size or (model.config.patch_size if model else 16)
    if patch > size:  # the grid's rule would say "use {patch}", which may be past --image-size's own bound
        raise ConfigError(f"--patch-size {patch} is larger than the image ({size} px); give at most {size}")
    if size // patch > PATCHES_MAX_GRID:
        raise ConfigError(
            f"--image-size {size} in patches of {patch} px is a grid of {size // patch} x {size // patch}; patches "
            f"draws at most {PATCHES_MAX_GRID} x {PATCHES_MAX_GRID}: give a larger --patch-size"
        )
    if model is not None and args.channels > model.config.embed_dim:
        raise ConfigError(
            f"--channels {args.channels} is more than the {model.config.embed_dim} channels of the run's patch "
            f"embedding; give at most {model.config.embed_dim}"
        )
    fig = patches_figure(photo, size, patch, predictor.preprocess if predictor is not None else None)
    if predictor is not None:
        import torch

        x = torch.from_numpy(predictor.prepare(photo))[None]
        fig = add_feature_maps(fig, feature_maps(model, x, args.channels))
    print(save_figure(fig, out))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.inference import local_photo
    from foodvit.deploy.predictor import Predictor
    from foodvit.viz.figures import explain_figure
    from foodvit.viz.plotting import save_figure

    out = writable(args.out, (".png",))
    predictor = Predictor.from_run(args.run)
    photo = load_or_explain(local_photo(args.image))
    print(save_figure(explain_figure(predictor, photo, args.top_k, args.heads), out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from foodvit.data.photos import PhotoError, load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.errors import DataError, RunError
    from foodvit.viz.attention import attention_distances_over
    from foodvit.viz.figures import (
        attention_distance_figure,
        filters_figure,
        pos_similarity_figure,
    )
    from foodvit.viz.plotting import save_figure

    predictor = Predictor.from_run(args.run)
    model = predictor.model
    assert model is not None  # from_run opens the run's PyTorch model (only an .onnx Predictor has none)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file; inspect writes three pictures into a folder: choose a folder")
    for name in ("filters.png", "pos_similarity.png", "attention_distance.png"):
        writable(str(out / name))
    # the photos first: bad --data or --split is refused before any picture is written
    split = evaluation_source(args.run, args.data, predictor).open_split(args.split)
    picked = split.samples[:: max(1, len(split.samples) // args.images)][: args.images]  # spread over the classes
    images, skipped = [], []
    for path, _ in picked:
        try:
            images.append(torch.from_numpy(predictor.prepare(load_or_explain(path), str(path))))
        except PhotoError as err:  # skipped, as evaluate skips it
            skipped.append(str(err))
    if skipped:
        print(f"skipped {len(skipped)} photo(s) that cannot be read, e.g. {terminal(skipped[0])}", file=sys.stderr)
    if not images:
        raise DataError(f"none of the {len(picked)} photos picked from the {args.split} split can be read")
    written = []
    if model.config.stem == "patch":
        written.append(save_figure(filters_figure(model), out / "filters.png"))
    else:
        print(
            "filters.png: skipped, the model's convolutional stem has no single set of P x P filters", file=sys.stderr
        )
    if model.config.pos_embed == "learned":
        written.append(save_figure(pos_similarity_figure(model), out / "pos_similarity.png"))
    else:
        print(
            f"pos_similarity.png: skipped, the model's position embedding is {model.config.pos_embed!r}, not learned, "
            "so there is nothing learned to compare",
            file=sys.stderr,
        )
    distances = attention_distances_over(model, torch.stack(images))
    written.append(
        save_figure(attention_distance_figure(distances, model.config.image_size), out / "attention_distance.png")
    )
    for path in written:
        print(path)
    return 0
