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
doubled). The teacher (training/teacher.py) is saved as teacher.pt in the run and plays no part in
prediction: the saved model is the ViT alone.

By default the teacher's labels train the ViT's own head. With --distill-token (DeiT's distillation
token, model/vit.py deviation 9) they train the token's own head instead:

    loss = CE(head(x), y) + W x CE(head_dist(x), argmax teacher(x))

and the model predicts with the mean of the two heads' logits.

With --distill-temperature T > 0 the term is soft distillation instead (Hinton et al. 2015; DeiT's
soft variant, T = 3): the student matches the teacher's class probabilities softened at T,

    loss = CE(student(x), y) + W x T^2 x KL(softmax(teacher(x) / T) || softmax(student(x) / T))

which passes on how sure the teacher is and which classes it confuses, not only its choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from foodvit.settings.objectives import OBJECTIVE_SETTINGS
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs
from foodvit.training.teacher import Teacher


class Distillation(Objective):
    """The student learns a frozen teacher's classes besides the true ones: the term is the
    cross-entropy of the distillation token's logits (without the token: the logits') against the
    teacher's predicted classes, or, at a temperature T > 0, against its probabilities softened at T:
    T^2 x KL(softmax(teacher / T) || softmax(student / T)) (Hinton et al. 2015; the T^2 keeps the
    term's gradients the size of the hard term's as T grows). Nothing of its own is trained."""

    settings = OBJECTIVE_SETTINGS["distill"]

    def __init__(self, weight: float, temperature: float = 0.0, teacher: Teacher | None = None) -> None:
        super().__init__(weight)
        self.temperature = temperature
        self.teacher = teacher  # given later when the run trains it (WithObjectives.set_teacher)

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> Distillation:
        return cls(config.distill.weight, config.distill.temperature)

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        # the teacher's classes for the batch as loaded; an empty share gives (0, classes)
        heads, taught = outputs.heads, self.the_teacher().logits(batch.images).float()
        student = (heads.logits if heads.distilled is None else heads.distilled).float()  # the token's own head, if any
        # the mean over the batch, as a sum over its count: an empty share (distributed) gives 0
        if self.temperature > 0:
            t = self.temperature
            distill = (
                t
                * t
                * F.kl_div(
                    F.log_softmax(student / t, dim=1),
                    F.log_softmax(taught / t, dim=1),
                    reduction="sum",
                    log_target=True,
                )
            )
        else:
            distill = F.cross_entropy(student, taught.argmax(dim=1), reduction="sum")
        return distill / max(1, batch.images.shape[0])
