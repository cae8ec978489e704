"""--freeze-backbone, training's side of it (training/freezing.py): only the heads learn, the backbone computes
the same features in training mode, and the model itself keeps no trace of it."""

import torch

from foodvit.model.vit import VisionTransformer
from foodvit.settings.model import ViTConfig
from foodvit.training.freezing import backbone_modules, freeze_backbone


def noisy_model(**changes) -> VisionTransformer:
    """Every source of training-mode randomness the backbone has: dropout, stochastic depth, BatchNorm."""
    torch.manual_seed(0)
    return VisionTransformer(
        ViTConfig(
            image_size=32,
            patch_size=8,
            embed_dim=32,
            depth=2,
            num_heads=2,
            mlp_dim=64,
            num_classes=3,
            dropout=0.5,
            attn_dropout=0.5,
            drop_path=0.5,
            stem="conv",
            **changes,
        )
    )


def test_frozen_backbone_computes_the_same_features_in_training_mode():
    model = noisy_model()
    freeze_backbone(model)
    model.train()  # what the training loop does every epoch
    bn = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    running = [m.running_mean.clone() for m in bn]
    x = torch.randn(4, 3, 32, 32)
    a, b = model(x), model(x)
    assert bn and not any(m.training for m in bn)
    assert not any(
        m.training for child in backbone_modules(model) for m in child.modules()
    )  # blocks, stem, norm, dropout
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # no dropout, no dropped paths, BatchNorm in eval
    assert all(torch.equal(r, m.running_mean) for r, m in zip(running, bn, strict=True))  # statistics untouched
    assert model.training and model.head.training  # the head still trains
    torch.testing.assert_close(model.eval()(x), a, rtol=0, atol=0)


def test_only_the_heads_take_gradients_and_optimiser_state():
    model = noisy_model(distill_token=True)
    freeze_backbone(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
    model.train()(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(
        p.grad is None for name, p in model.named_parameters() if name not in trainable
    )  # backward stopped at the heads
    assert model.head.weight.grad.abs().sum() > 0 and model.head_dist.weight.grad.abs().sum() > 0
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    optimizer.step()
    assert {id(p) for p in optimizer.state} == {id(p) for name, p in model.named_parameters() if name in trainable}


def test_the_model_keeps_no_frozen_state_once_the_hook_is_removed():
    model = noisy_model()
    freeze_backbone(model).remove()
    model.train()
    model(torch.randn(2, 3, 32, 32))
    assert all(
        m.training for m in model.modules()
    )  # the model's own train() again: the rule was training's, not the model's
    assert not hasattr(model, "backbone_frozen")
