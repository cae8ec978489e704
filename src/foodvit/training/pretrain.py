"""Self-supervised pre-training on the run's own photos, a stage before supervised training
(--pretrain-epochs N): masked-image modelling in the manner of SimMIM (Xie et al. 2022), the
form of self-supervision on a few thousand images that Cao et al. 2022 (arXiv 2201.10728) and
Gani et al. 2022 (arXiv 2210.07240) find to lift a from-scratch ViT most as data shrinks.

For N epochs before the first supervised one, the ViT learns to fill holes: --pretrain-mask-ratio
of each image's patches are hidden (their pixels set to 0, the mean of normalised photos, before
the tokeniser, and their tokens replaced by a learned mask token, masked.py), and a linear decoder
predicts each hidden patch's normalised pixels from its output token:

    loss = mean over hidden patches of || decoder(z_L^i) - norm(x_p^i) ||^2

The classes are never read. The stage uses the run's training photos and augmentation (mixing
too, when on), its optimiser settings and a schedule of its own over the N epochs (the supervised
warmup, at most N / 2 epochs, then the decay), at --start-size when progressive resizing is on (its
cheaper first size). Then the supervised stage starts from the weights it leaves; the mask token
and the decoder are dropped. After the stage the run's checkpoint says so: a run interrupted later
resumes without pre-training again. One interrupted during the stage has no checkpoint yet and
is removed as any failed start is, unless it trained a CNN teacher first: it then resumes from
the teacher and pre-trains again from the start (the same seeds, the same weights). On several
processes (torchrun) each draws the masks of its own share of a batch: such a run pre-trains as
one process would, with other masks, not step for step the same (as with drloc's token pairs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from foodvit.rundir.directory import PRETRAINING_FILE, write_rows
from foodvit.seeds import derive_seed
from foodvit.settings.run import RunConfig
from foodvit.training.engine import StepSettings
from foodvit.training.engine import epoch_line as engine_epoch_line
from foodvit.training.objectives.base import Computing, vit_of
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.masked import MaskedPatches
from foodvit.training.optim import within_stage
from foodvit.training.stages import Stage, StageData

logger = logging.getLogger(__name__)
PRETRAINING_COLUMNS = ("epoch", "reconstruction_loss", "lr", "seconds")


def masked_image_modelling(model: Computing, ratio: float) -> WithObjectives:
    """The stage's task around a model (the ViT, or AnyGrid around it): in training mode (None, the
    reconstruction loss), which the engine minimises alone, the hidden pixels set to 0 before the
    tokeniser; in eval mode the model's prediction."""
    reconstruction = MaskedPatches(vit_of(model), 1.0, ratio, hide_pixels=True, option="--pretrain-epochs")
    return WithObjectives(model, [reconstruction], supervised=False)


def epoch_line(row: dict, epochs: int) -> str:
    return engine_epoch_line(
        row, epochs, stage="pre-training epoch", losses=(("reconstruction loss", "train_objective"),)
    )


def pretrain(
    model: Computing,
    config: RunConfig,
    data: StageData,
    settings: StepSettings,
    *,
    size: int,
    out: Path | None,
    rows: list[dict],
    log: Callable = print,
) -> None:
    """Pre-train `model` (the ViT, or AnyGrid around it) in place for config.pretrain.epochs epochs at
    `size` px, appending each epoch's row (epoch, train_objective: the reconstruction loss, lr, seconds) to
    `rows` and, with `out` (the run's folder, on the process that writes it), writing them to its pretraining.csv."""
    c = config
    epochs = c.pretrain.epochs
    torch.manual_seed(derive_seed(c.train.seed, "pretrain-init"))
    # the classes are not read
    task = masked_image_modelling(model, c.pretrain.mask_ratio).to(data.context.device)
    # sharpness-aware minimisation is the supervised stage's (--sam): here a second pass would draw other masks
    settings = replace(settings, input_size=0 if size == vit_of(model).config.image_size else size, sam=0.0)
    optim = within_stage(c.optim, epochs)  # the supervised warmup, at most half of this stage

    def after(epoch: int, row: dict) -> None:
        rows.append({k: row[k] for k in ("epoch", "train_objective", "lr", "seconds")})
        if out is not None:
            write_rows(
                out / PRETRAINING_FILE,
                [{"reconstruction_loss": r["train_objective"], **r} for r in rows],
                PRETRAINING_COLUMNS,
            )
        log(epoch_line(row, epochs))

    if not data.quiet:
        logger.info(
            "self-supervised pre-training (masked-image modelling, %.0f%% of the patches hidden) "
            "for %d epochs at %d px",
            100 * c.pretrain.mask_ratio,
            epochs,
            size,
        )
    Stage(task, data, epochs=epochs, purpose="pretrain-step", optim=optim).fit(
        settings, after_epoch=[after], label="pre-training"
    )
