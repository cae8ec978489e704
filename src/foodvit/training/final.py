"""The end of a run: the final test evaluation, with the confusion matrix and every photo's
probabilities (every rank evaluates its part), at --test-size when asked, then, on rank 0, the model
file, plots and report (report.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from foodvit.data.preprocess import Preprocess
from foodvit.model.vit import VisionTransformer
from foodvit.model.weights import resize_model
from foodvit.settings.run import RunConfig
from foodvit.training.distributed import Context
from foodvit.training.engine import StepSettings, evaluate
from foodvit.training.report import per_class_accuracy, write_results

if TYPE_CHECKING:
    from foodvit.training.tracking import TensorBoard


class Trained(Protocol):
    """What the final test reads of a trained run (trainer.Trainer)."""

    config: RunConfig
    out: Path
    main: bool
    ctx: Context
    device: torch.device
    settings: StepSettings
    model: VisionTransformer
    preprocess: Preprocess
    data: Any  # datasets.OpenDataset: the checked splits
    classes: tuple[str, ...]
    eval_loaders: dict[str, Any]
    test_loader: Any
    history: list[dict]
    teacher_history: list[dict]
    teacher_lent_by: str | None
    tensorboard: TensorBoard | None

    def eval_model(self) -> torch.nn.Module: ...

    def eval_loader(self, split: Any, preprocess: Preprocess) -> Any: ...


@dataclass
class Result:
    """What a run ends with (train() and resume() return it): its folder, its epochs' rows and the final test."""

    run: Path
    history: list[dict]
    test: dict  # loss, acc, n, confusion, per_class


def final_test(trainer: Trained) -> Result:
    """Final test evaluation (with the confusion matrix; every rank evaluates its part), then,
    on rank 0, the model file, plots and report."""
    model = trainer.eval_model()
    if isinstance(model, torch.optim.swa_utils.AveragedModel):
        model = model.module
    assert isinstance(model, VisionTransformer)  # the run's ViT, or the EMA's copy of it
    model, preprocess = at_test_size(trainer, model)

    def scored(split, own_loader) -> dict:
        """A split evaluated with every photo's probabilities and each class's accuracy."""
        loader = own_loader if preprocess == trainer.preprocess else trainer.eval_loader(split, preprocess)
        result = evaluate(
            model,
            loader,
            trainer.settings,
            num_classes=len(trainer.classes),
            keep_probabilities=True,
            gather=trainer.ctx.gather,
        )
        result["per_class"] = per_class_accuracy(result["confusion"], trainer.classes)
        return result

    test = scored(trainer.data.test, trainer.test_loader)
    probabilities = test.pop("probabilities")
    # a validation source (--validate-on) is judged by the same final model, every photo's answer kept
    validation = scored(trainer.data.val, trainer.eval_loaders["val"]) if trainer.data.pool is not None else None
    if trainer.main:
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        write_results(
            trainer.out,
            config=trainer.config,
            data=trainer.data,
            model=model,
            trainable=trainable,
            train_size=trainer.model.config.image_size,
            preprocess=preprocess,
            test=test,
            probabilities=probabilities,
            history=trainer.history,
            teacher_history=trainer.teacher_history,
            teacher_lent_by=trainer.teacher_lent_by,
            validation=validation,
            device=trainer.device,
            processes=trainer.ctx.world_size,
            tensorboard=trainer.tensorboard,
        )
    trainer.ctx.barrier()  # the other ranks end when the run directory is complete
    return Result(trainer.out, trainer.history, test)


def at_test_size(trainer: Trained, model: VisionTransformer) -> tuple[VisionTransformer, Preprocess]:
    """The trained model and its preprocessing at --test-size (FixRes): a copy rebuilt for that
    resolution, position embeddings resampled (fixed sin-cos ones recomputed for the new grid)."""
    size = trainer.config.data.test_size
    if not size or size == model.config.image_size:
        return model, trainer.preprocess
    return resize_model(model, size).to(trainer.device).eval(), trainer.preprocess.at_size(size)
