"""Progressive resizing, training's side of it (training/resizing.py): any grid's batch through the ViT with
that grid's positions, built once per grid and device."""

import pytest
import torch

from foodvit.model.vit import VisionTransformer
from foodvit.settings.model import ViTConfig
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.drloc import Localization
from foodvit.training.resizing import AnyGrid


def sincos_vit(**changes) -> VisionTransformer:
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_classes=3,
        embed_dim=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        pool="gap",
        pos_embed="sincos2d",
        **changes,
    )
    return VisionTransformer(config)


def test_a_smaller_batch_gets_its_grids_positions_and_the_models_own_size_the_models_path():
    vit = sincos_vit().eval()
    torch.nn.init.normal_(vit.head.weight)  # a zero head would give the same zeros at every size
    resized = AnyGrid(vit)
    images = torch.randn(2, 3, 32, 32)
    small = images[..., :16, :16]
    torch.testing.assert_close(resized(small), vit(small, pos_embed=vit.pos_embed_for_grid(2)), rtol=0, atol=0)
    torch.testing.assert_close(resized(images), vit(images), rtol=0, atol=0)
    assert resized.pos_embed_for(images) is None  # the model's own grid: its own E_pos
    heads = resized.forward_head(resized.forward_features(small), heads=True)
    torch.testing.assert_close(heads.logits, resized(small), rtol=1e-6, atol=1e-6)
    final, blocks = resized.forward_intermediates(small, [0])
    assert final.shape == (2, 1 + 4, 32) and blocks[0].shape == (2, 32, 2, 2)  # the batch's own 2 x 2 grid
    assert resized.config is vit.config and {id(p) for p in resized.parameters()} == {id(p) for p in vit.parameters()}


def test_each_grid_is_built_once_per_device():
    vit = sincos_vit()
    resized = AnyGrid(vit)
    first = resized.pos_embed_for(torch.randn(1, 3, 16, 16))
    assert resized.pos_embed_for(torch.randn(4, 3, 16, 16)) is first  # the same tensor, not rebuilt at every step
    assert resized.pos_embed_for(torch.randn(1, 3, 24, 24)).shape == (1, 1 + 9, 32)  # another grid: its own
    vit.double()  # a model moved (here: to another dtype) gets its grid built again where it now is
    assert resized.pos_embed_for(torch.randn(1, 3, 16, 16)).dtype == torch.float64


def test_the_localization_loss_trains_through_it_at_a_smaller_size():
    vit = sincos_vit()
    wrapped = WithObjectives(AnyGrid(vit), [Localization(vit.config.embed_dim, 0.5, pairs=4)]).train()
    logits, extra = wrapped(torch.randn(2, 3, 16, 16))  # a 2 x 2 grid of patch tokens
    assert logits.shape == (2, 3) and extra.ndim == 0
    extra.backward()
    assert vit.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_a_learned_position_embedding_has_one_grid():
    from foodvit.errors import ConfigError

    resized = AnyGrid(VisionTransformer(sincos_vit().config.replace(pos_embed="learned")))
    with pytest.raises(ConfigError, match="needs fixed position embeddings"):
        resized(torch.randn(1, 3, 16, 16))
