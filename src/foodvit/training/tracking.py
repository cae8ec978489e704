"""Experiment tracking with TensorBoard (`foodvit train --tensorboard`), as the course's chapter 07
does it: event files in RUN/tensorboard, so that `tensorboard --logdir runs/` lays every run's
curves side by side and its HPARAMS tab compares their settings against their final metrics.

What is written (rank 0 only), all on one step axis, the optimiser steps taken:
    per step   train/step_loss (rank 0's share of the batch), train/lr, train/grad_norm
    per epoch  train/loss, train/acc, val/loss, val/acc, test/loss, test/acc, epoch/lr, epoch/images_per_s
    at the end the curves, the confusion matrix and the most confidently wrong test photos as
               images; the settings (hparams) with the final test accuracy and loss
A resumed run first removes what the interrupted one wrote after its last checkpoint (purge_step).
"""

from __future__ import annotations

from pathlib import Path

from foodvit.errors import FoodVitError

FOLDER = "tensorboard"
EPOCH_SCALARS = {
    "train_loss": "train/loss",
    "train_acc": "train/acc",
    "val_loss": "val/loss",
    "val_acc": "val/acc",
    "test_loss": "test/loss",
    "test_acc": "test/acc",
    "lr": "epoch/lr",
    "images_per_s": "epoch/images_per_s",
    "model_share": "epoch/model_share",
}


def require_tensorboard():
    """TensorBoard's SummaryWriter, or a one-line error saying how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise FoodVitError(
            "--tensorboard needs the tensorboard package: pip install 'foodvit[track]' "
            "(or pip install tensorboard), or train without --tensorboard"
        ) from None
    return SummaryWriter


def hparams_of(config: dict) -> dict:
    """A run's settings as the hparams plugin takes them: flat names, numbers, text or booleans."""
    from foodvit.rundir.compare import flatten

    return {
        name: ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        for name, value in flatten(config).items()
        if isinstance(value, (bool, int, float, str, list, tuple))
    }


class TensorBoard:
    """The run's event files. Use on_step and after_epoch as the engine's hooks, then finish()."""

    def __init__(self, run: Path, steps_per_epoch: int, start_epoch: int = 0) -> None:
        SummaryWriter = require_tensorboard()
        self.steps_per_epoch = steps_per_epoch
        # a resumed run: drop the interrupted run's events after the checkpoint it resumes from
        purge = start_epoch * steps_per_epoch + 1 if start_epoch else None
        self.writer = SummaryWriter(str(Path(run) / FOLDER), purge_step=purge)

    def _step(self, epoch: int, step: int) -> int:
        return epoch * self.steps_per_epoch + step

    def on_step(self, info) -> None:
        step = self._step(info.epoch, info.step)
        self.writer.add_scalar("train/step_loss", float(info.loss), step)
        self.writer.add_scalar("train/lr", info.lr, step)
        if info.grad_norm is not None:
            self.writer.add_scalar("train/grad_norm", float(info.grad_norm), step)

    def after_epoch(self, epoch: int, row: dict) -> None:
        step = self._step(epoch + 1, 0)
        for key, tag in EPOCH_SCALARS.items():
            if row.get(key) is not None:
                self.writer.add_scalar(tag, row[key], step)
        self.writer.flush()

    def finish(self, *, config: dict, final: dict, figures: dict, epochs: int) -> None:
        """The pictures, and the settings with the final metrics for the HPARAMS tab."""
        from torch.utils.tensorboard.summary import hparams

        step = self._step(epochs, 0)
        for name, figure in figures.items():
            self.writer.add_figure(name, figure, step, close=False)
        metrics = {"hparam/test_acc": final["acc"], "hparam/test_loss": final["loss"]}
        experiment, start, end = hparams(hparams_of(config), metrics)
        for summary in (experiment, start, end):
            self.writer.file_writer.add_summary(summary)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.close()

    def close(self) -> None:
        self.writer.close()
