"""Using a trained model: evaluate it on a split, predict photos, draw a prediction."""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from . import data as D
from .engine import StepSettings, evaluate
from .preprocess import eval_transform
from .report import per_class_accuracy


def evaluate_split(model, split: D.Split, batch_size: int = 64, device: torch.device | None = None) -> dict:
    """accuracy (per image), loss, n, per_class {class: accuracy}, confusion (rows = true class)."""
    if list(split.classes) != list(model.class_names):
        raise D.DataError(f"{split.root} has classes {list(split.classes)}, the model was trained on {list(model.class_names)}; "
                          "evaluate on a folder with the same class folders")
    dataset = D.PhotoDataset(split, eval_transform(model.preprocess))
    loader = D.make_loader(dataset, batch_size, train=False)
    device = device or next(model.parameters()).device
    result = evaluate(model, loader, StepSettings(device=device), num_classes=len(split.classes))
    return {"accuracy": result["acc"], "loss": result["loss"], "n": result["n"],
            "per_class": per_class_accuracy(result["confusion"], split.classes), "confusion": result["confusion"].tolist()}


@torch.no_grad()
def predict(model, images: list[str | Path], top_k: int = 3) -> list[dict]:
    """One result per photo, in order: image, label, probability, top_k [[label, probability], ...],
    seconds (decode, preprocessing and forward pass: what a user waits for); or, for a photo that
    cannot be used, image and error (what is wrong), and the others are still predicted."""
    transform = eval_transform(model.preprocess)
    device = next(model.parameters()).device
    k = max(1, min(top_k, len(model.class_names)))
    model.eval()
    results = []
    for image in images:
        started = time.perf_counter()
        try:
            photo = D.load_or_explain(_local(image))
        except D.DataError as err:
            results.append({"image": str(image), "error": str(err)})
            continue
        x = transform(photo).unsqueeze(0).to(device)  # (1, C, H, W)
        probs = model(x).float().softmax(dim=-1)[0]
        top = probs.topk(k)
        seconds = time.perf_counter() - started
        ranked = [[model.class_names[i], float(p)] for p, i in zip(top.values.tolist(), top.indices.tolist())]
        results.append({"image": str(image), "label": ranked[0][0], "probability": ranked[0][1], "top_k": ranked,
                        "seconds": seconds})
    return results


def _local(image: str | Path) -> Path:
    """A local photo's path; URLs are refused with a message that says what to do."""
    text = str(image)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise D.PhotoError(text, f"is a URL: URLs are not supported; download the photo first (e.g. curl -LO '{text}') and pass the file")
    path = Path(image)
    if not path.exists():
        raise D.PhotoError(path, "does not exist")
    if path.is_dir():
        raise D.PhotoError(path, f"is a folder; pass photo files (e.g. {path}/*.jpg)")
    return path


def plot_predictions(images: list[str | Path], results: list[dict], columns: int = 4):
    """The course's pred_and_plot_image: each photo titled with its label and probability."""
    import math

    from .report import subplots

    n = len(results)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig, axes = subplots(rows, cols, figsize=(4.5 * cols, 4.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, result in zip(axes.flat, images, results):
        if "error" in result:
            ax.text(0.5, 0.5, f"{Path(str(image)).name}\ncould not be read", ha="center", va="center", fontsize=10)
            continue
        ax.imshow(D.load_or_explain(Path(image)))
        ax.set_title(f"Pred: {result['label']} | Prob: {result['probability']:.3f}", fontsize=11)
    fig.tight_layout()
    return fig
