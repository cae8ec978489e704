"""Training the heads only (--freeze-backbone, a feature extractor): which parameters take gradients,
and a backbone kept in eval mode while the heads train. Training's business, not the model's: the
model saved from such a run is the plain ViT, with nothing frozen in it.
"""

from __future__ import annotations

from torch import nn
from torch.utils.hooks import RemovableHandle

from foodvit.model.vit import HEADS, VisionTransformer


def freeze_backbone(model: VisionTransformer) -> RemovableHandle:
    """Train the heads only. Every other parameter stops taking gradients, so the optimiser holds
    no state for them and backward stops at the heads; and every forward pass puts the backbone in
    eval mode first, whatever model.train() set, so dropout, stochastic depth and the conv stem's
    BatchNorm compute the same features every time (the heads keep the model's mode). The rule lives
    in a forward pre-hook: it holds for model(images), the call training makes. Returns the hook's
    handle; its remove() ends the eval-mode rule (the gradients stay off)."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(HEADS))
    return model.register_forward_pre_hook(_backbone_in_eval)


def backbone_modules(model: VisionTransformer) -> list[nn.Module]:
    """The model's top-level modules other than the classifier heads (HEADS names them)."""
    return [child for name, child in model.named_children() if not f"{name}.".startswith(HEADS)]


def _backbone_in_eval(model: VisionTransformer, _inputs) -> None:
    for child in backbone_modules(model):
        child.eval()
