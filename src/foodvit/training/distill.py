"""Distillation from a convolutional teacher trained on the same photos (Touvron et al. 2021, "Training
data-efficient image transformers & distillation through attention" (DeiT), section 5: hard-label
distillation).

A CNN's locality and translation equivariance are what a ViT lacks on small data; a CNN trained
from scratch on the same few hundred photos classifies better than the ViT does. With --distill W,
the run first trains the teacher (a torchvision architecture, random initialisation, the run's own
photos, augmentation, optimiser and schedule), then the ViT with

    loss = CE(student(x), y) + W x CE(student(x), argmax teacher(x))

on every augmented batch x: the teacher labels the crop the student sees, which is what it adds
over the true label (DeiT's hard distillation; W = 1 is DeiT's equal weighting of the two terms,
doubled). The teacher is saved as teacher.pt in the run (a resumed run loads it instead of training
it again) and plays no part in prediction: the saved model is the ViT alone.

By default the teacher's labels train the ViT's own head. With --distill-token (DeiT's distillation
token, model/vit.py deviation 9) they train the token's own head instead:

    loss = CE(head(x), y) + W x CE(head_dist(x), argmax teacher(x))

and the model predicts with the mean of the two heads' logits.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.config import TEACHERS
from foodvit.errors import ConfigError, RunError
from foodvit.rundir.directory import TEACHER_FILE, load_checkpoint, save_checkpoint
from foodvit.seeds import derive_seed
from foodvit.training.heads import HeadsAndLoss, TaughtLoss, loss_so_far
from foodvit.training.engine import FitHooks, epoch_line, fit
from foodvit.training.optim import build_optimizer, build_scheduler


def build_teacher(name: str, num_classes: int) -> nn.Module:
    """A torchvision classifier with random weights (no download, nothing pre-trained)."""
    import torchvision

    if name not in TEACHERS:
        raise ConfigError(f"--teacher must be one of {', '.join(TEACHERS)}, got {name!r}")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def teacher_skeleton(name: str, num_classes: int) -> nn.Module:
    """The teacher's architecture, built without drawing from the random state: what a wrapper needs
    to know of it (its stages' widths) before the teacher is trained."""
    with torch.random.fork_rng(devices=[]):
        return build_teacher(name, num_classes)


class WithDistillation(TaughtLoss):
    """A student trained on a frozen teacher's hard labels besides the true ones: the term is weight x
    the cross-entropy of the distillation token's logits (without the token: the logits') against
    the teacher's predicted classes. The student is a VisionTransformer or one wrapped for training."""

    def forward_heads(self, images: torch.Tensor) -> HeadsAndLoss:
        teacher = self.trained_teacher()
        heads = self.student.forward_heads(images)
        with torch.no_grad():
            targets = teacher(images).argmax(dim=1)  # an empty share gives an empty (0,) tensor
        student = heads.logits if heads.distilled is None else heads.distilled  # the token's own head, if any
        # the mean over the batch, as a sum over its count: an empty share (distributed) gives 0
        distill = F.cross_entropy(student.float(), targets, reduction="sum") / max(1, images.shape[0])
        return HeadsAndLoss(heads.logits, heads.distilled, self.weight * distill + loss_so_far(heads))


def read_teacher(path: Path, architecture: str) -> dict | None:
    """A run's saved CNN teacher (of distillation or locality guidance), or None when it has none yet."""
    if not path.is_file():
        return None
    state = load_checkpoint(path)
    if state.get("format") != "foodvit-teacher" or state.get("architecture") != architecture:
        raise RunError(f"{path} is not this run's {architecture} CNN teacher; remove it to train the teacher again")
    return state


def train_or_load_teacher(trainer) -> torch.nn.Module:
    """The CNN teacher of distillation and locality guidance: the run's teacher.pt when it has one (a resumed run), else a
    CNN trained now from random initialisation on the run's training photos, with its
    augmentation, optimiser settings, schedule and epochs, then saved there."""
    c = trainer.config
    path = trainer.out / TEACHER_FILE
    torch.manual_seed(derive_seed(c.train.seed, "teacher-init"))
    teacher = build_teacher(c.optim.teacher, len(trainer.classes)).to(trainer.device)
    saved = trainer.ctx.broadcast(trainer.ctx.on_main(read_teacher, path, c.optim.teacher))
    if saved is None:
        trainer.log(f"training the CNN teacher ({c.optim.teacher}, random initialisation) for {c.train.epochs} epochs")
        optimizer = build_optimizer(teacher, c.optim, trainer.device)
        scheduler = build_scheduler(optimizer, c.optim, trainer.steps_per_epoch, c.train.epochs)

        def before(epoch: int) -> None:
            torch.manual_seed(derive_seed(c.train.seed, "teacher-step", epoch))
            trainer.train_loader.batch_sampler.set_epoch(epoch)

        hooks = FitHooks(before_epoch=[before], after_epoch=[lambda _, row: trainer.log("teacher " + epoch_line(row, c.train.epochs))])
        history = fit(trainer.ctx.wrap(teacher), trainer.train_loader, {"test": trainer.eval_loaders["test"]}, optimizer, scheduler,
                      epochs=c.train.epochs, settings=replace(trainer.settings, input_size=0), hooks=hooks,
                      eval_every=c.train.epochs, show_progress=not trainer.quiet, num_classes=len(trainer.classes))
        saved = {"format": "foodvit-teacher", "architecture": c.optim.teacher, "model": teacher.state_dict(), "history": history}
        if trainer.main:
            save_checkpoint(path, saved)
            if not trainer.history:  # the run is resumable from here: an interruption keeps the trained teacher
                save_checkpoint(trainer.out / "checkpoint.pt", trainer.state(0))
    else:
        teacher.load_state_dict(saved["model"])
        trainer.log(f"CNN teacher: {path} ({c.optim.teacher}, trained earlier in this run)")
    trainer.teacher_history = list(saved["history"])
    return teacher
