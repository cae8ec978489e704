"""Pictures of a ViT: the patch grid, feature maps, an explained prediction, the paper's Figure 7, and the
most confidently wrong photos. They draw the numbers of viz/attention.py, without pyplot.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from foodvit.errors import ConfigError
from foodvit.settings.model import check_on_patch_grid
from foodvit.viz.attention import explain, filter_components, position_similarity
from foodvit.viz.plotting import drawable, integer_ticks, new_figure, subplots


def _rgb(tile: torch.Tensor) -> torch.Tensor:
    """(C, H, W) of any range -> (H, W, 3) in [0, 1]."""
    tile = tile.float()
    tile = (tile - tile.min()) / (tile.max() - tile.min()).clamp(min=1e-8)
    return tile.permute(1, 2, 0).expand(-1, -1, 3) if tile.shape[0] == 1 else tile.permute(1, 2, 0)


def _resized(photo, image_size: int) -> torch.Tensor:
    """The course's view: the photo squashed to S x S, uint8 (3, S, S)."""
    from torchvision.transforms.v2 import functional as TF

    return TF.pil_to_tensor(TF.resize(photo, [image_size, image_size], antialias=True))


def patches_figure(photo, image_size: int = 224, patch_size: int = 16, preprocess=None):
    """The course's patchify plot: the resized photo, and the same cut into its patch grid with
    row and column numbers. With a model's preprocessing, exactly the view the model gets."""
    check_on_patch_grid("image size", image_size, patch_size)
    if preprocess is not None:
        from foodvit.data.transforms import model_view

        image = model_view(preprocess, photo)
        image_size = image.shape[-1]
    else:
        image = _resized(photo, image_size)
    g, gap = image_size // patch_size, max(1, patch_size // 8)
    step = patch_size + gap
    canvas = torch.full((3, g * step - gap, g * step - gap), 255, dtype=torch.uint8)
    for r in range(g):
        for c in range(g):
            canvas[:, r * step : r * step + patch_size, c * step : c * step + patch_size] = image[
                :, r * patch_size : (r + 1) * patch_size, c * patch_size : (c + 1) * patch_size
            ]
    fig, (ax_photo, ax_grid) = subplots(1, 2, figsize=(12, 6.3))
    ax_photo.imshow(image.permute(1, 2, 0).numpy())
    ax_photo.set_title(f"{image_size} x {image_size} photo")
    ax_photo.axis("off")
    ax_grid.imshow(canvas.permute(1, 2, 0).numpy())
    every = 1 if g <= 16 else 2
    centres = [r * step + patch_size / 2 for r in range(0, g, every)]
    ax_grid.set_xticks(centres, [str(c + 1) for c in range(0, g, every)], fontsize=7)
    ax_grid.set_yticks(centres, [str(r + 1) for r in range(0, g, every)], fontsize=7)
    ax_grid.tick_params(length=0)
    for side in ax_grid.spines.values():
        side.set_visible(False)
    ax_grid.set(
        xlabel="patch column",
        ylabel="patch row",
        title=f"{g} x {g} = {g * g} patches of {patch_size} x {patch_size} px (N in Eq. 1)",
    )
    fig.tight_layout()
    return fig


def add_feature_maps(fig, maps: torch.Tensor):
    """A row of feature maps under an existing figure (the patches figure)."""
    n = maps.shape[0]
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + 2.6)
    fig.subplots_adjust(bottom=0.3)
    for i in range(n):
        ax = fig.add_axes([0.05 + i * 0.9 / n, 0.02, 0.8 / n, 0.22])
        ax.imshow(maps[i].numpy(), cmap="viridis")
        ax.set_title(f"channel {i}", fontsize=8)
        ax.axis("off")
    return fig


def overlay_array(image: torch.Tensor, heat: torch.Tensor, alpha: float = 0.45):
    """The heat map laid over the image as one RGB uint8 array (H, W, 3): no figure, no pyplot, so it
    is safe in a server's threads. The picture of viz/overlay.py (NumPy), which the demo page draws."""
    from foodvit.viz.overlay import overlay_array as draw

    return draw(image.cpu().numpy(), heat.detach().float().cpu().numpy(), alpha)


def _overlay(ax, image: torch.Tensor, heat: torch.Tensor, title: str) -> None:
    ax.imshow(overlay_array(image, heat))  # the same picture the demo page shows
    ax.set_title(title, fontsize=10)
    ax.axis("off")


