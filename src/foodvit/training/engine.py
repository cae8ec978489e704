"""The training loop: one optimisation step, train one epoch, evaluate, fit. It knows nothing of ViTs or
photos: any module that returns an Output for a batch of inputs (logits, and a loss it adds to the
cross-entropy: the training objectives' terms, objectives/compose.py; or no logits, when its loss alone
is minimised and the labels are not read, pretrain.py), with labels as class indices or as soft
targets (B, K); a plain classifier trains as Classifier(model). Evaluation reads any classifier.

Accuracy is per image: correct predictions over images seen, never a mean of batch means.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from foodvit.errors import FoodVitError
from foodvit.training.batchnorm import running_statistics_untouched


class TrainingDiverged(FoodVitError, RuntimeError):
    """The loss, or the weights, became NaN or infinite."""


class Output(NamedTuple):
    """What a module the engine trains returns for a batch. (A NamedTuple: DistributedDataParallel, torch.compile and
    torch.export look inside a tuple for its tensors.)"""

    logits: (
        torch.Tensor | None
    )  # (B, K): what the cross-entropy and the accuracy read; None: no classes (self-supervised)
    loss: torch.Tensor | None = None  # (): a mean per image added to the cross-entropy; None: nothing added


class Classifier(nn.Module):
    """A classifier (inputs -> logits) as the engine trains it: Output(its logits), nothing added."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> Output:
        return Output(self.model(inputs))


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
    amp: bool = False  # bf16 autocast (computes_bf16: CUDA, and training steps on a CPU that computes bf16)
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


@functools.cache
def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): there bf16 autocast trains the default recipe
    about 1.5 times as fast as float32 (results/studies.csv, pool row "bf16 autocast"); elsewhere bf16 would only be
    emulated. Asked once a process (autocast asks at every training step)."""
    cpu = torch.cpu
    checks = (getattr(cpu, "_is_avx512_bf16_supported", None), getattr(cpu, "_is_amx_tile_supported", None))
    return any(check is not None and check() for check in checks)


def trains_in_bf16(device: torch.device, amp: bool) -> bool:
    """Whether training steps on `device` run under bf16 autocast with --amp `amp`: on CUDA, and on a CPU that
    computes bf16 natively (what a run's report and its teacher's place record)."""
    return amp and (device.type == "cuda" or (device.type == "cpu" and cpu_computes_bf16()))


def arithmetic(device: torch.device, amp: bool) -> str:
    """The arithmetic a run trains in, as its model.json and a study's results name it: "bf16" (trains_in_bf16) or
    "float32", on the device's kind, e.g. "bf16 on cpu". Two runs of one seed in different arithmetic train two
    different models (and CUDA evaluates in bf16 too: computes_bf16)."""
    return f"{'bf16' if trains_in_bf16(device, amp) else 'float32'} on {device.type}"


def processor(device: torch.device) -> str:
    """The chip a run trains on, as its model.json and a study's results name it: the GPU's name on CUDA, else the
    CPU's model name with its family and model numbers where /proc/cpuinfo gives them (a virtual machine may name
    two generations alike, e.g. 'AMD EPYC (family 25, model 17)'), else the platform's word for it. Two CPU models
    of one arithmetic round the same sums differently, so one seed trains two different models on them."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block
            key, _, value = line.partition(":")
            found.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = found.get("model name") or platform.processor() or platform.machine() or device.type
    if found.get("cpu family") and found.get("model"):
        name += f" (family {found['cpu family']}, model {found['model']})"
    return name


def computes_bf16(settings: StepSettings, training: bool) -> bool:
    """Whether a forward pass runs under bf16 autocast (settings.amp): on CUDA, training and evaluating; on a CPU
    that computes bf16 natively, only training steps, so that evaluation, the report and prediction (PyTorch or
    ONNX Runtime, both float32) give each photo the same answer."""
    return trains_in_bf16(settings.device, settings.amp) and (training or settings.device.type == "cuda")


def autocast(settings: StepSettings, training: bool = False):
    if computes_bf16(settings, training):
        return torch.autocast(settings.device.type, dtype=torch.bfloat16)
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


