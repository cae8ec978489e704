"""The report of a run: loss/accuracy curves, the confusion matrix, per-class accuracy, report.md."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from foodvit import markup
from foodvit.data.datasource import DataSource
from foodvit.files import write_text
from foodvit.rundir.directory import TEACHER_FILE, VALIDATION_FILE
from foodvit.rundir.trained import save_model
from foodvit.training.engine import trains_in_bf16
from foodvit.viz.figures import most_wrong_figure, predictions_figure
from foodvit.viz.plotting import drawable, integer_ticks, save_figure, subplots


def plot_curves(history: list[dict]):
    """Per epoch: plain cross-entropy (train, val, test: the same quantity on each split), per-image
    accuracy, and, in a panel of its own, the training objective the optimiser minimised (label
    smoothing, mixed targets and auxiliary losses included), which is not comparable with the rest."""
    fig, (ax_loss, ax_acc, ax_obj) = subplots(1, 3, figsize=(15, 4))
    epochs = [row["epoch"] for row in history]

    def draw(ax, key: str, style: str, label: str) -> None:
        points = [(e, row.get(key)) for e, row in zip(epochs, history, strict=True) if row.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label, markersize=3)

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


# past this many classes a cell's count and share are not written in it (they would not fit), and the figure stops
# growing: a side of 1.3 inches a class made 101 classes a 12,000-pixel figure and 6 GB of text layout
WRITTEN_UP_TO = 20
NAMED_UP_TO = 60  # past this many classes the axes name every n-th one


def plot_confusion(confusion: torch.Tensor, classes, title: str = "Test confusion matrix"):
    """Counts, rows = true class, columns = predicted class; each cell also shows its row share (up to WRITTEN_UP_TO
    classes; past it the colour alone)."""
    k = len(classes)
    few = k <= WRITTEN_UP_TO
    drawn = min(k, WRITTEN_UP_TO)
    fig, ax = subplots(figsize=(1.3 * drawn + 2.5, 1.1 * drawn + 2))
    totals = confusion.sum(dim=1, keepdim=True).clamp(min=1)
    shares = (confusion / totals).numpy()
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(k if few else 0):
        for j in range(k):
            ax.text(
                j,
                i,
                f"{int(confusion[i, j])}\n{shares[i, j]:.0%}",
                ha="center",
                va="center",
                color="white" if shares[i, j] > 0.5 else "black",
                fontsize=9,
            )
    every = math.ceil(k / NAMED_UP_TO)
    ticks, names = list(range(0, k, every)), [drawable(name) for name in classes[::every]]
    size = None if few else 6
    ax.set_xticks(ticks, names, rotation=30 if few else 90, ha="right" if few else "center", fontsize=size)
    ax.set_yticks(ticks, names, fontsize=size)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    return fig


def per_class_accuracy(confusion: torch.Tensor, classes) -> dict[str, float]:
    confusion = confusion.double()
    totals = confusion.sum(dim=1)
    return {name: (confusion[i, i] / totals[i]).item() if totals[i] else float("nan") for i, name in enumerate(classes)}


def write_report(
    run: Path,
    *,
    config,
    classes,
    counts: dict,
    history: list[dict],
    final: dict,
    model_info: dict,
    extra_sections: Sequence[str] = (),
    validation: dict | None = None,
) -> Path:
    """report.md: what was trained on what, the per-image test result (and, with a validation source, the result on
    it beside), curves and confusion matrix. Names of the user's (the run's folder, the data's, the class folders, the
    recipe, the validation source) are shown as text (markup.py): a class folder named `<img src=x onerror=alert(1)>`
    must not be a live picture where the report is read."""
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
        f"# foodvit run: {markup.text(run.name)}",
        "",
        f"**Test accuracy: {final['acc']:.3f}** ({correct}/{final['n']} photos, per image), "
        f"test loss {final['loss']:.3f}.",
        (
            "The test split was read once, for this report"
            if validation is not None
            else "The test split was read for this report and for its curves (every --eval-every epochs)"
        )
        + ": nothing (epochs, settings, checkpoint) was chosen by it.",
        "",
    ]
    if validation is not None:
        right = int(round(validation["acc"] * validation["n"]))
        dropped = validation["val_dropped"]
        lines += [
            f"**Validation accuracy: {validation['acc']:.3f}** ({right}/{validation['n']} photos of "
            f"{markup.code(validation['val_source'])}, per image"
            + (f"; {dropped} of its photos left out, their content also in the training data" if dropped else "")
            + f"), the split the run was judged on while it trained; each photo's answer is in `{VALIDATION_FILE}`.",
            "",
        ]
    lines += [
        "| | |",
        "|---|---|",
        f"| recipe | {markup.code(config.recipe, table=True)} |",
        f"| model | {markup.text(config.model)} ({model_info['params']:,} parameters, {model_info['trainable']:,} "
        "trained) |",
        f"| image size | {size_line} |",
        f"| data | {markup.code(model_info['data_root'], table=True)} |",
        "| photos | "
        + "; ".join(
            f"{split}: {sum(c.values())} ({', '.join(f'{markup.text(k)} {v}' for k, v in c.items())})"
            for split, c in counts.items()
        )
        + " |",
        f"| training | {len(history)} epochs, batch {config.train.batch_size} x {config.optim.accum_steps}, "
        f"{config.optim.optimizer} lr {config.optim.lr:g}, weight decay {config.optim.weight_decay:g}, "
        f"augment {markup.code(config.data.augment, table=True)} |",
        f"| time | {total_seconds:.0f} s on {model_info['device']}"
        + (f", {model_info['processes']} processes" if model_info.get("processes", 1) > 1 else "")
        + " |",
    ]
    if last.get("val_acc") is not None and validation is None:
        lines.append(f"| validation accuracy | {last['val_acc']:.3f} (last epoch) |")
    lines += ["", "## Per class (test)", "", "| class | accuracy | photos |", "|---|---|---|"]
    totals = final["confusion"].sum(dim=1).tolist()
    lines += [
        f"| {markup.text(name)} | {acc:.3f} | {int(totals[i])} |" for i, (name, acc) in enumerate(per_class.items())
    ]
    if validation is not None:
        lines += ["", "## Per class (validation)", "", "| class | accuracy | photos |", "|---|---|---|"]
        totals = validation["confusion"].sum(dim=1).tolist()
        lines += [
            f"| {markup.text(name)} | {acc:.3f} | {int(totals[i])} |"
            for i, (name, acc) in enumerate(validation["per_class"].items())
            if totals[i]
        ]
    lines += [
        "",
        "## Curves",
        "",
        "![loss and accuracy](curves.png)",
        "",
        "## Confusion matrix",
        "",
        "![confusion matrix](confusion.png)",
        "",
    ]
    lines += list(extra_sections)
    lines += [
        "## Files",
        "",
        "`model.safetensors` with `model.json` (config, classes, preprocessing), `metrics.csv`, `config.json`, "
        "`checkpoint.pt` (resume).",
        "",
    ]
    return write_text(run / "report.md", "\n".join(lines))


def device_name(device: torch.device, amp: bool = False) -> str:
    """The device, and whether its training steps ran under bf16 autocast (engine.trains_in_bf16)."""
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    )
    return name + (", training in bf16 autocast" if trains_in_bf16(device, amp) else "")


def test_results(probabilities: torch.Tensor, split, classes) -> tuple[list[dict], list[str]]:
    """Each test photo's prediction (as predict gives it) and its true class."""
    top = probabilities.max(dim=1)
    results = [
        {"image": str(path), "label": classes[i], "probability": p}
        for (path, _), p, i in zip(split.samples, top.values.tolist(), top.indices.tolist(), strict=True)
    ]
    return results, [classes[label] for _, label in split.samples]


