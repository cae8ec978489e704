"""Equality with the reference implementations, and the weight formats."""

import pytest
import timm
import torch
import torchvision
from helpers import randomize_, rel_diff
from torchvision.models.vision_transformer import interpolate_embeddings

import foodvit
from foodvit.model.positions import resample_pos_embed
from foodvit.model.weights import (
    config_from_metadata,
    detect_layout,
    export_weights,
    from_torchvision,
    load_weights,
    read_weights,
    save_weights,
    to_torch_encoder,
)

TOL = 1e-4  # max relative difference, fp32, eval mode


def _same_outputs(ours, theirs, image_size, batch=2, seed=0):
    x = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        a, b = ours.eval()(x), theirs.eval()(x)
    assert a.shape == b.shape
    assert rel_diff(a, b) <= TOL, rel_diff(a, b)
    assert b.std() > 0  # the comparison is not between constant outputs


def _torchvision_vit(name, depth=None, **kwargs):
    """torchvision's model `name`; with a depth, its architecture (patch size, width, heads, MLP, all
    read from torchvision's own builder) cut to that many blocks: every block is the same code, so
    two show the parity of twelve at a sixth of the cost."""
    build = getattr(torchvision.models, name)
    if depth is None:
        return build(**kwargs)
    with torch.device("meta"):  # the reference's settings, without building its weights
        full = build(**kwargs)
    return torchvision.models.VisionTransformer(
        num_layers=depth,
        patch_size=full.patch_size,
        hidden_dim=full.hidden_dim,
        mlp_dim=full.mlp_dim,
        num_heads=full.encoder.layers[0].num_heads,
        **kwargs,
    )


@pytest.mark.parametrize(
    "tv_name,ours_name,image_size,depth",
    [
        pytest.param("vit_b_16", "ViT-B/16", 224, None, marks=pytest.mark.slow),  # the one full-size ViT-B/16 parity
        ("vit_b_32", "ViT-B/32", 224, 2),
        ("vit_b_32", "ViT-B/32", 384, 2),
    ],
)
def test_equal_to_torchvision(tv_name, ours_name, image_size, depth):
    torch.manual_seed(0)
    theirs = randomize_(_torchvision_vit(tv_name, depth, image_size=image_size, num_classes=7))
    ours = foodvit.create_model(ours_name, num_classes=7, image_size=image_size, **({"depth": depth} if depth else {}))
    ours = foodvit.load_weights(ours, theirs.state_dict())
    # full size, one photo: each photo goes through the same layers alone (a forward pass is a second a photo here)
    _same_outputs(ours, theirs, image_size, batch=2 if depth else 1)


@pytest.mark.parametrize(
    "timm_name,ours_name,image_size,depth",
    [  # two blocks show what twelve do (see _torchvision_vit)
        ("vit_base_patch16_224", "ViT-B/16", 224, 2),
        ("vit_small_patch16_224", "ViT-S/16", 224, 2),
        ("vit_tiny_patch16_224", "ViT-Ti/16", 224, None),
        ("vit_small_patch16_224", "ViT-S/16", 288, 2),
    ],
)
def test_equal_to_timm(timm_name, ours_name, image_size, depth):
    torch.manual_seed(0)
    cut = {"depth": depth} if depth else {}
    theirs = randomize_(timm.create_model(timm_name, pretrained=False, num_classes=5, img_size=image_size, **cut))
    ours = foodvit.load_weights(
        foodvit.create_model(ours_name, num_classes=5, image_size=image_size, **cut), theirs.state_dict()
    )
    _same_outputs(ours, theirs, image_size)


def test_export_round_trip_gives_back_identical_tensors():
    tv = randomize_(_torchvision_vit("vit_b_32", 2, image_size=224, num_classes=3)).state_dict()
    ours = foodvit.load_weights(foodvit.create_model("ViT-B/32", num_classes=3, depth=2), tv)
    back = export_weights(ours, "torchvision")
    assert back.keys() == tv.keys()
    assert all(torch.equal(back[k], tv[k]) for k in tv)

    tm = randomize_(timm.create_model("vit_tiny_patch16_224", num_classes=3)).state_dict()
    ours = foodvit.load_weights(foodvit.create_model("ViT-Ti/16", num_classes=3), tm)
    back = export_weights(ours, "timm")
    assert back.keys() == tm.keys()
    assert all(torch.equal(back[k], tm[k]) for k in tm)
    # and the exported dicts load straight into the references
    timm.create_model("vit_tiny_patch16_224", num_classes=3).load_state_dict(back, strict=True)


def test_layouts_are_detected():
    ours = foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=2)
    assert detect_layout(export_weights(ours, "torchvision")) == "torchvision"
    assert detect_layout(export_weights(ours, "timm")) == "timm"
    conv = foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=2, stem="conv")
    assert detect_layout(conv.state_dict()) == "foodvit"
    with pytest.raises(ValueError, match="cannot tell the layout"):
        detect_layout({"fc.weight": torch.zeros(1)})


@pytest.mark.parametrize("suffix", [".pth", ".pt", ".bin", ".safetensors"])
def test_load_from_files_of_each_format(tmp_path, suffix):
    from safetensors.torch import save_file

    source = randomize_(_torchvision_vit("vit_b_32", 2, image_size=64, num_classes=3))
    path = tmp_path / f"weights{suffix}"
    state = source.state_dict()
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:  # training checkpoints often nest the weights and carry DDP prefixes
        torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    ours = foodvit.load_weights(foodvit.create_model("ViT-B/32", image_size=64, num_classes=3, depth=2), path)
    _same_outputs(ours, source, 64)


