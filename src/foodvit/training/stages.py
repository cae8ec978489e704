"""A stage a run trains before its own epochs: its CNN teacher (distill.py) or its self-supervised
pre-training (pretrain.py). Each fits another module (or the model inside another task) on the
run's training loader and photo order, with an optimiser and schedule of its own over the stage's
epochs, every epoch's random draws seeded from the stage's own purpose (seeds.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from foodvit.config import OptimConfig
from foodvit.seeds import derive_seed
from foodvit.training.engine import FitHooks, StepSettings, fit
from foodvit.training.optim import build_optimizer, build_scheduler


def fit_stage(trainer, module: nn.Module, *, epochs: int, purpose: str, optim: OptimConfig, settings: StepSettings,
              after_epoch: Iterable[Callable[[int, dict], None]] = (), eval_loaders: dict | None = None, eval_every: int = 1,
              num_classes: int | None = None, stage: str = "epoch") -> list[dict]:
    """Fit `module` for `epochs` on the trainer's training loader (wrapped for its processes); each
    epoch seeds torch from (run seed, purpose, epoch) and sets the loader's epoch. Returns the rows."""
    seed = trainer.config.train.seed
    optimizer = build_optimizer(module, optim, trainer.device)
    scheduler = build_scheduler(optimizer, optim, trainer.steps_per_epoch, epochs)

    def before(epoch: int) -> None:
        torch.manual_seed(derive_seed(seed, purpose, epoch))
        trainer.train_loader.batch_sampler.set_epoch(epoch)

    return fit(trainer.ctx.wrap(module), trainer.train_loader, eval_loaders or {}, optimizer, scheduler, epochs=epochs,
               settings=settings, hooks=FitHooks(before_epoch=[before], after_epoch=list(after_epoch)), eval_every=eval_every,
               show_progress=not trainer.quiet, num_classes=num_classes, stage=stage)