def draw_figures(history: list[dict], test: dict, results: list[dict], truths: list[str], classes) -> dict:
    """The report's three figures by file stem: the curves, the confusion matrix and the most
    confidently wrong test photos (matplotlib's text layout makes them 1-3 s of a run's end)."""
    return {
        "curves": plot_curves(history),
        "confusion": plot_confusion(test["confusion"], classes),
        "most_wrong": most_wrong_figure(results, truths),
    }


def validation_summary(validation: dict, data, config) -> dict:
    """What model.json says of the run's validation source (--validate-on): its accuracy, photos, source and the
    photos dropped as also in the training data."""
    return {
        "val_acc": validation["acc"],
        "val_loss": validation["loss"],
        "val_n": validation["n"],
        "val_per_class": {c: a for c, a in validation["per_class"].items() if data.val.counts()[c]},
        "val_source": config.data.validate_on,
        "val_dropped": len(data.pool.dropped),
    }


def write_validation(path: Path, probabilities: torch.Tensor, split, keys: dict, classes) -> None:
    """validation.jsonl: each validation photo (its name, 'class/file': data.validation.Pool.keys), its class, the
    final model's answer and every class's probability: two runs validated on the same source pair photo by photo."""
    lines = []
    for (photo, label), p in zip(split.samples, probabilities.tolist(), strict=True):
        guess = max(range(len(classes)), key=p.__getitem__)
        record = {
            "photo": keys[photo],
            "label": classes[label],
            "predicted": classes[guess],
            "right": guess == label,
            "probabilities": {c: round(q, 6) for c, q in zip(classes, p, strict=True)},
        }
        lines.append(json.dumps(record) + "\n")
    write_text(path, "".join(lines))