def explain_figure(predictor, photo, top_k: int = 3, show_heads: bool = False):
    """The photo, its top-k probabilities as bars, and the attention rollout over it."""
    from foodvit.data.transforms import model_view

    result = explain(predictor, photo, top_k)
    image = model_view(predictor.preprocess, photo)  # the heat map belongs to exactly this view
    heads = result["heads"] if show_heads else None
    extra = 0 if heads is None else math.ceil(heads.shape[0] / 3)
    fig = new_figure(figsize=(14, 4.6 + 3.2 * extra))
    grid = fig.add_gridspec(1 + extra, 3, height_ratios=[1.45] + [1] * extra)
    ax = fig.add_subplot(grid[0, 0])
    ax.imshow(image.permute(1, 2, 0).numpy())
    ax.set_title(f"what the model sees ({image.shape[-1]} px)")
    ax.axis("off")
    ax = fig.add_subplot(grid[0, 1])
    names = [drawable(name) for name, _ in result["top_k"]][::-1]
    values = [p for _, p in result["top_k"]][::-1]
    bars = ax.barh(range(len(values)), values, color=["#9ab"] * (len(values) - 1) + ["#d62"])
    ax.set_yticks(range(len(values)), names)
    ax.bar_label(bars, fmt="%.3f", padding=3)
    ax.set(xlim=(0, 1.15), title=f"prediction: {drawable(result['top_k'][0][0])}", xlabel="probability")
    _overlay(
        fig.add_subplot(grid[0, 2]),
        image,
        result["rollout"],
        f"attention rollout (Abnar & Zuidema 2020)\nread by {result['read_by']}",
    )
    if heads is not None:
        sub = grid[1:, :].subgridspec(extra, 3 * 2)
        for i in range(heads.shape[0]):
            _overlay(
                fig.add_subplot(sub[i // 6, i % 6]), image, heads[i], f"last layer, head {i + 1}\n({result['read_by']})"
            )
    fig.tight_layout()
    return fig


def filters_figure(model, k: int = 28):
    """Figure 7 (left): the first k principal components of the patch-embedding filters, as RGB tiles."""
    if model.config.stem != "patch":
        raise ConfigError(
            "this model has a convolutional stem: its embedding is no single set of P x P filters to decompose"
        )
    components, explained = filter_components(model.patch_embed.proj.weight, k)
    cols = 7
    rows = math.ceil(len(components) / cols)
    fig, axes = subplots(rows, cols, figsize=(cols * 1.3, rows * 1.45))
    for ax in axes.flat:
        ax.axis("off")
    for i, (ax, tile) in enumerate(zip(axes.flat, components, strict=False)):
        ax.imshow(_rgb(tile).numpy(), interpolation="nearest")
        ax.set_title(f"{i + 1}: {explained[i]:.1%}", fontsize=7)
    fig.suptitle(f"RGB embedding filters (first {len(components)} principal components)")
    fig.tight_layout()
    return fig


def pos_similarity_figure(model):
    """Figure 7 (centre): for each patch position, the cosine similarity of its position embedding
    with every other's, laid out on the patch grid."""
    c = model.config
    if c.pos_embed == "none":
        raise ConfigError("this model has no position embedding (pos_embed='none')")
    sim = position_similarity(model.pos_embed, c.num_prefix_tokens)
    g = c.grid_size
    tiles = sim.reshape(g, g, g, g)  # (row, col) of the query position, then its map
    fig, axes = subplots(g, g, figsize=(min(12, 0.62 * g + 1), min(12, 0.62 * g + 1)))
    for r in range(g):
        for col in range(g):
            ax = axes[r, col]
            im = ax.imshow(tiles[r, col].numpy(), vmin=-1, vmax=1, cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(str(r + 1), fontsize=6, rotation=0, labelpad=6)
            if r == g - 1:
                ax.set_xlabel(str(col + 1), fontsize=6)
    fig.supxlabel("input patch column")
    fig.supylabel("input patch row")
    fig.suptitle("Position embedding similarity (cosine)")
    fig.colorbar(im, ax=axes, shrink=0.6, label="cosine similarity")
    return fig


def attention_distance_figure(distances: torch.Tensor, image_size: int):
    """Figure 7 (right): mean attention distance of each head against network depth."""
    L, h = distances.shape
    fig, ax = subplots(figsize=(6.5, 4.5))
    for head in range(h):
        ax.scatter(range(1, L + 1), distances[:, head].numpy(), s=14, label=f"head {head + 1}" if h <= 16 else None)
    ax.set(
        xlabel="network depth (layer)",
        ylabel="mean attention distance (pixels)",
        title=f"Mean attention distance ({image_size} px input)",
        ylim=(0, image_size),
    )
    integer_ticks(ax.xaxis)
    if h <= 16:
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def most_wrong_figure(results: list[dict], true_labels: list[str], n: int = 9):
    """The test photos the model got wrong with the most confidence (course chapter 09's exercise)."""
    wrong = [(r, t) for r, t in zip(results, true_labels, strict=True) if r["label"] != t]
    wrong.sort(key=lambda pair: pair[0]["probability"], reverse=True)
    if not wrong:
        fig, ax = subplots(figsize=(5, 1.2))
        ax.text(0.5, 0.5, "no test photo was misclassified", ha="center", va="center")
        ax.axis("off")
        return fig
    return photo_grid(wrong[:n], "Most confidently wrong test predictions")


def predictions_figure(results: list[dict], true_labels: list[str], n: int = 6):
    """n test photos spread over the split (so over its classes), each with its prediction: green
    when right, red when wrong."""
    step = max(1, len(results) // n)
    return photo_grid(list(zip(results, true_labels, strict=True))[::step][:n], "Test predictions")


def photo_grid(items: list[tuple[dict, str]], title: str):
    """Photos in rows of three, each titled with its true class, prediction and probability."""
    from foodvit.data.photos import load_or_explain

    cols = min(3, len(items))
    rows = math.ceil(len(items) / cols)
    fig, axes = subplots(rows, cols, figsize=(4.2 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (r, truth) in zip(axes.flat, items, strict=False):
        ax.imshow(load_or_explain(Path(r["image"])))
        colour = "#2a2" if r["label"] == truth else "#b22"
        ax.set_title(
            f"true: {drawable(truth)}\npred: {drawable(r['label'])} ({r['probability']:.2f})\n"
            f"{drawable(Path(r['image']).name)}",
            fontsize=9,
            color=colour,
        )
    fig.suptitle(title)
    fig.tight_layout()
    return fig
