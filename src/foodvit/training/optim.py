"""Optimisers, weight-decay groups, learning-rate schedules and the weight EMA.

Table 3 trains with Adam (beta1 0.9, beta2 0.999), linear warmup, then cosine or linear decay,
gradient clipping at global norm 1; fine-tuning uses SGD with momentum 0.9 and no weight decay.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from foodvit.errors import ConfigError
from foodvit.settings.run import OptimConfig

logger = logging.getLogger(__name__)


def no_decay_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters that some module inside `model` names in its no_weight_decay()
    (e.g. the ViT's class token and learned position embedding). Found by identity, so they are
    found through any wrapper (the localization loss's, torch.compile's, DDP's)."""
    found: set[int] = set()
    for module in model.modules():
        names = getattr(module, "no_weight_decay", None)
        if callable(names):
            own = dict(module.named_parameters())
            found |= {id(own[name]) for name in names() if name in own}
    return found


def param_groups(model: nn.Module, weight_decay: float, decay_all: bool = False) -> list[dict]:
    """Two groups: decayed weights, and the rest (biases, norm scales, and what the model names in
    no_weight_decay(), found by identity through any wrapper). Frozen parameters are left out."""
    skip = no_decay_parameters(model)
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if decay_all or (p.ndim > 1 and id(p) not in skip):
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def within_stage(cfg: OptimConfig, epochs: float) -> OptimConfig:
    """`cfg` for a stage on a schedule of its own (the CNN teacher's, the pre-training's): at most half of its
    `epochs` warming up, so that a short stage still reaches its peak rate and decays."""
    return replace(cfg, warmup_epochs=min(cfg.warmup_epochs, epochs / 2))


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, cfg.decay_all)
    if not groups:
        raise ConfigError("no trainable parameters: everything is frozen")
    # fused kernels on CUDA (one launch for all parameters); foreach on the CPU: fused CPU steps are faster but round
    # differently (bench/speed/optimisers.py), and the step is about 1% of the default recipe's training time there
    # (results/speed-phases.csv), too little to change the recorded runs for
    fast = {"fused": True} if device.type == "cuda" else {"foreach": True}
    if cfg.optimizer == "adam":  # weight decay as L2 in the gradient, as torch.optim.Adam (and the course) does
        return torch.optim.Adam(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), **fast)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), **fast)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fast)
    raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; expected adam, adamw or sgd")


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimiser step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps  # linear warmup, never exactly 0
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    elif schedule == "linear":
        shape = 1.0 - progress
    else:
        raise ConfigError(f"unknown schedule {schedule!r}; expected constant, cosine or linear")
    return min_ratio + (1 - min_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, steps_per_epoch: int, epochs: int):
    total = steps_per_epoch * epochs
    warmup = round(min(cfg.warmup_epochs * steps_per_epoch, 2**62))  # 1e308 epochs: steps past any count, not inf
    if warmup > total > 0:
        span = f"{epochs} epoch{'s' if epochs != 1 else ''}"
        logger.warning(
            f"the warm-up ({cfg.warmup_epochs:g} epochs) is longer than the training ({span}): the learning "
            f"rate rises to {total / warmup:.2g} of --lr and never decays; give --warmup-epochs at most {epochs}"
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, cfg.schedule, cfg.min_lr_ratio)
    )


def build_ema(model: nn.Module, decay: float) -> AveragedModel | None:
    """Exponential moving average of weights and buffers: ema = decay * ema + (1 - decay) * w."""
    if decay <= 0:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