def test_foodvit_files_carry_their_config(tmp_path):
    model = foodvit.create_model("ViT-Ti/8", image_size=32, num_classes=4, pool="gap")
    path = save_weights(model, tmp_path / "model.safetensors", {"class_names": ["a", "b", "c", "d"]})
    state, meta = read_weights(path)
    assert meta["format"] == "foodvit"
    assert config_from_metadata(meta) == model.config
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_pickled_code_is_never_run(tmp_path):
    class Payload:
        def __reduce__(self):
            return (exec, ("import pathlib; pathlib.Path('pwned').touch()",))

    path = tmp_path / "evil.pth"
    torch.save({"model": Payload()}, path)
    with pytest.raises(ValueError, match="weights_only=True"):
        read_weights(path)


def test_shape_mismatch_names_the_keys_and_both_shapes():
    small = foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=3)
    other = foodvit.create_model("ViT-S/16", image_size=32, num_classes=3)
    with pytest.raises(
        ValueError,
        match=r"(?s)shapes differ: .*patch_embed\.proj\.weight: file \(384, 3, 16, 16\), model \(192, 3, 16, 16\)",
    ):
        foodvit.load_weights(small, other.state_dict())
    wrong_head = foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=10)
    with pytest.raises(ValueError, match=r"(?s)head\.weight: file \(10, 192\), model \(3, 192\).*skip_head=True"):
        foodvit.load_weights(small, wrong_head.state_dict())
    foodvit.load_weights(small, wrong_head.state_dict(), skip_head=True)  # transfer learning path
    with pytest.raises(ValueError, match=r"missing from the weights: blocks\.11\."):
        foodvit.load_weights(
            small,
            {k: v for k, v in other.state_dict().items() if not k.startswith("blocks.11.")}
            | {k: v for k, v in small.state_dict().items() if not k.startswith("blocks.11.")},
        )


def test_resampling_matches_timm_and_torchvision():
    from timm.layers import resample_abs_pos_embed

    pe = torch.randn(1, 197, 64)
    ours = resample_pos_embed(pe, 24)
    theirs = resample_abs_pos_embed(pe, (24, 24), num_prefix_tokens=1, interpolation="bicubic", antialias=False)
    torch.testing.assert_close(ours, theirs)
    assert torch.equal(ours[:, 0], pe[:, 0])  # the class position is kept as is

    state = {"encoder.pos_embedding": pe}
    tv = interpolate_embeddings(384, 16, state)["encoder.pos_embedding"]
    torch.testing.assert_close(resample_pos_embed(pe, 24, align_corners=True), tv)


def test_model_at_224_accepts_weights_trained_at_384_and_back():
    source = randomize_(foodvit.create_model("ViT-Ti/16", image_size=384, num_classes=3))
    model = foodvit.load_weights(foodvit.create_model("ViT-Ti/16", num_classes=3), source.state_dict())
    assert model.pos_embed.shape == (1, 197, 192)
    torch.testing.assert_close(model.pos_embed, resample_pos_embed(source.pos_embed.detach(), 14))
    bigger = foodvit.resize_model(model, 384)
    assert bigger.pos_embed.shape == (1, 577, 192) and bigger.config.image_size == 384
    assert torch.equal(bigger.blocks[3].mlp.fc1.weight, model.blocks[3].mlp.fc1.weight)
    assert bigger(torch.randn(1, 3, 384, 384)).shape == (1, 3)


def test_weights_without_the_mlp_convolution_load_with_it_at_zero_and_it_exports_only_where_it_fits():
    """Deviation 12 starts at zero: a plain ViT's weights (a pre-trained one) load into a model with it and give
    that ViT's logits; timm's layout, which has no such filter, refuses it in one line; its own keys say foodvit."""
    torch.manual_seed(0)
    plain = randomize_(foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=2)).eval()
    local = foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=2, mlp_conv=True).eval()
    with torch.no_grad():
        local.blocks[0].mlp.conv.weight.fill_(1.0)  # a filter that was not at zero is set there
    load_weights(local, export_weights(plain, "timm"))
    assert all(torch.all(block.mlp.conv.weight == 0) for block in local.blocks)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(local(x), plain(x))
    incomplete = {k: v for k, v in plain.state_dict().items() if k != "blocks.0.mlp.fc1.weight"}
    with pytest.raises(
        ValueError, match=r"missing from the weights: blocks\.0\.mlp\.fc1\.weight\n"
    ):  # only the filters may be missing
        load_weights(local, incomplete)
    with pytest.raises(
        ValueError, match="not in the model: blocks.0.mlp.conv"
    ):  # and a plain ViT has no place for them
        load_weights(foodvit.create_model("ViT-Ti/16", image_size=32, num_classes=2), local.state_dict())
    assert detect_layout(local.state_dict()) == "foodvit"
    with pytest.raises(ValueError, match="no convolution in its MLP"):
        export_weights(local, "timm")
    with pytest.raises(ValueError, match="torchvision's VisionTransformer has no convolution in its MLP"):
        export_weights(local, "torchvision")
    with pytest.raises(ValueError, match="--mlp-conv"):
        to_torch_encoder(local)


def test_torch_transformer_encoder_layer_stack_agrees():
    torch.manual_seed(0)
    model = randomize_(foodvit.create_model("ViT-S/16", num_classes=3, image_size=96, depth=3)).eval()
    stack = to_torch_encoder(model).eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        tokens = model._embed(x)  # Eq. 1, then the blocks by hand
        ours = tokens
        for block in model.blocks:
            ours, _ = block(ours)
        theirs = stack(tokens)
    assert rel_diff(theirs, ours) <= TOL


def test_from_torchvision_accepts_old_mlp_names():
    tv = _torchvision_vit("vit_b_32", 2, image_size=64, num_classes=2).state_dict()
    old = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in tv.items()}
    assert from_torchvision(old).keys() == from_torchvision(tv).keys()
