"""One optimisation step of the training loop (engine.py): the settings it is taken with, a micro-batch
on the device, the model's objective on it, the accumulated gradients (sharpness-aware minimisation's
second pass when on), clipping, the optimiser and the schedule; and what a step hook sees afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from foodvit.training.batchnorm import running_statistics_untouched


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass
class StepSettings:
    """How each optimisation step is taken, and, for distributed training, how this process
    combines with the others (distributed.Context gives reduce and world_size; one process: the
    identity and 1)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    accum_steps: int = 1
    clip_grad: float = 0.0
    label_smoothing: float = 0.0
    amp: bool = False  # bf16 autocast (CUDA)
    sync_every: int = 1  # check the loss for NaN every N steps (a host sync on GPUs)
    reduce: Callable[[torch.Tensor], torch.Tensor] = _identity  # the sum over processes
    world_size: int = 1
    input_shape: tuple[int, ...] = ()  # (C, H, W): the model's input, for a process whose share of a batch is empty
    grad_norm: bool = False  # measure the gradient norm every step (for step hooks), also without clipping
    input_size: int = 0  # progressive resizing: training batches are resized to this side first (0: as loaded)
    # sharpness-aware minimisation's radius rho (0: off): each step's gradient is taken at the worst nearby weights
    sam: float = 0.0


@dataclass
class StepInfo:
    """What a step hook sees after each optimiser step. loss is this process's share of the step
    (a tensor: reading it waits for the GPU); running_loss and running_acc are the epoch's so far
    over all processes, as of the last NaN check."""

    epoch: int
    step: int  # optimiser steps so far in this epoch
    steps: int  # optimiser steps in the epoch
    loss: torch.Tensor
    lr: float
    grad_norm: torch.Tensor | None
    running_loss: float
    running_acc: float | None  # None for a self-supervised objective: no classes
    model: nn.Module


def autocast(settings: StepSettings):
    if settings.amp and settings.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def hard_labels(labels: torch.Tensor) -> torch.Tensor:
    """Class indices, also from soft targets (mixup, cutmix): the dominant class."""
    return labels.argmax(dim=1) if labels.ndim == 2 else labels


def batch_sums(
    logits: torch.Tensor | None, labels: torch.Tensor, objective_sum: torch.Tensor, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's sums (plain cross-entropy, objective, correct, images) in float64, and its plain
    cross-entropy against the dominant class (mixed photos); for a self-supervised objective (logits
    None) what is shown as its loss is the objective itself, and nothing is correct."""
    with torch.no_grad():
        if logits is not None:
            hard = hard_labels(labels)
            plain = F.cross_entropy(logits.detach().float(), hard, reduction="sum")
            correct = (logits.detach().argmax(dim=1) == hard).sum()
        else:
            plain, correct = objective_sum.detach(), torch.zeros((), device=device)
        count = torch.tensor(float(n), device=device, dtype=torch.float64)
        return torch.stack([plain.double(), objective_sum.detach().double(), correct.double(), count]), plain


def no_sync(model: nn.Module, skip: bool):
    """DistributedDataParallel all-reduces gradients in every backward; during accumulation only the
    group's last micro-batch needs it."""
    return model.no_sync() if skip and isinstance(model, DistributedDataParallel) else contextlib.nullcontext()


def objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, s: StepSettings):
    """The model's logits (None for a self-supervised objective) and the objective summed over the
    batch: cross-entropy with the targets, plus the auxiliary loss a model may return per image."""
    with autocast(s):
        out = model(images)
    logits, extra = out if isinstance(out, tuple) else (out, None)
    loss_sum = (
        F.cross_entropy(logits.float(), labels, label_smoothing=s.label_smoothing, reduction="sum")
        if logits is not None
        else torch.zeros((), device=s.device)
    )
    return logits, loss_sum if extra is None else loss_sum + extra * images.shape[0]


def sharpness_aware_gradients(model: nn.Module, group: list, s: StepSettings) -> None:
    """Sharpness-aware minimisation (Foret et al. 2021; for ViTs from scratch, Chen et al. 2022). The
    parameters' .grad hold g, the step's gradient at the weights w (under DistributedDataParallel
    already the processes' average, so every process moves the same way). Three moves:
      1. ascend: eps = rho g / ||g||_2, the steepest point at distance rho (the paper's Eq. 2, p = 2), w + eps;
      2. the group's gradient there, the same micro-batches and scaling (Eq. 3); dropout, drop-path,
         the localization loss's pairs, the masks and the contrast's second view draw again;
      3. back to w (up to float rounding, the same on every process).
    The optimiser then steps from w with the gradient of the worst nearby loss. Gradient clipping and
    TensorBoard's gradient norm see that second gradient; the step's loss and accuracy are the first pass's."""
    pairs = [(p, p.grad) for p in model.parameters() if p.grad is not None]
    if not pairs:
        return
    params, grads = [p for p, _ in pairs], [g for _, g in pairs]
    norm = nn.utils.get_total_norm(grads)
    with torch.no_grad():  # 1. ascend
        eps = [g * (s.sam / (norm + 1e-12)) for g in grads]
        for p, e in zip(params, eps, strict=True):
            p.add_(e)
    # every parameter of these models is used in each pass (DistributedDataParallel requires it),
    # so each gets its gradient again
    model.zero_grad(set_to_none=True)
    with running_statistics_untouched(model):  # 2. the gradient at w + eps
        for k, (images, labels, scale) in enumerate(group):
            with no_sync(model, k + 1 != len(group)):
                (objective(model, images, labels, s)[1] * scale).backward()
    with torch.no_grad():  # 3. back to w
        for p, e in zip(params, eps, strict=True):
            p.sub_(e)


def on_device(batch, s: StepSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch on the device at the size progressive resizing trains at (empty for an empty share: it joins
    the step)."""
    if batch is None:
        shape = (*s.input_shape[:-2], s.input_size, s.input_size) if s.input_size else s.input_shape
        return torch.zeros((0, *shape), device=s.device), torch.zeros(0, dtype=torch.long, device=s.device)
    images = batch[0].to(s.device, non_blocking=True)
    labels = batch[1].to(s.device, non_blocking=True)
    if s.input_size and images.shape[-1] != s.input_size:  # antialiased, as a photo decoded smaller would be
        images = F.interpolate(images, size=(s.input_size, s.input_size), mode="bilinear", antialias=True)
    return images, labels


def optimiser_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, group: list, s: StepSettings
) -> tuple[torch.Tensor | None, float]:
    """The step at the end of a group of micro-batches (their gradients accumulated): sharpness-aware
    minimisation's second gradient if on, clipping, the optimiser and the schedule. Returns the
    gradient norm (when clipped or asked for) and the learning rate the step took."""
    if s.sam:
        sharpness_aware_gradients(model, group, s)
        group.clear()
    grad_norm = None
    if s.clip_grad > 0:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), s.clip_grad)
    elif s.grad_norm:
        grad_norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return grad_norm, lr
