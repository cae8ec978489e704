"""A stage a run trains before its own epochs: its CNN teacher (teacher.py) or its self-supervised
pre-training (pretrain.py). Each fits another module (or the model inside another task) on the
run's training loader and photo order, with an optimiser and schedule of its own over the stage's
epochs, every epoch's random draws seeded from the stage's own purpose (seeds.py). Its inputs are
explicit (StageData): nothing here reads the Trainer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from foodvit.seeds import derive_seed
from foodvit.settings.run import OptimConfig
from foodvit.training.distributed import Context
from foodvit.training.engine import FitHooks, StepSettings, fit
from foodvit.training.optim import build_optimizer, build_scheduler


@dataclass
class StageData:
    """What a stage trains on: the run's training loader (its order and augmentation set per epoch),
    this process's context (device, processes), the run's seed, the optimiser steps an epoch, and
    whether progress bars and lines are off."""

    loader: Any
    context: Context
    seed: int
    steps_per_epoch: int
    quiet: bool = True


class Stage:
    """`module` (returning the engine's Output) fitted for `epochs` on the stage's data, with an optimiser and
    schedule of its own (kept in state() so that an interrupted stage resumes where it stopped)."""

    def __init__(self, module: nn.Module, data: StageData, *, epochs: int, purpose: str, optim: OptimConfig) -> None:
        self.module, self.data, self.epochs, self.purpose = module, data, epochs, purpose
        self.optimizer = build_optimizer(module, optim, data.context.device)
        self.scheduler = build_scheduler(self.optimizer, optim, data.steps_per_epoch, epochs)

    def state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def restore(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def fit(
        self,
        settings: StepSettings,
        *,
        start_epoch: int = 0,
        after_epoch: Iterable[Callable[[int, dict], None]] = (),
        eval_loaders: dict | None = None,
        eval_model: nn.Module | None = None,
        eval_every: int = 1,
        num_classes: int | None = None,
        label: str = "epoch",
    ) -> list[dict]:
        """Fit from start_epoch; each epoch seeds torch from (run seed, purpose, epoch) and sets the
        loader's epoch; eval_model, the classifier evaluated on eval_loaders. Returns the rows of the epochs it
        trained."""
        data = self.data

        def before(epoch: int) -> None:
            torch.manual_seed(derive_seed(data.seed, self.purpose, epoch))
            data.loader.batch_sampler.set_epoch(epoch)

        return fit(
            data.context.wrap(self.module),
            data.loader,
            eval_loaders or {},
            self.optimizer,
            self.scheduler,
            epochs=self.epochs,
            start_epoch=start_epoch,
            settings=settings,
            hooks=FitHooks(before_epoch=[before], after_epoch=list(after_epoch)),
            eval_model=None if eval_model is None else lambda: eval_model,
            eval_every=eval_every,
            show_progress=not data.quiet,
            num_classes=num_classes,
            stage=label,
        )
