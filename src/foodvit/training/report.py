"""The report of a run: loss/accuracy curves, the confusion matrix, per-class accuracy, report.md."""

from __future__ import annotations

from pathlib import Path

import torch

from foodvit.files import write_text
from foodvit.viz.plotting import integer_ticks, subplots


def plot_curves(history: list[dict]):
    """Per epoch: plain cross-entropy (train, val, test: the same quantity on each split), per-image
    accuracy, and, in a panel of its own, the training objective the optimiser minimised (label
    smoothing, mixed targets and auxiliary losses included), which is not comparable with the rest."""
    fig, (ax_loss, ax_acc, ax_obj) = subplots(1, 3, figsize=(15, 4))
    epochs = [row["epoch"] for row in history]

    def draw(ax, key: str, style: str, label: str) -> None:
        points = [(e, row.get(key)) for e, row in zip(epochs, history) if row.get(key) is not None]
        if points:
            ax.plot(*zip(*points), style, label=label, markersize=3)

    for split, style in (("train", "-o"), ("val", "-s"), ("test", "-^")):
        draw(ax_loss, f"{split}_loss", style, split)
        draw(ax_acc, f"{split}_acc", style, split)
    draw(ax_obj, "train_objective", "-o", "train")
    ax_loss.set(title="Cross-entropy", xlabel="epoch", ylabel="plain cross-entropy (mean per image)")
    ax_acc.set(title="Accuracy", xlabel="epoch", ylabel="accuracy (per image)", ylim=(0, 1.02))
    ax_obj.set(title="Training objective", xlabel="epoch", ylabel="minimised loss (smoothing, mixing, auxiliary)")
    for ax in (ax_loss, ax_acc, ax_obj):
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend()
    fig.tight_layout()
    return fig



def plot_confusion(confusion: torch.Tensor, classes, title: str = "Test confusion matrix"):
    """Counts, rows = true class, columns = predicted class; each cell also shows its row share."""
    k = len(classes)
    fig, ax = subplots(figsize=(1.3 * k + 2.5, 1.1 * k + 2))
    totals = confusion.sum(dim=1, keepdim=True).clamp(min=1)
    shares = (confusion / totals).numpy()
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, f"{int(confusion[i, j])}\n{shares[i, j]:.0%}", ha="center", va="center",
                    color="white" if shares[i, j] > 0.5 else "black", fontsize=9)
    ax.set_xticks(range(k), classes, rotation=30, ha="right")
    ax.set_yticks(range(k), classes)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    return fig



def per_class_accuracy(confusion: torch.Tensor, classes) -> dict[str, float]:
    confusion = confusion.double()
    totals = confusion.sum(dim=1)
    return {name: (confusion[i, i] / totals[i]).item() if totals[i] else float("nan") for i, name in enumerate(classes)}



def write_report(run: Path, *, config, classes, counts: dict, history: list[dict], final: dict, model_info: dict,
                 extra_sections: list[str] = ()) -> Path:
    """report.md: what was trained on what, the per-image test result, curves and confusion matrix."""
    run = Path(run)
    correct = int(round(final["acc"] * final["n"]))
    per_class = per_class_accuracy(final["confusion"], classes)
    last = history[-1] if history else {}
    total_seconds = sum(row["seconds"] for row in history)
    size_line = f"{model_info['image_size']} px, patch {model_info['patch_size']}"
    trained_at = model_info.get("train_image_size", model_info["image_size"])
    if trained_at != model_info["image_size"]:  # --test-size
        size_line += f" (trained at {trained_at} px, tested at {model_info['image_size']})"
    lines = [
        f"# foodvit run: {run.name}",
        "",
        f"**Test accuracy: {final['acc']:.3f}** ({correct}/{final['n']} photos, per image), test loss {final['loss']:.3f}.",
        "The test split was used for this report only: nothing (epochs, settings, checkpoint) was chosen by it.",
        "",
        "| | |",
        "|---|---|",
        f"| recipe | `{config.recipe}` |",
        f"| model | {config.model} ({model_info['params']:,} parameters, {model_info['trainable']:,} trained) |",
        f"| image size | {size_line} |",
        f"| data | `{model_info['data_root']}` |",
        "| photos | " + "; ".join(f"{split}: {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in c.items())})" for split, c in counts.items()) + " |",
        f"| training | {len(history)} epochs, batch {config.train.batch_size} x {config.optim.accum_steps}, "
        f"{config.optim.optimizer} lr {config.optim.lr:g}, weight decay {config.optim.weight_decay:g}, augment `{config.data.augment}` |",
        f"| time | {total_seconds:.0f} s on {model_info['device']}"
        + (f", {model_info['processes']} processes" if model_info.get("processes", 1) > 1 else "") + " |",
    ]
    if last.get("val_acc") is not None:
        lines.append(f"| validation accuracy | {last['val_acc']:.3f} (last epoch) |")
    lines += ["", "## Per class (test)", "", "| class | accuracy | photos |", "|---|---|---|"]
    totals = final["confusion"].sum(dim=1).tolist()
    lines += [f"| {name} | {acc:.3f} | {int(totals[i])} |" for i, (name, acc) in enumerate(per_class.items())]
    lines += ["", "## Curves", "", "![loss and accuracy](curves.png)", "", "## Confusion matrix", "", "![confusion matrix](confusion.png)", ""]
    lines += list(extra_sections)
    lines += ["## Files", "", "`model.safetensors` with `model.json` (config, classes, preprocessing), `metrics.csv`, `config.json`, "
              "`checkpoint.pt` (resume).", ""]
    return write_text(run / "report.md", "\n".join(lines))

