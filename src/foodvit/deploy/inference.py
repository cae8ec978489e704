"""Using a trained model through its Predictor: evaluate it on a split, predict photos, draw a
prediction. Nothing here needs PyTorch: the Predictor's backend runs the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from foodvit.data.photos import PhotoError, decode, load_or_explain
from foodvit.errors import DataError
from foodvit.files import address_scheme


def evaluate_split(predictor, split, batch_size: int = 64, *, strict: bool = False) -> dict:
    """accuracy (per image), loss (mean cross-entropy), n, per_class {class: accuracy}, confusion
    (rows = true class), computed from the Predictor's probabilities in batches; skipped: every file left out
    ("path: reason"), those the split's check skipped and those whose header read but whose pixels could not be
    decoded (strict: refused instead). A class left with no photo is refused, as the split's check refuses it."""
    if list(split.classes) != list(predictor.classes):
        raise DataError(
            f"{split.root} has classes {list(split.classes)}, the model was trained on {list(predictor.classes)}; "
            "evaluate on a folder with the same class folders"
        )
    k = len(predictor.classes)
    confusion = np.zeros((k, k), dtype=np.int64)
    loss = 0.0
    skipped: list[str] = list(split.skipped)
    for start in range(0, len(split.samples), batch_size):
        chunk, prepared = [], []
        for path, label in split.samples[start : start + batch_size]:
            try:
                prepared.append(predictor.prepare(load_or_explain(path), str(path)))
            except PhotoError as err:
                if strict:
                    raise
                skipped.append(f"{path}: {err.reason}")
                continue
            chunk.append((path, label))
        if not chunk:
            continue
        batch = np.stack(prepared)
        probabilities = predictor.probabilities(batch)
        labels = np.array([label for _, label in chunk])
        loss -= float(np.log(np.maximum(probabilities[np.arange(len(chunk)), labels], 1e-300)).sum())
        np.add.at(confusion, (labels, probabilities.argmax(axis=1)), 1)
    n = int(confusion.sum())
    totals = confusion.sum(axis=1)
    for i, name in enumerate(split.classes):
        if not totals[i]:
            raise DataError(
                f"class folder {Path(split.root) / name} has no photo that could be decoded; add photos or remove "
                "the folder"
            )
    per_class = {name: float(confusion[i, i] / totals[i]) for i, name in enumerate(split.classes)}
    return {
        "accuracy": float(np.trace(confusion) / n),
        "loss": loss / n,
        "n": n,
        "per_class": per_class,
        "confusion": confusion.tolist(),
        "skipped": skipped,
    }


def predict(predictor, images: list[str | Path], top_k: int = 3) -> list[dict]:
    """One result per photo, in order: image, label, probability, probabilities, top_k [[label,
    probability], ...], seconds (decode, preprocessing and forward pass: what a user waits for);
    or, for a photo that cannot be used, image and error (what is wrong), and the others are still
    predicted."""
    results = []
    for image in images:
        try:
            results.append(
                {"image": str(image), **predictor.classify(local_photo(image), top_k=top_k, name=str(image))}
            )
        except DataError as err:
            results.append({"image": str(image), "error": str(err)})
    return results


def local_photo(image: str | Path) -> Path:
    """A local photo's path; URLs are refused with a message that says what to do."""
    text = str(image)
    if address_scheme(text):
        raise PhotoError(
            text,
            f"is a URL: URLs are not supported; download the photo first (e.g. curl -LO '{text}') and pass the file",
        )
    path = Path(image)
    try:
        if not path.exists():
            raise PhotoError(path, _leads_nowhere(path) if path.is_symlink() else "does not exist")
        if path.is_dir():
            raise PhotoError(path, f"is a folder; pass photo files (e.g. {path}/*.jpg)")
    except OSError as err:  # a name the system refuses (too long, say): this photo's error, not the whole run's
        raise PhotoError(path, f"cannot be used ({err.strerror or type(err).__name__})") from None
    return path


def _leads_nowhere(link: Path) -> str:
    """Why a symbolic link is no photo: it loops, or what it names does not exist."""
    import errno
    import os

    try:
        link.stat()
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link that leads back to itself (a loop of links); point it at a photo or remove it"
    return f"is a symbolic link to {os.readlink(link)}, which does not exist"


PLOT_SIDE = 512  # a photo's shorter side in a plot of predictions: a thumbnail of 4.5 inches, not its full size
PLOT_MOST = 64  # photos a plot draws: past that a picture is no longer read photo by photo (--out is for many)


def thumbnail(path: Path):
    """The photo decoded at no more than about PLOT_SIDE on its shorter side (JPEGs scaled by their decoder)."""
    photo = decode(path, reduce_to=PLOT_SIDE)
    photo.thumbnail((2 * PLOT_SIDE, 2 * PLOT_SIDE))
    return photo


def plot_predictions(images: list[str | Path], results: list[dict], columns: int = 4):
    """The course's pred_and_plot_image: each photo titled with its label and probability."""
    import math

    from foodvit.viz.plotting import drawable, subplots

    n = len(results)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig, axes = subplots(rows, cols, figsize=(4.5 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, result in zip(axes.flat, images, results, strict=False):
        if "error" in result:
            said = f"{drawable(Path(str(image)).name)}\ncould not be read"
            ax.text(0.5, 0.5, said, ha="center", va="center", fontsize=10)
            continue
        ax.imshow(thumbnail(Path(image)))
        ax.set_title(f"Pred: {drawable(result['label'])} | Prob: {result['probability']:.3f}", fontsize=11)
    fig.tight_layout()
    return fig
