"""Locality guidance (Li et al. 2022, "Locality Guidance for Improving Vision Transformers on Tiny
Datasets", ECCV; arXiv 2207.10026): a CNN trained on the same photos lends the ViT its *features*,
not its labels.

A ViT on a few hundred photos has to learn locality from them; a CNN has it built in. With
--guidance W, the run first trains the CNN teacher (the same one --distill trains: training/teacher.py,
random initialisation, the run's photos and schedule), then the ViT with

    loss = CE(student(x), y) + W x mean over pairs of || A_k(tokens of block b_k) - LN(stage_k(x)) ||^2

on every augmented batch x: the patch tokens of a few of the ViT's blocks, laid out on their grid,
go through a 1x1 convolution A_k (the adapter, trained with the ViT) and are compared with the
teacher's feature map of the matching stage on the same crop (its features standardised over the
channels at each position). Pairs: the teacher's first three stages, in order, with three blocks
spread over the ViT's depth, the last block left to the classifier; with --guidance-stages 4 the
teacher's last stage guides the ViT's last block too. Where the two grids differ
the finer one is average-pooled to the coarser. Training only: the adapters and the teacher are
not part of the saved model.

Where this differs from Li et al.'s setting (DeiT-Tiny, 12 blocks, CIFAR at 32 px, the teacher at
low resolution): they guide the first, a middle and the last block (here --guidance-stages 4 guides
the last one too), compare the raw teacher
features after upsampling both maps to the finer grid, sum the pairs with weight 2.5, and feed the
teacher a downsampled image. Here the teacher's features are standardised at each position (so
the weight means the same for any teacher), the coarser grid is kept (no detail is invented), the
pairs are averaged, and teacher and student read the same crop (64 to 96 px in the default recipe),
already a low resolution.

The weight W holds for every epoch, or with --guidance-schedule linear falls from W at the first epoch
towards 0: epoch e of E weighs W x (1 - e/E), a mean of W (E + 1) / 2E, about W/2 over many epochs.
The teacher's locality weighs most while the ViT's attention forms, and pulls less towards a weaker
network's features once it has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foodvit.errors import ConfigError
from foodvit.model.vit import VisionTransformer
from foodvit.settings.objectives import OBJECTIVE_SETTINGS
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Computing, Objective, Outputs, vit_of
from foodvit.training.teacher import STAGES, Teacher, stage_channels, teacher_skeleton

SPREAD = 3  # the first three stages guide blocks spread before the last; a fourth guides the last block


def guided_blocks(depth: int, stages: int = SPREAD) -> list[int]:
    """The ViT blocks (0-based) matched to the teacher's first `stages` stages, in order: the first
    three spread over the first depth - 1 blocks, the fourth (stages 4) the last block."""
    if depth < 2:
        raise ConfigError(
            "--guidance matches blocks before the last one to the teacher's stages: "
            f"needs --depth 2 or more, got {depth}"
        )
    if not SPREAD <= stages <= len(STAGES):
        raise ConfigError(f"--guidance-stages must be 3 or 4 (the teacher's first stages that guide), got {stages}")
    span = depth - 1
    return [max(0, round((k + 1) * span / SPREAD) - 1) for k in range(SPREAD)] + [depth - 1] * (stages - SPREAD)


def epoch_weight(weight: float, schedule: str, epoch: int, epochs: int) -> float:
    """The guidance weight of epoch `epoch` (from 0) of `epochs` under the schedule ('constant' or 'linear')."""
    if schedule == "constant":
        return weight
    if schedule == "linear":
        return weight * (1 - epoch / epochs)
    raise ConfigError(f"--guidance-schedule must be constant or linear, got {schedule!r}")


def matching_loss(adapted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the adapted student map against the standardised teacher map, on the
    coarser of their two grids: (B, C, g, g) and (B, C, h, w) -> a scalar (0 for an empty share of a batch)."""
    size = min(adapted.shape[-1], target.shape[-1])
    if adapted.shape[-1] > size:
        adapted = F.adaptive_avg_pool2d(adapted, size)
    if target.shape[-1] > size:
        target = F.adaptive_avg_pool2d(target, size)
    # each position over its channels
    target = F.layer_norm(target.permute(0, 2, 3, 1), target.shape[1:2]).permute(0, 3, 1, 2)
    return F.mse_loss(adapted.float(), target.float(), reduction="sum") / max(1, adapted.numel())


class LocalityGuidance(Objective):
    """A few blocks' patch tokens, through 1x1 adapters, predict the CNN teacher's feature maps of the
    matching stages (a torchvision ResNet's). checkpoint.pt keeps the adapters under "guidance"."""

    settings = OBJECTIVE_SETTINGS["guidance"]
    checkpoint_key = "guidance"

    def __init__(
        self,
        vit: VisionTransformer,
        weight: float,
        teacher_skeleton: nn.Module,
        stages: int = SPREAD,
        schedule: str = "constant",
        teacher: Teacher | None = None,
    ) -> None:
        super().__init__(weight)
        self.teacher = teacher  # given later when the run trains it (WithObjectives.set_teacher)
        epoch_weight(weight, schedule, 0, 1)  # an unknown schedule is refused here, before training
        self.schedule = schedule
        self.blocks = tuple(guided_blocks(vit.config.depth, stages))
        self.teacher_stages = stages
        if stages > SPREAD and vit.config.class_only_last_block:
            raise ConfigError(
                f"--guidance-stages {stages} guides the last block's patch tokens, which a class-token model's last "
                "block does not compute: use --pool gap or --pool seq, or leave --guidance-stages out"
            )
        D = vit.config.embed_dim
        self.adapters = nn.ModuleList(
            nn.Conv2d(D, channels, kernel_size=1) for channels in stage_channels(teacher_skeleton, stages)
        )

    @classmethod
    def build(cls, model: Computing, config: RunConfig, num_classes: int) -> LocalityGuidance:
        return cls(
            vit_of(model),
            config.guidance.weight,
            teacher_skeleton(config.teacher.architecture, num_classes),
            config.guidance.stages,
            config.guidance.schedule,
        )

    @property
    def part(self) -> nn.Module:
        return self.adapters

    def weight_at(self, epoch: int, epochs: int) -> float:
        return epoch_weight(self.weight, self.schedule, epoch, epochs)

    def loss(self, batch: Batch, outputs: Outputs) -> torch.Tensor:
        targets = self.the_teacher().feature_maps(batch.images, self.teacher_stages)  # the batch as loaded
        losses = [
            matching_loss(adapter(outputs.blocks[block]), target)  # each block's patch tokens on their grid
            for adapter, block, target in zip(self.adapters, self.blocks, targets, strict=True)
        ]
        return torch.stack(losses).mean()
