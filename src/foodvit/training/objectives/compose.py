"""The module a run's optimiser steps: the model (the ViT, or AnyGrid around it) and the objectives that
are on, each adding its own weighted term to the loss.

A training step prepares the batch (each objective in turn: masked patches draw which patches
hide), runs the ViT once on what it is shown, asking for the blocks and tokens the objectives read,
and adds each objective's weighted term (an objective that reads the CNN teacher runs it on the batch
as loaded), in the registry's order whatever order the objectives were given in: the random draws
(the masks, the token pairs, the second view) and the float sums are the same for any composition.
It returns the engine's Output, in training and evaluation mode alike; a prediction is the model's own
(WithObjectives.model): the saved model is the ViT alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from foodvit.training.engine import Output
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs, vit_of
from foodvit.training.teacher import Teacher


class WithObjectives(nn.Module):
    """One training step's forward pass: Output(the logits of Eq. 4's head, the sum of the objectives' weighted
    terms), which the engine adds to the cross-entropy; with no objective, nothing added (the model's own
    step). Built with supervised=False (a self-supervised stage, pretrain.py), Output(None, the terms' sum):
    no logits, and the heads add 0 x their sum so that every parameter has a gradient (of 0), as
    DistributedDataParallel expects."""

    def __init__(
        self,
        model: Computing,
        objectives: Iterable[Objective],
        *,
        order: Iterable[type] = (),
        supervised: bool = True,
        teacher: Teacher | None = None,
    ) -> None:
        super().__init__()
        rank = {kind: i for i, kind in enumerate(order)}
        self.model = model
        self.each = sorted(objectives, key=lambda o: rank.get(type(o), len(rank)))
        self.objectives = nn.ModuleList(self.each)  # registered: trained, moved and saved with the model
        self.supervised = supervised
        self.epoch, self.epochs = 0, 1
        if teacher is not None:
            self.set_teacher(teacher)

    @property
    def needs_teacher(self) -> bool:
        """Whether an objective reads the CNN teacher: the settings' rule (settings.run.reads_teacher)."""
        return any(o.settings.teacher for o in self.each)

    def set_teacher(self, teacher: Teacher) -> None:
        """The CNN teacher, once trained, given to each objective that reads it."""
        for objective in self.each:
            if objective.settings.teacher:
                objective.teacher = teacher

    def set_epoch(self, epoch: int, epochs: int) -> None:
        """The epoch (from 0) of how many the next steps train in: an objective's weight may depend on it."""
        self.epoch, self.epochs = epoch, epochs

    def forward(self, images: torch.Tensor) -> Output:
        outputs, terms = self.terms(images)
        total = None
        for term in terms.values():
            total = term if total is None else total + term
        if self.supervised:
            return Output(outputs.heads.logits, total)
        assert total is not None, "a self-supervised stage minimises its objectives' terms: it needs one"
        distilled = outputs.heads.distilled
        unused = outputs.heads.logits.sum() + (distilled.sum() if distilled is not None else 0.0)
        return Output(None, total + 0.0 * unused)

    def terms(self, images: torch.Tensor) -> tuple[Outputs, dict[str, torch.Tensor]]:
        """One step's outputs and each objective's weighted term, by name."""
        batch = Batch(images, self.model)
        for objective in self.each:
            objective.prepare(batch)
        outputs = self.outputs(batch)
        return outputs, {o.name(): o.weight_at(self.epoch, self.epochs) * o.loss(batch, outputs) for o in self.each}

    def outputs(self, batch: Batch) -> Outputs:
        """The ViT's forward pass on the batch as shown, with the blocks' patch tokens the objectives read."""
        vit = vit_of(self.model)
        blocks = sorted({i for o in self.each for i in o.blocks})
        class_only = vit.config.class_only_last_block and not any(o.reads_all_tokens for o in self.each)
        mask, token = batch.mask, batch.mask_token
        if blocks:
            tokens, kept = self.model.forward_intermediates(
                batch.shown, blocks, mask=mask, mask_token=token, class_only=class_only
            )
        else:
            tokens = self.model.forward_features(batch.shown, mask=mask, mask_token=token, class_only=class_only)
            kept = []
        heads = self.model.forward_head(tokens, heads=True)
        return Outputs(tokens, heads, dict(zip(blocks, kept, strict=True)))

    def state_dict_of_parts(self, keys: Iterable[str]) -> dict:
        """Each objective's trained part by its checkpoint key (None for a key whose objective is off)."""
        parts = {o.checkpoint_key: o.part for o in self.each if o.checkpoint_key and o.part is not None}
        return {key: parts[key].state_dict() if key in parts else None for key in keys}

    def load_parts(self, state: dict) -> None:
        for o in self.each:
            if o.checkpoint_key and o.part is not None:
                o.part.load_state_dict(state[o.checkpoint_key])
