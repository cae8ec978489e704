"""The training loop: train one epoch, evaluate, fit. It knows nothing of ViTs or photos: any
classifier, any loader of (inputs, labels) with labels as class indices or as soft targets (B, K).
A model may return (logits, auxiliary loss) in training mode; the auxiliary loss is added to the
cross-entropy (e.g. drloc.py's dense relative localization).

Accuracy is per image: correct predictions over images seen, never a mean of batch means.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .errors import FoodVitError


class TrainingDiverged(FoodVitError, RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class StepSettings:
    """How each optimisation step is taken."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    accum_steps: int = 1
    clip_grad: float = 0.0
    label_smoothing: float = 0.0
    amp: bool = False  # bf16 autocast (CUDA)
    sync_every: int = 1  # check the loss for NaN every N steps (a host sync on GPUs)


def autocast(settings: StepSettings):
    if settings.amp and settings.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _hard(labels: torch.Tensor) -> torch.Tensor:
    """Class indices, also from soft targets (mixup, cutmix): the dominant class."""
    return labels.argmax(dim=1) if labels.ndim == 2 else labels


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    settings: StepSettings | None = None,
    *,
    on_step: Iterable[Callable[[nn.Module], None]] = (),
    progress: str | None = None,
) -> dict[str, float]:
    """One pass over `loader`. Returns, per image: train_loss, the plain cross-entropy of the
    predictions against the photos' classes (the dominant class of a mixed photo), without label
    smoothing or auxiliary loss, so that it compares with the evaluation loss; train_objective,
    what the optimiser minimised (label smoothing, mixed targets and any auxiliary loss included);
    train_acc; n; lr."""
    s = settings or StepSettings()
    model.train()
    total_batches = len(loader)
    sums = torch.zeros(2, device=s.device, dtype=torch.float64)  # plain cross-entropy, objective
    correct = torch.zeros((), device=s.device, dtype=torch.int64)
    seen = 0
    lr = optimizer.param_groups[0]["lr"]
    bar = tqdm(loader, total=total_batches, desc=progress, disable=progress is None, leave=False, unit="batch")
    optimizer.zero_grad(set_to_none=True)
    for i, (images, labels) in enumerate(bar):
        images = images.to(s.device, non_blocking=True)
        labels = labels.to(s.device, non_blocking=True)
        group_end = min(total_batches, (i // s.accum_steps + 1) * s.accum_steps)
        group_size = group_end - (i // s.accum_steps) * s.accum_steps
        with autocast(s):
            out = model(images)
            logits, extra = out if isinstance(out, tuple) else (out, None)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=s.label_smoothing)
            objective = loss if extra is None else loss + extra
        (objective / group_size).backward()
        n = images.shape[0]
        hard = _hard(labels)
        with torch.no_grad():
            plain = F.cross_entropy(logits.detach().float(), hard)
        sums += torch.stack([plain.double(), objective.detach().double()]) * n
        correct += (logits.detach().argmax(dim=1) == hard).sum()
        seen += n
        if i + 1 == group_end:
            if s.clip_grad > 0:
                nn.utils.clip_grad_norm_(model.parameters(), s.clip_grad)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
            for hook in on_step:
                hook(model)
        if (i + 1) % s.sync_every == 0 or i + 1 == total_batches:
            plain_sum, objective_sum = sums.tolist()  # any NaN or inf since the last check shows in the sums
            if not (math.isfinite(plain_sum) and math.isfinite(objective_sum)):
                raise TrainingDiverged(f"the loss became {objective.item()} at step {i + 1} of {total_batches}")
            bar.set_postfix(loss=f"{plain_sum / seen:.3f}", acc=f"{correct.item() / seen:.3f}", refresh=False)
    bar.close()
    plain_sum, objective_sum = sums.tolist()
    return {"train_loss": plain_sum / max(seen, 1), "train_objective": objective_sum / max(seen, 1),
            "train_acc": correct.item() / max(seen, 1), "n": seen, "lr": lr}


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, settings: StepSettings | None = None, num_classes: int | None = None,
             progress: str | None = None, keep_probabilities: bool = False) -> dict:
    """Loss (mean per image), accuracy (per image), n, and the confusion matrix (rows = true class);
    with keep_probabilities, also every sample's class probabilities (n, K), in loader order."""
    s = settings or StepSettings()
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    confusion = None
    kept = []
    for images, labels in tqdm(loader, desc=progress, disable=progress is None, leave=False, unit="batch"):
        images, labels = images.to(s.device), labels.to(s.device)
        with autocast(s):
            logits = model(images).float()
        k = num_classes or logits.shape[1]
        if confusion is None:
            confusion = torch.zeros(k, k, dtype=torch.int64)
        predictions = logits.argmax(dim=1)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (predictions == labels).sum().item()
        seen += labels.numel()
        confusion += torch.bincount((labels * k + predictions).cpu(), minlength=k * k).reshape(k, k)
        if keep_probabilities:
            kept.append(logits.softmax(dim=-1).cpu())
    if seen == 0:
        raise ValueError("nothing to evaluate: the loader is empty")
    result = {"loss": loss_sum / seen, "acc": correct / seen, "n": seen, "confusion": confusion}
    if keep_probabilities:
        result["probabilities"] = torch.cat(kept)
    return result


@dataclass
class FitHooks:
    """What happens around the loop: before each epoch (seeding, sampler order), after each step
    (EMA), after each epoch (metrics, checkpoint, report)."""

    before_epoch: list[Callable[[int], None]] = field(default_factory=list)
    on_step: list[Callable[[nn.Module], None]] = field(default_factory=list)
    after_epoch: list[Callable[[int, dict], None]] = field(default_factory=list)


def fit(
    model: nn.Module,
    train_loader,
    eval_loaders: dict[str, Iterable],
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    *,
    epochs: int,
    start_epoch: int = 0,
    settings: StepSettings | None = None,
    hooks: FitHooks | None = None,
    eval_model: Callable[[], nn.Module] | None = None,
    eval_every: int = 1,
    show_progress: bool = True,
) -> list[dict]:
    """Train from start_epoch to epochs; after each, evaluate on every named loader (val, test).

    Each epoch's row: epoch, train_loss, train_objective, train_acc, <name>_loss, <name>_acc, lr, seconds.
    eval_model() gives the model to evaluate (e.g. the EMA); default: the trained model.
    """
    hooks = hooks or FitHooks()
    history = []
    for epoch in range(start_epoch, epochs):
        for hook in hooks.before_epoch:
            hook(epoch)
        started = time.perf_counter()
        label = f"epoch {epoch + 1}/{epochs}" if show_progress else None
        row = {"epoch": epoch + 1, **train_one_epoch(model, train_loader, optimizer, scheduler, settings,
                                                     on_step=hooks.on_step, progress=label)}
        if (epoch + 1) % eval_every == 0 or epoch + 1 == epochs:
            target = eval_model() if eval_model else model
            for name, loader in eval_loaders.items():
                result = evaluate(target, loader, settings)
                row[f"{name}_loss"], row[f"{name}_acc"] = result["loss"], result["acc"]
        row["seconds"] = time.perf_counter() - started
        row.pop("n", None)
        history.append(row)
        for hook in hooks.after_epoch:
            hook(epoch, row)
    return history