def objective(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, s: StepSettings
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The model's logits (None for a self-supervised objective) and the objective summed over the
    batch: cross-entropy with the targets, plus the loss the model adds per image (Output.loss)."""
    with autocast(s, training=True):
        out: Output = model(images)
    loss_sum = (
        F.cross_entropy(out.logits.float(), labels, label_smoothing=s.label_smoothing, reduction="sum")
        if out.logits is not None
        else torch.zeros((), device=s.device)
    )
    return out.logits, loss_sum if out.loss is None else loss_sum + out.loss * images.shape[0]


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


class Batches(Protocol):
    """What an epoch reads: batches, and how many (a DataLoader)."""

    def __iter__(self) -> Iterator: ...

    def __len__(self) -> int: ...


class ProgressBar:
    """The step hook behind the progress bar: optimiser steps, with the epoch's running loss and accuracy."""

    def __init__(self, label: str, total: int) -> None:
        self.bar = tqdm(total=total, desc=label, leave=False, unit="step")

    def __call__(self, info: StepInfo) -> None:
        shown = {"loss": f"{info.running_loss:.3f}"} | (
            {} if info.running_acc is None else {"acc": f"{info.running_acc:.3f}"}
        )
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def train_one_epoch(
    model: nn.Module,
    loader: Batches,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    settings: StepSettings | None = None,
    *,
    on_step: Iterable[Callable[[StepInfo], None]] = (),
    progress: str | None = None,
    epoch: int = 0,
) -> dict[str, float]:
    """One pass over `loader`, `model` returning an Output. Returns, per image: train_loss, the plain
    cross-entropy of the predictions against the photos' classes (the dominant class of a mixed photo), without label
    smoothing or auxiliary loss, so that it compares with the evaluation loss; train_objective,
    what the optimiser minimised (label smoothing, mixed targets and any auxiliary loss included);
    train_acc; n; lr; loading_s, the seconds spent waiting for the loader. For a self-supervised
    objective (an Output without logits) train_loss is the objective too, and train_acc 0.

    Distributed (settings.reduce, world_size): the loader gives this process's share of each
    global batch (None for an empty share), and each share's loss is scaled so that the gradient
    DistributedDataParallel averages is the global batch's mean, whatever the shares' sizes: a run
    on N processes takes the steps of a run on one. Every metric is summed over processes."""
    s = settings or StepSettings()
    model.train()
    total_batches = len(loader)
    steps = math.ceil(total_batches / s.accum_steps)
    sums = torch.zeros(4, device=s.device, dtype=torch.float64)  # plain cross-entropy, objective, correct, images
    # the sums over all processes, as of the last check (always done after the last batch)
    totals = [0.0, 0.0, 0.0, 0.0]
    lr = optimizer.param_groups[0]["lr"]
    bar = ProgressBar(progress, steps) if progress is not None else None
    hooks = list(on_step) + ([bar] if bar is not None else [])
    optimizer.zero_grad(set_to_none=True)
    waited = 0.0  # seconds spent waiting for batches: the loader's share of the epoch
    batches = iter(loader)
    group = []  # with sharpness-aware minimisation: the step's micro-batches, taken again at the moved weights
    for i in range(total_batches):
        started = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - started
        images, labels = on_device(batch, s)
        group_end = min(total_batches, (i // s.accum_steps + 1) * s.accum_steps)
        group_size = group_end - (i // s.accum_steps) * s.accum_steps
        n = images.shape[0]
        global_n = s.reduce(torch.tensor([float(n)], device=s.device)) if s.world_size > 1 else n
        # DistributedDataParallel averages over processes: scale by world_size / global images
        scale = s.world_size / (global_n * group_size)
        with no_sync(model, i + 1 != group_end):
            logits, objective_sum = objective(model, images, labels, s)
            (objective_sum * scale).backward()
        supervised = logits is not None  # else a self-supervised objective (pretrain.py): its loss alone, no classes
        if s.sam:  # kept (on the device) until the step's second pass: the accumulated micro-batches of one step
            group.append((images, labels, scale))
        row, plain = batch_sums(logits, labels, objective_sum, n, s.device)
        sums += row
        if (i + 1) % s.sync_every == 0 or i + 1 == total_batches:
            totals = s.reduce(sums).tolist()  # every process sees the same sums: they stop together on NaN
            if not (math.isfinite(totals[0]) and math.isfinite(totals[1])):
                raise TrainingDiverged(
                    f"the loss became {totals[1] / max(totals[3], 1)} at step {i + 1} of {total_batches}"
                )
        if i + 1 == group_end:
            grad_norm, lr = optimiser_step(model, optimizer, scheduler, group, s)
            if hooks:
                seen = max(totals[3], 1)
                running = (totals[0] / seen, totals[2] / seen if supervised else None)
                info = StepInfo(epoch, i // s.accum_steps + 1, steps, plain / max(n, 1), lr, grad_norm, *running, model)
                for hook in hooks:
                    hook(info)
    if bar is not None:
        bar.close()
    # the loss is checked before each step: the epoch's last step could leave overflowed weights unseen until a
    # later epoch, or, after the run's last epoch, in a model file that answers NaN (every rank holds the same weights)
    if not torch.stack([p.isfinite().all() for p in model.parameters()]).all():
        raise TrainingDiverged(f"the weights became NaN or infinite at step {steps} of {steps}")
    plain_sum, objective_total, correct_sum, seen = totals
    return {
        "train_loss": plain_sum / max(seen, 1),
        "train_objective": objective_total / max(seen, 1),
        "train_acc": correct_sum / max(seen, 1),
        "n": int(seen),
        "lr": lr,
        "loading_s": waited,
    }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    settings: StepSettings | None = None,
    num_classes: int | None = None,
    progress: str | None = None,
    keep_probabilities: bool = False,
    gather=None,
) -> dict:
    """Loss (mean per image), accuracy (per image), n, and the confusion matrix (rows = true class);
    with keep_probabilities, also every sample's class probabilities (n, K), in loader order.

    Distributed: each process evaluates its own part of the photos (sampling.make_loader), the sums
    are added over processes (settings.reduce) and the probabilities gathered in rank order
    (`gather`: distributed.Context.gather), so every photo counts once. num_classes is then needed
    (a process may have no photos)."""
    s = settings or StepSettings()
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, images
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64) if num_classes else None
    kept = []
    for images, labels in tqdm(loader, desc=progress, disable=progress is None, leave=False, unit="batch"):
        images, labels = images.to(s.device), labels.to(s.device)
        with autocast(s):
            logits = model(images).float()
        k = logits.shape[1]
        if confusion is None:
            confusion = torch.zeros(k, k, dtype=torch.int64)
        predictions = logits.argmax(dim=1)
        sums += torch.tensor(
            [
                F.cross_entropy(logits, labels, reduction="sum").item(),
                (predictions == labels).sum().item(),
                labels.numel(),
            ],
            dtype=torch.float64,
        )
        confusion += torch.bincount((labels * k + predictions).cpu(), minlength=k * k).reshape(k, k)
        if keep_probabilities:
            kept.append(logits.softmax(dim=-1).cpu())
    if s.world_size > 1:
        if confusion is None:
            raise ValueError("distributed evaluation needs num_classes (a process may have no photos)")
        sums = s.reduce(sums.to(s.device)).cpu()
        confusion = s.reduce(confusion.to(s.device)).cpu()
    loss_sum, correct, seen = sums.tolist()
    if seen == 0:
        raise ValueError("nothing to evaluate: the loader is empty")
    assert confusion is not None  # a batch made it, or num_classes did (required above on several processes)
    result = {"loss": loss_sum / seen, "acc": correct / seen, "n": int(seen), "confusion": confusion}
    if keep_probabilities:
        mine = torch.cat(kept) if kept else torch.zeros(0, confusion.shape[0])
        result["probabilities"] = torch.cat(gather(mine)) if gather is not None and s.world_size > 1 else mine
    return result


@dataclass
class FitHooks:
    """What happens around the loop: before each epoch (seeding, sampler order), after each
    optimiser step (EMA, TensorBoard: a StepInfo), after each epoch (metrics, checkpoint, report)."""

    before_epoch: list[Callable[[int], None]] = field(default_factory=list)
    on_step: list[Callable[[StepInfo], None]] = field(default_factory=list)
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
    num_classes: int | None = None,
    stage: str = "epoch",
) -> list[dict]:
    """Train from start_epoch to epochs; after each, evaluate on every named loader (val, test).

    Each epoch's row: epoch, train_loss, train_objective, train_acc, <name>_loss, <name>_acc, lr,
    seconds, images_per_s, model_share (the share of the training time not spent waiting for
    batches; on several processes, rank 0's). eval_model() gives the classifier to evaluate (the trained one,
    Classifier's model, or the EMA's), needed when there are eval_loaders.
    """
    if eval_loaders and eval_model is None:
        raise ValueError(
            "fit evaluates a classifier: give eval_model, the model the trained module's Output comes from"
        )
    hooks = hooks or FitHooks()
    history = []
    for epoch in range(start_epoch, epochs):
        for hook in hooks.before_epoch:
            hook(epoch)
        started = time.perf_counter()
        label = f"{stage} {epoch + 1}/{epochs}" if show_progress else None
        row = {
            "epoch": epoch + 1,
            **train_one_epoch(
                model, train_loader, optimizer, scheduler, settings, on_step=hooks.on_step, progress=label, epoch=epoch
            ),
        }
        trained_s = time.perf_counter() - started
        row["images_per_s"] = row.pop("n") / max(trained_s, 1e-9)
        # of the training time, not waiting for data
        row["model_share"] = 1 - row.pop("loading_s") / max(trained_s, 1e-9)
        if eval_model is not None and ((epoch + 1) % eval_every == 0 or epoch + 1 == epochs):
            target = eval_model()
            for name, loader in eval_loaders.items():
                result = evaluate(target, loader, settings, num_classes=num_classes)
                row[f"{name}_loss"], row[f"{name}_acc"] = result["loss"], result["acc"]
        row["seconds"] = time.perf_counter() - started
        history.append(row)
        for after in hooks.after_epoch:
            after(epoch, row)
    return history


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """Within the block, deterministic algorithms only, so that GPU training repeats exactly:
    without this, kernels that add in a varying order (attention and gather backward with atomics)
    make two runs, or a run and its resume, differ by rounding. The process's previous settings
    come back afterwards, CUBLAS_WORKSPACE_CONFIG included (cuBLAS reads it when its first handle
    is made, so it is set, if unset, before the block's first matrix product on the GPU)."""
    if not enabled:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.benchmark = previous[1]
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def silent(*args: object, **kwargs: object) -> None:
    """The log of a quiet run, of a rank other than the first, and of a cv fold: it writes nothing."""


def epoch_line(row: dict, epochs: int, stage: str = "epoch", losses: tuple[tuple[str, str], ...] = ()) -> str:
    """One epoch's row as a progress line: its number, the training loss and accuracy (or the `losses` given as
    (label, key) pairs), each evaluated split's, the learning rate and the seconds."""
    parts = [f"{stage} {row['epoch']:>3}/{epochs}"]
    parts += [f"{label} {row[key]:.4f}" for label, key in losses] or [
        f"train loss {row['train_loss']:.4f} acc {row['train_acc']:.3f}"
    ]
    for split in ("val", "test"):
        if row.get(f"{split}_acc") is not None:
            parts.append(f"{split} loss {row[f'{split}_loss']:.4f} acc {row[f'{split}_acc']:.3f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['seconds']:.1f} s"]
    return " | ".join(parts)


def own_random_state(device: torch.device):
    """A block that seeds and draws from PyTorch's random streams (CPU and this GPU) and gives the
    caller's state back when it ends: a training run seeds its own streams without resetting a
    notebook's."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    return torch.random.fork_rng(devices=devices)