def teacher_section(config, teacher_history: list[dict], teacher_lent_by: str | None) -> list[str]:
    """report.md's section on the CNN teacher: how it was trained, its test accuracy and what the ViT
    learned from it (none without a teacher)."""
    if not teacher_history:
        return []
    last = teacher_history[-1]  # evaluated on the test split at its last epoch
    distill, guidance, uses = config.distill, config.guidance, []
    if distill.weight > 0:
        temperature = distill.temperature
        how = f"its probabilities at temperature {temperature:g} (soft " if temperature > 0 else "its labels ("
        uses.append(f"{how}distillation, weight {distill.weight:g})")
    if guidance.weight > 0:
        falling = ", falling linearly towards 0 over the epochs" if guidance.schedule == "linear" else ""
        stages = "its four stages' feature maps, the last against the ViT's last block"
        stages = stages if guidance.stages == 4 else "its feature maps"
        uses.append(f"{stages} (locality guidance, weight {guidance.weight:g}{falling})")
    return [
        "## CNN teacher",
        "",
        f"{config.teacher.architecture} trained from random initialisation on the same photos for "
        f"{last['epoch']} epochs "
        f"({sum(r['seconds'] for r in teacher_history):.0f} s"
        + (f", in {markup.text(teacher_lent_by)}, which lent it to this run" if teacher_lent_by else "")
        + f"): test accuracy {last['test_acc']:.3f} "
        f"(per image). The ViT learned from {' and '.join(uses)}; the saved model "
        f"is the ViT alone, and `{TEACHER_FILE}` keeps the teacher.",
        "",
    ]


def write_results(
    out: Path,
    *,
    config,
    data,
    model,
    trainable: int,
    train_size: int,
    preprocess,
    test: dict,
    probabilities: torch.Tensor,
    history: list[dict],
    teacher_history: list[dict],
    device: torch.device,
    trained_in: str,
    chip: str,
    processes: int,
    tensorboard=None,
    teacher_lent_by: str | None = None,
    validation: dict | None = None,
) -> None:
    """What a finished run leaves (rank 0): model.safetensors and model.json, the figures, report.md,
    and TensorBoard's final images and hparams."""
    classes = data.classes
    source = DataSource.parse(config.data.source, config.data.train_fraction)
    summary = {
        "test_acc": test["acc"],
        "test_loss": test["loss"],
        "test_n": test["n"],
        "recipe": config.recipe,
        "epochs": len(history),
        "trained": time.strftime("%Y-%m-%d"),
        "data": str(config.data.source or data.root),
        "data_name": source.name,
        "train_photos": len(data.train),
        "arithmetic": trained_in,  # engine.arithmetic of its epochs ("X, then Y" when resumed in another)
        "processor": chip,  # engine.processor: the chip its epochs trained on (the same "then")
    }
    if teacher_history:
        summary["teacher_test_acc"] = teacher_history[-1]["test_acc"]
    if validation is not None:
        summary |= validation_summary(validation, data, config)
        if teacher_history and teacher_history[-1].get("val_acc") is not None:
            summary["teacher_val_acc"] = teacher_history[-1]["val_acc"]
        write_validation(out / VALIDATION_FILE, validation["probabilities"], data.val, data.pool.keys(), classes)
    save_model(out, model, classes, preprocess, {"metrics": summary})
    results, truths = test_results(probabilities, data.test, classes)
    figures = draw_figures(history, test, results, truths, classes)
    for name, figure in figures.items():
        save_figure(figure, out / f"{name}.png")
    counts = {"train": data.train.counts(), "test": data.test.counts()}
    if data.val is not None:
        counts["val"] = data.val.counts()
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "trainable": trainable,
        "image_size": model.config.image_size,
        "train_image_size": train_size,
        "patch_size": model.config.patch_size,
        "data_root": str(data.root),
        "device": device_name(device, config.train.amp),
        "processes": processes,
    }
    sections = teacher_section(config, teacher_history, teacher_lent_by)
    sections += ["## Most confidently wrong test photos", "", "![most wrong](most_wrong.png)", ""]
    write_report(
        out,
        config=config,
        classes=classes,
        counts=counts,
        history=history,
        final=test,
        model_info=info,
        extra_sections=sections,
        validation={**validation, **validation_summary(validation, data, config)} if validation is not None else None,
    )
    if tensorboard is not None:
        figures["predictions"] = predictions_figure(results, truths)
        tensorboard.finish(config=config.to_dict(), final=test, figures=figures, epochs=len(history))


LARGE_MODEL_PARAMS = 20_000_000  # above this, say what a run will cost before it starts


def size_note(config, params: int, device: torch.device) -> str | None:
    """A word before a long CPU run or a large checkpoint (ViT-B/16: minutes an epoch, 1 GB)."""
    if params < LARGE_MODEL_PARAMS:
        return None
    moments = {"adam": 2, "adamw": 2, "sgd": 1}[config.optim.optimizer]
    checkpoint_gb = params * 4 * (1 + moments) / 1e9  # fp32 weights and optimiser state
    slow = (
        (
            " On a CPU each epoch takes minutes (the course recipe, ViT-B/16: about 3.5 minutes an epoch of "
            "FoodVision Mini's 225 photos on 2 cores)."
        )
        if device.type == "cpu"
        else ""
    )
    return (
        f"note: {config.model} has {params / 1e6:.1f} M parameters; "
        f"checkpoint.pt will hold about {checkpoint_gb:.1f} GB.{slow}"
    )
