"""The model against the paper: shapes, parameter counts, init, options and clear errors."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

import foodvit
from foodvit.errors import ConfigError, InputError
from foodvit.model.positions import sincos_2d_pos_embed
from foodvit.model.variants import count_params, get_variant
from foodvit.model.vit import VisionTransformer
from foodvit.settings.model import ViTConfig


def tiny(**overrides) -> VisionTransformer:
    config = dict(image_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_dim=96, num_classes=5)
    config.update(overrides)
    return VisionTransformer(ViTConfig(**config))


# Published parameter counts (1000 classes, 224 px; torchvision and timm agree).
PUBLISHED = {
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-L/16": 304_326_632,
    "ViT-L/32": 306_535_400,
    "ViT-H/14": 632_045_800,
}


@pytest.mark.parametrize("name,expected", PUBLISHED.items())
def test_parameter_counts_match_published(name, expected):
    with torch.device("meta"):
        model = foodvit.create_model(name)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert get_variant(name).num_params == expected  # the registry's closed form agrees


def test_vit_b16_with_three_classes_has_85_800_963_parameters():
    with torch.device("meta"):
        model = foodvit.create_model("ViT-B/16", num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == 85_800_963
    # The REFERENCE breakdown, piece by piece.
    assert model.patch_embed.proj.weight.numel() + model.patch_embed.proj.bias.numel() == 590_592
    assert model.cls_token.numel() == 768 and model.pos_embed.numel() == 151_296
    assert sum(p.numel() for p in model.blocks[0].parameters()) == 7_087_872
    assert sum(p.numel() for p in model.head.parameters()) == 2_307


@pytest.mark.parametrize("name", foodvit.list_models())
def test_every_listed_variant_builds_with_expected_shapes(name):
    v = get_variant(name)
    size = 224 if 224 % v.patch_size == 0 else v.patch_size * 16
    with torch.device("meta"):
        model = foodvit.create_model(name, num_classes=3, image_size=size)
        out = model(torch.empty(2, 3, size, size))
    assert out.shape == (2, 3)
    assert sum(p.numel() for p in model.parameters()) == count_params(model.config)
    assert model.pos_embed.shape == (1, (size // v.patch_size) ** 2 + 1, v.size.embed_dim)


def test_shapes_at_every_step_of_vit_b16():
    with torch.device("meta"):  # shapes only: no 86 M weights to draw, no arithmetic
        model = foodvit.create_model("ViT-B/16", num_classes=3).eval()
        images = torch.empty(1, 3, 224, 224)
    with torch.no_grad():
        patches = model.patch_embed(images)
        tokens = model._embed(images)  # Eq. 1 alone (a private step of forward_features)
        features = model.forward_features(images)
        logits = model(images)
    assert patches.shape == (1, 196, 768)  # Eq. 1, x_p E
    assert tokens.shape == (1, 197, 768)  # Eq. 1, with x_class
    assert features.shape == (1, 197, 768)  # Eq. 2-3 and the LN of Eq. 4
    assert logits.shape == (1, 3)  # Eq. 4 head


def test_names_are_parsed_in_several_spellings():
    for name in ("ViT-B/16", "vit_b_16", "ViT-Base/16", "vit-b-16"):
        assert get_variant(name).name == "ViT-B/16"
    assert get_variant("ViT-Ti/8").size.embed_dim == 192


# ----------------------------------------------------------------------------- initialisation


def test_init_follows_the_jax_reference():
    torch.manual_seed(0)
    model = foodvit.create_model("ViT-S/16", num_classes=10, depth=1)  # block 0 is checked; the others draw alike
    D = model.config.embed_dim
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    assert torch.count_nonzero(model.cls_token) == 0
    assert model.pos_embed.std().item() == pytest.approx(0.02, rel=0.05)
    fan_in = 3 * 16 * 16
    w = model.patch_embed.proj.weight
    assert w.std().item() == pytest.approx(math.sqrt(1 / fan_in), rel=0.05)  # lecun_normal
    assert w.abs().max().item() <= 2 * math.sqrt(1 / fan_in) / 0.87962566103423978 + 1e-6  # truncated at 2 std
    bound = math.sqrt(6 / (D + D))  # xavier with fan_in = fan_out = D for each of q, k, v
    for chunk in model.blocks[0].attn.qkv.weight.chunk(3):
        assert chunk.abs().max().item() <= bound
        assert chunk.abs().max().item() > 0.95 * bound
        assert chunk.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert torch.count_nonzero(model.blocks[0].attn.qkv.bias) == 0
    fc1 = model.blocks[0].mlp.fc1
    assert fc1.weight.abs().max().item() <= math.sqrt(6 / (D + 4 * D))
    assert 0 < fc1.bias.std().item() < 1e-5


# ----------------------------------------------------------------------------- attention paths


def test_fused_and_plain_attention_agree():
    torch.manual_seed(0)
    model = foodvit.create_model("ViT-Ti/16", num_classes=4, image_size=64).eval()
    from helpers import randomize_

    randomize_(model)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        fused = model.set_fused_attention(True)(x)
        plain = model.set_fused_attention(False)(x)
        tokens, attentions = model.forward_intermediates(x, attention=True)
        logits = model.forward_head(tokens)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, fused, rtol=1e-5, atol=1e-5)  # extraction leaves outputs unchanged
    assert len(attentions) == 12 and attentions[0].shape == (3, 3, 17, 17)  # (B, h, T, T)
    torch.testing.assert_close(attentions[5].sum(-1), torch.ones(3, 3, 17))


def test_attention_dropout_applies_in_training_only():
    model = tiny(attn_dropout=0.5)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
    model.train()
    torch.manual_seed(1)
    a = model.forward_features(x)
    torch.manual_seed(2)
    b = model.forward_features(x)
    assert not torch.allclose(a, b)


# ----------------------------------------------------------------------------- options (deviations)


def test_gap_pooling_averages_patch_tokens():
    model = tiny(pool="gap").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = model.forward_features(x)
        assert torch.allclose(model.forward_head(features, pre_logits=True), features[:, 1:].mean(1))


def test_no_class_token_model_has_n_tokens():
    model = tiny(class_token=False, pool="gap")
    assert not hasattr(model, "cls_token")
    assert model.pos_embed.shape == (1, 16, 48)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_sincos_position_embedding_is_fixed_and_distinct_per_position():
    model = tiny(pos_embed="sincos2d")
    assert "pos_embed" not in dict(model.named_parameters()) and "pos_embed" not in model.state_dict()
    pe = sincos_2d_pos_embed(4, 48)
    assert pe.shape == (16, 48)
    assert torch.all(pe.abs() <= 1)
    assert torch.allclose(model.pos_embed[0, 1:], pe) and torch.count_nonzero(model.pos_embed[0, 0]) == 0
    # sin^2 + cos^2 = 1 for each frequency: each position's vector has squared norm D / 2.
    assert torch.allclose((pe**2).sum(1), torch.full((16,), 24.0))
    assert torch.cdist(pe, pe).add(torch.eye(16)).min() > 0.1  # every position differs
    with_prefix = sincos_2d_pos_embed(4, 48, prefix=2)  # class and distillation tokens first, at position zero
    assert (
        with_prefix.shape == (18, 48) and torch.count_nonzero(with_prefix[:2]) == 0 and torch.equal(with_prefix[2:], pe)
    )


def test_no_position_embedding_option():
    model = tiny(pos_embed="none")
    assert not hasattr(model, "pos_embed")
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_stochastic_depth_is_identity_in_eval_and_drops_whole_samples_in_training():
    from foodvit.model.blocks import DropPath

    dp = DropPath(0.5)
    x = torch.ones(1000, 4, 8)
    dp.eval()
    assert torch.equal(dp(x), x)
    dp.train()
    torch.manual_seed(0)
    y = dp(x)
    per_sample = y.flatten(1)
    assert set(per_sample.unique().tolist()) <= {0.0, 2.0}  # dropped, or kept and scaled by 1/(1-p)
    assert torch.all(per_sample.min(1).values == per_sample.max(1).values)  # a whole sample at once
    assert y.mean().item() == pytest.approx(1.0, abs=0.1)  # unbiased
    rates = [b.drop_path.p if hasattr(b.drop_path, "p") else 0.0 for b in tiny(drop_path=0.3, depth=4).blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])  # linear in depth


def test_conv_stem_keeps_the_token_grid():
    model = tiny(stem="conv")
    assert model.patch_embed.proj.kernel_size == (1, 1)
    assert model.patch_embed(torch.randn(2, 3, 32, 32)).shape == (2, 16, 48)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    assert count_params(model.config) == sum(p.numel() for p in model.parameters())


def test_the_closed_form_parameter_count_holds_with_the_distillation_token():
    """Deviation 9 adds a token and its head: the closed form counted neither (ViT-B/16 was 3,075 short)."""
    for overrides in ({"distill_token": True}, {"distill_token": True, "class_token": True, "pool": "gap"}):
        model = tiny(**overrides)
        assert count_params(model.config) == sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- errors


def test_image_size_not_divisible_by_patch_size_names_both():
    with pytest.raises(ValueError, match=r"image size 250 is not a multiple of the patch size 16; use 240 or 256"):
        foodvit.create_model("ViT-B/16", image_size=250)


def test_the_patch_grid_rule_names_the_nearest_sizes_on_the_grid():
    from foodvit.settings.model import check_on_patch_grid

    check_on_patch_grid("image size", 224, 16)  # on the grid: nothing to say
    with pytest.raises(ConfigError, match=r"^--start-size 20 is not a multiple of the patch size 8; use 16 or 24$"):
        check_on_patch_grid("--start-size", 20, 8)
    with pytest.raises(ConfigError, match=r"^image size 10 is not a multiple of the patch size 16; use 16$"):
        check_on_patch_grid("image size", 10, 16)  # below one patch: no size 0 to suggest


def test_wrong_input_size_and_channels_are_explained():
    model = tiny()
    with pytest.raises(ValueError, match=r"expected 32 x 32 images, got 64 x 64.*resize_model"):
        model(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match=r"expected 3 channels, got 1.*RGB"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"add a batch dimension"):
        model(torch.randn(3, 32, 32))
    # what a learner has in hand: PyTorch's own errors named a conv2d's arguments or a bias type
    with pytest.raises(ValueError, match=r"expected float images, got torch.uint8; .*images.float\(\) / 255"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"expected a torch tensor of images, got ndarray; .*torch.from_numpy"):
        model(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(ValueError, match=r"got Image; .*classify\(photo\)"):
        model(Image.new("RGB", (32, 32)))
    # image_size=0 built a 224 px model without a word
    with pytest.raises(ValueError, match=r"--image-size must be in \[1, 1024\], got 0"):
        foodvit.create_model("ViT-Ti/16", image_size=0)


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown model 'ViT-Z/16'.*Ti, S, B, L, H.*ViT-Ti/8"):
        foodvit.create_model("ViT-Z/16")


def test_embed_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"embed_dim 100 is not divisible by num_heads 3.*\(e\.g\. 1, 2, 4\)"):
        ViTConfig(embed_dim=100, num_heads=3)
    # a typo's 10^11 channels: every number up to it was tried (hours); a prime has two divisors
    with pytest.raises(ValueError, match=r"\(e\.g\. 1, 7, 13\)"):
        ViTConfig(embed_dim=100000000009, num_heads=2)
    with pytest.raises(ValueError, match=r"\(e\.g\. 1, 1000000007\)"):
        ViTConfig(embed_dim=1000000007, num_heads=2)


def test_cls_pooling_without_class_token_is_refused():
    with pytest.raises(ValueError, match="class_token=True or pool='gap'"):
        ViTConfig(class_token=False)
    with pytest.raises(ValueError, match="--pool must be one of cls, gap, seq, got 'max'"):
        ViTConfig(pool="max")


def test_mac_count_matches_the_reference_and_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    from foodvit.model.variants import count_macs

    assert count_macs(get_variant("ViT-B/16").config()) == pytest.approx(17.56e9, rel=1e-3)  # REFERENCE
    assert count_macs(get_variant("ViT-B/16").config(), executed=True) == pytest.approx(16.46e9, rel=1e-3)
    model = tiny().eval().set_fused_attention(False)
    x = torch.randn(1, 3, 32, 32)
    for forward, executed in (
        (lambda: model.head(model.forward_head(model.forward_features(x), pre_logits=True)), False),
        (lambda: model(x), True),
    ):
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            forward()
        assert counter.get_total_flops() == 2 * count_macs(
            model.config, executed=executed
        )  # matmuls and the patch conv, exactly
    assert count_macs(model.config, executed=True) < count_macs(model.config)


@pytest.mark.parametrize("options", [{}, {"locality": True}, {"drop_path": 0.2}, {"mlp_conv": True}])
def test_class_token_forward_computes_only_the_class_token_in_the_last_block(options):
    """forward() skips the last block's other tokens; z_L^0, logits and gradients stay those of the full model."""
    from helpers import randomize_

    model = tiny(depth=3, **options)
    randomize_(model)
    x = torch.randn(4, 3, 32, 32)

    def full():  # every token through every block, then Eq. 4
        return model.head(model.forward_head(model.forward_features(x), pre_logits=True))

    model.eval()
    with torch.no_grad():
        everything = model.forward_features(x)
        only_class = model.forward_features(x, class_only=True)
        assert everything.shape == (4, 17, 48) and only_class.shape == (4, 1, 48)
        torch.testing.assert_close(only_class[:, 0], everything[:, 0], rtol=1e-5, atol=1e-5)
        for fused in (True, False):
            model.set_fused_attention(fused)
            torch.testing.assert_close(model(x), full(), rtol=1e-5, atol=1e-5)
    model.train()  # training too: the same random draws give the same loss and the same gradients
    grads = []
    for forward in (full, lambda: model(x)):
        model.zero_grad()
        torch.manual_seed(3)
        forward().square().sum().backward()
        # (a parameter only the last block's other tokens use, mlp_conv's filter, gets no gradient in either: zero or
        # None)
        grads.append(
            {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        )
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(ValueError, match="class token"):
        tiny(pool="gap", class_token=False).forward_features(x, class_only=True)


def test_sequence_pooling_is_an_attention_weighted_mean():
    model = tiny(pool="seq", class_token=False).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = model.forward_features(x)
        weights = model.attn_pool(features).softmax(dim=1)  # (B, N, 1)
        assert torch.allclose(weights.sum(1), torch.ones(2, 1))
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), (weights * features).sum(1))
    assert model(x).shape == (2, 5)
    assert count_params(model.config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("mask", [True, False])
def test_locality_self_attention_learns_a_temperature_and_masks_the_diagonal_unless_told_not_to(mask):
    """Deviation 7: softmax(q k^T / tau) with tau learned from sqrt(d), the diagonal removed (LSA as
    published) or, with locality_mask=False, kept: a token may then attend to itself."""
    from helpers import randomize_

    model = tiny(locality=True, locality_mask=mask).eval()
    assert model.blocks[0].attn.temperature.item() == pytest.approx(16**0.5)  # starts at sqrt(d), d = 48 / 3
    randomize_(model)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.temperature.fill_(2.5)
        x = torch.randn(2, 3, 32, 32)
        attentions = model.forward_intermediates(x, attention=True, intermediates_only=True)
        fused = model.set_fused_attention(True)(x)
        plain = model.set_fused_attention(False)(x)
        tokens = model.blocks[0].norm1(model._embed(x))
        q, k, _ = attn.qkv(tokens).reshape(2, 17, 3, 3, 16).permute(2, 0, 3, 1, 4)
    diagonal = attentions[0].diagonal(dim1=-2, dim2=-1)
    assert torch.all(diagonal == 0) if mask else torch.all(diagonal > 0)  # no token attends to itself, or any may
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(2, 3, 17))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    # the same weights by hand: softmax(q k^T / tau), with the diagonal removed under the mask
    logits = q @ k.transpose(-2, -1) / 2.5
    if mask:
        logits = logits.masked_fill(torch.eye(17, dtype=torch.bool), float("-inf"))
    torch.testing.assert_close(attentions[0], logits.softmax(-1), rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in tiny(locality=True).parameters())


def test_mlp_conv_starts_as_the_paper_and_mixes_only_each_tokens_3x3_neighbourhood():
    """Deviation 12: h + GELU(DWConv3x3(h)) on the patch grid after the MLP's first layer and GELU. At step 0
    the convolution is zero (the model's outputs are the paper's MLP's); once learned, a patch token's output
    depends on its 8 neighbours and no farther token, the prefix tokens pass as in Eq. 3, and the values
    are the depthwise convolution's by hand, on any grid (progressive resizing's smaller first epochs)."""
    import torch.nn.functional as F
    from helpers import randomize_

    torch.manual_seed(0)
    plain = tiny(stem="conv", pool="seq", pos_embed="sincos2d", init="mimetic")
    torch.manual_seed(0)
    local = tiny(stem="conv", pool="seq", pos_embed="sincos2d", init="mimetic", mlp_conv=True)
    assert not local.load_state_dict(plain.state_dict(), strict=False).unexpected_keys
    assert all(torch.all(block.mlp.conv.weight == 0) for block in local.blocks)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(local.eval()(x), plain.eval()(x), rtol=0, atol=0)
    added = sum(p.numel() for p in local.parameters()) - sum(p.numel() for p in plain.parameters())
    assert added == 2 * (96 * 9 + 96)  # per block: one 3 x 3 filter and a bias per hidden feature
    assert count_params(local.config) == sum(p.numel() for p in local.parameters())

    mlp = randomize_(local.blocks[0].mlp).eval()
    for side in (4, 3):  # the model's grid, and a smaller one
        tokens = torch.randn(2, 1 + side * side, 48, requires_grad=True)  # the class token, then the patches
        out = mlp(tokens)
        h = mlp.act(mlp.fc1(tokens))
        grid = h[:, 1:].transpose(1, 2).reshape(2, 96, side, side)
        by_hand = h[:, 1:] + F.gelu(F.conv2d(grid, mlp.conv.weight, mlp.conv.bias, padding=1, groups=96)).flatten(
            2
        ).transpose(1, 2)
        torch.testing.assert_close(out[:, 1:], mlp.fc2(by_hand))
        torch.testing.assert_close(out[:, :1], mlp.fc2(h[:, :1]))  # the class token: Eq. 3's MLP
        out[0, 1 + 2].sum().backward()  # patch (row 0, column 2)'s output
        reached = tokens.grad[0].abs().sum(-1) > 0  # which input tokens it depends on
        expected = torch.zeros(side, side, dtype=torch.bool)
        expected[:2, 1:4] = True  # itself and its neighbours inside the grid, rows 0-1 and columns 1-3
        assert reached.tolist() == [False] + expected.flatten().tolist()
    # the grid is the tokeniser's: the tokens laid out as the patch embedding's (B, D, H/P, W/P) map
    embedded = local.patch_embed.proj(local.patch_embed.stem(x))
    tokens = local.patch_embed(x)
    torch.testing.assert_close(tokens.transpose(1, 2).reshape(embedded.shape), embedded)


def test_locality_mask_off_without_locality_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="add --locality"):
        tiny(locality_mask=False)


def test_sincos_position_embedding_follows_moco_v3():
    # written out element by element, independently of the implementation: rows first, then columns,
    # omega_k = 1 / 10000^(k / (D/4)) (MoCo v3), not big_vision's columns-first k / (D/4 - 1)
    grid, D = 3, 8
    pe = sincos_2d_pos_embed(grid, D)
    q = D // 4
    for r in range(grid):
        for c in range(grid):
            for k in range(q):
                omega = 1.0 / 10000 ** (k / q)
                expected = [math.sin(r * omega), math.cos(r * omega), math.sin(c * omega), math.cos(c * omega)]
                got = [pe[r * grid + c, j * q + k].item() for j in range(4)]
                assert got == pytest.approx(expected, abs=1e-6)


def test_mimetic_init_gives_identity_like_attention_products():
    """Deviation 8: W_q,h W_k,h^T is the best rank-d approximation of a Z + b I (so its diagonal is
    positive and dominates), W_v W_o equals a Z - b I exactly; the rest is the JAX init."""
    from foodvit.model.init import MIMETIC_QK, MIMETIC_VO

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_classes=3,
        embed_dim=48,
        depth=2,
        num_heads=3,
        mlp_dim=96,
        pool="gap",
        pos_embed="sincos2d",
        init="mimetic",
    )
    torch.manual_seed(0)
    model = VisionTransformer(config)
    D, d = 48, 16
    for block in model.blocks:
        w = block.attn.qkv.weight.detach()
        vo = w[2 * D :].T @ block.attn.proj.weight.detach().T  # W_v W_o in the paper's (x @ W) notation
        off = vo - torch.diag(vo.diagonal())
        assert vo.diagonal().mean().item() == pytest.approx(-MIMETIC_VO[1], abs=0.05)
        assert off.std().item() == pytest.approx(MIMETIC_VO[0] / math.sqrt(D), rel=0.2)  # a Z with N(0, 1/D) entries
        for h in range(3):
            q, k = w[h * d : (h + 1) * d], w[D + h * d : D + (h + 1) * d]
            qk = q.T @ k  # (D, D), rank d
            assert torch.linalg.matrix_rank(qk).item() == d
            assert qk.diagonal().mean() > 3 * (qk - torch.diag(qk.diagonal())).abs().mean()
            assert qk.diagonal().mean() > 0.25 * MIMETIC_QK[1]
        assert torch.all(block.attn.qkv.bias == 0) and torch.all(block.attn.proj.bias == 0)
        assert block.mlp.fc1.weight.abs().max() <= math.sqrt(6 / (D + 96))  # the MLP keeps the JAX init
    # the JAX init has no such structure
    plain = VisionTransformer(config.replace(init="jax")).blocks[0].attn
    w = plain.qkv.weight.detach()
    qk = w[:d].T @ w[D : D + d]
    assert abs(qk.diagonal().mean()) < (qk - torch.diag(qk.diagonal())).abs().mean()


def test_mimetic_init_makes_tokens_attend_to_themselves_at_step_zero():
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_classes=3,
        embed_dim=48,
        depth=2,
        num_heads=3,
        mlp_dim=96,
        pool="gap",
        pos_embed="sincos2d",
    )
    images = torch.randn(2, 3, 32, 32)
    self_weight = {}
    for init in ("jax", "mimetic"):
        torch.manual_seed(0)
        model = VisionTransformer(config.replace(init=init)).eval()
        with torch.no_grad():
            attentions = model.forward_intermediates(images, attention=True, intermediates_only=True)
        self_weight[init] = attentions[0].diagonal(dim1=-2, dim2=-1).mean().item()
    tokens = config.num_tokens
    assert self_weight["jax"] == pytest.approx(1 / tokens, rel=0.5)  # near uniform
    assert self_weight["mimetic"] > 5 / tokens


def test_a_sincos_model_takes_a_smaller_input_with_that_grids_positions():
    """Progressive resizing's model side: given the sin-cos embedding of a 2 x 2 grid (pos_embed_for_grid),
    a 32 px model (grid 4) embeds 16 px images with it; without it, the model's own size alone, and
    nothing in the model changes: 32 px images give what they gave before."""
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
    )
    model = VisionTransformer(config).eval()
    images = torch.randn(2, 3, 32, 32)
    before = model(images)
    small = images[..., :16, :16]
    with pytest.raises(InputError, match="expected 32 x 32 images, got 16 x 16"):
        model(small)
    pos_embed = model.pos_embed_for_grid(2)
    tokens = torch.cat([model.cls_token.expand(2, -1, -1), model.patch_embed(small)], dim=1)  # (2, 1 + 4, 32)
    expected = tokens + torch.cat([torch.zeros(1, 32), sincos_2d_pos_embed(2, 32)])[None]
    torch.testing.assert_close(model._embed(small, pos_embed), expected)
    assert model(small, pos_embed=pos_embed).shape == (2, 3) and model.config.image_size == 32
    with pytest.raises(InputError, match="expected 16 x 16 images, got 32 x 32"):
        model(images, pos_embed=pos_embed)  # the images must fit the grid they are given positions for
    torch.testing.assert_close(model(images), before, rtol=0, atol=0)
    assert "_other_grid_pos_embed" not in model.__dict__ and not hasattr(
        model, "set_input_size"
    )  # no state in the model
    learned = VisionTransformer(config.replace(pos_embed="learned"))
    with pytest.raises(ConfigError, match="fixed position embeddings"):
        learned.pos_embed_for_grid(2)
    unplaced = VisionTransformer(
        config.replace(pos_embed="none")
    ).eval()  # no position embedding: any grid adds nothing
    torch.testing.assert_close(unplaced.pos_embed_for_grid(2), torch.zeros(1, 5, 32), rtol=0, atol=0)


def test_the_heads_are_named_and_without_the_token_the_prediction_is_eq4s_head():
    from foodvit.model.vit import Heads

    model = tiny(num_classes=3).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would give zeros whatever it read
    images = torch.randn(2, 3, model.config.image_size, model.config.image_size)
    tokens = model.forward_features(images)
    heads = model.forward_head(tokens, heads=True)
    assert type(heads) is Heads and heads.distilled is None
    torch.testing.assert_close(heads.pooled, tokens[:, 0], rtol=0, atol=0)  # Eq. 4's z_L^0
    torch.testing.assert_close(heads.logits, model.head(tokens[:, 0]))  # Eq. 4 on the class token
    torch.testing.assert_close(heads.prediction(), heads.logits, rtol=0, atol=0)
    torch.testing.assert_close(model.forward_head(tokens), heads.logits, rtol=0, atol=0)
    torch.testing.assert_close(heads.logits, model(images), rtol=1e-5, atol=1e-5)


def test_shifted_patch_tokenisation_stacks_the_image_and_its_four_diagonal_half_patch_shifts():
    """Deviation 10 (SPT): each token reads its own P x P patch and the same window of the four
    diagonally shifted copies, layer-normalised, then E."""
    from foodvit.model.stems import ShiftedPatches

    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    moved = ShiftedPatches.shift(images, 2, -2)  # 2 rows down, 2 columns left, zeros shifted in
    assert torch.equal(moved[..., 2:, :6], images[..., :6, 2:])
    assert torch.all(moved[..., :2, :] == 0) and torch.all(moved[..., :, 6:] == 0)
    spt = ShiftedPatches(3, 4).eval()
    tokens = spt(images)
    assert tokens.shape == (2, 4, 5 * 3 * 16)  # (B, N, 5 C P^2)
    x = torch.cat(
        [images] + [ShiftedPatches.shift(images, r, c) for r, c in ((-2, -2), (-2, 2), (2, -2), (2, 2))], dim=1
    )
    patch = x[1, :, 4:8, 0:4].reshape(-1)  # second image, token (row 1, column 0): channels first, then rows, columns
    expected = (patch - patch.mean()) / torch.sqrt(patch.var(unbiased=False) + 1e-6)
    torch.testing.assert_close(tokens[1, 2], expected)
    model = tiny(stem="spt")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    assert count_params(model.config) == sum(p.numel() for p in model.parameters())
    assert model.patch_embed.proj.in_features == 5 * 3 * 8 * 8
    stem = sum(p.numel() for p in model.patch_embed.parameters())
    assert (
        stem == 5 * 3 * 8 * 8 * model.config.embed_dim + model.config.embed_dim + 2 * 5 * 3 * 8 * 8
    )  # E (and bias), the LayerNorm


def test_impulse_init_makes_each_head_attend_to_its_own_neighbour_at_step_zero():
    """Deviation 11: on the positions alone (the layer-normalised sin-cos embedding), each head's
    attention peaks for every patch on the one neighbour at that head's 3 x 3 offset, the edge clamped."""
    from foodvit.model.init import impulse_init_, impulse_offsets

    config = ViTConfig(
        image_size=64,
        patch_size=8,
        num_classes=3,
        embed_dim=192,
        depth=1,
        num_heads=3,
        mlp_dim=96,
        pool="gap",
        pos_embed="sincos2d",
        init="impulse",
    )
    torch.manual_seed(0)
    model = VisionTransformer(config)
    attn = model.blocks[0].attn
    positions = torch.nn.functional.layer_norm(model.pos_embed[0, 1:], (192,))
    taps = [(1, -1), (0, 0), (-1, 1)]
    impulse_init_(attn, positions.double(), taps)
    q, k, _ = attn.qkv(positions).detach().reshape(64, 3, 3, 64).permute(1, 2, 0, 3)  # each (h, N, d)
    weights = (q @ k.transpose(-1, -2) * attn.scale).softmax(-1)  # (h, N, N)
    for head, (dy, dx) in enumerate(taps):
        target = impulse_offsets(8, dy, dx)
        assert torch.equal(weights[head].argmax(-1), target)
        assert weights[head][torch.arange(64), target].mean() > 0.5
    assert impulse_offsets(8, 1, -1)[:3].tolist() == [
        8,
        8,
        9,
    ]  # patch (0, 0) -> (1, 0) at the left edge, (0, 1) -> (1, 0), (0, 2) -> (1, 1)
    jax = VisionTransformer(config.replace(init="jax")).blocks[0].attn
    q, k, _ = jax.qkv(positions).detach().reshape(64, 3, 3, 64).permute(1, 2, 0, 3)
    assert (q @ k.transpose(-1, -2) * jax.scale).softmax(-1).max(-1).values.mean() < 0.2  # no such structure
    with pytest.raises(ConfigError, match="impulse.*--pos-embed sincos2d"):
        ViTConfig(init="impulse")


def test_an_impulse_model_starts_with_each_head_on_one_neighbour_in_every_block(monkeypatch):
    """init_weights' wiring of deviation 11: every block's heads draw their own 3 x 3 taps (never
    (0, 0) under locality self-attention's mask; without the mask (0, 0) may be drawn) and a meta
    model (parameter counting) builds without values."""
    config = ViTConfig(
        image_size=64,
        patch_size=8,
        num_classes=3,
        embed_dim=96,
        depth=3,
        num_heads=3,
        mlp_dim=96,
        pool="gap",
        pos_embed="sincos2d",
        init="impulse",
    )
    for locality in (False, True):
        torch.manual_seed(1)
        model = VisionTransformer(config.replace(locality=locality))
        positions = torch.nn.functional.layer_norm(model.pos_embed[0, 1:], (96,))
        offsets = set()
        for block in model.blocks:
            q, k, _ = block.attn.qkv(positions).detach().reshape(64, 3, 3, 32).permute(1, 2, 0, 3)
            keys = (q @ k.transpose(-1, -2)).argmax(-1)  # (h, N): the key each patch meets most
            for head in range(3):
                interior = [r * 8 + c for r in range(1, 7) for c in range(1, 7)]
                moves = {(int(keys[head, i]) // 8 - i // 8, int(keys[head, i]) % 8 - i % 8) for i in interior}
                assert (
                    len(moves) == 1 and max(map(abs, next(iter(moves)))) <= 1
                )  # one offset in the 3 x 3 for the whole grid
                offsets |= moves
        assert len(offsets) > 1  # not one tap for all heads and blocks
        if locality:
            assert (0, 0) not in offsets
    import foodvit.model.init as init
    from foodvit.model.init import impulse_taps

    torch.manual_seed(0)
    assert (0, 0) not in impulse_taps(1000, locality=True) and (0, 0) in impulse_taps(1000)
    asked = []
    monkeypatch.setattr(
        init, "impulse_taps", lambda heads, locality=False: asked.append(locality) or impulse_taps(heads, locality)
    )
    for masked in (True, False):
        VisionTransformer(config.replace(locality=True, locality_mask=masked))
    assert asked == [True] * 3 + [False] * 3  # a block each: the tap a mask would hide is barred only under the mask
    conv = config.replace(
        stem="conv"
    )  # a deviation count_params builds on the meta device, where the solve has no values
    assert count_params(conv) == sum(p.numel() for p in VisionTransformer(conv).parameters())


def test_forward_intermediates_gives_the_final_tokens_and_the_taken_blocks_patch_tokens():
    torch.manual_seed(0)
    model = tiny(pool="gap", depth=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, blocks = model.forward_intermediates(x, [2, 0], output_fmt="NLC")
        z = model._embed(x)
        outputs = []
        for block in model.blocks:
            z, _ = block(z)
            outputs.append(z)
        torch.testing.assert_close(final, model.norm(z), rtol=0, atol=0)
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        assert torch.equal(blocks[0], outputs[0][:, 1:]) and torch.equal(blocks[1], outputs[2][:, 1:])  # blocks' order
        grid = model.forward_intermediates(x, [0], intermediates_only=True)[0]  # NCHW, timm's default
        assert torch.equal(grid, outputs[0][:, 1:].transpose(1, 2).reshape(2, 48, 4, 4))
        attention = model.forward_intermediates(x, 1, attention=True, intermediates_only=True)
        assert len(attention) == 1 and attention[0].shape == (2, 3, 17, 17)  # the last block's (B, h, T, T)
        torch.testing.assert_close(model.forward_head(final), model(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model.forward_head(final, pre_logits=True), final[:, 1:].mean(1))
    with pytest.raises(ValueError, match="class_only=True: it cannot be taken"):
        tiny(depth=2).forward_intermediates(x, [1], class_only=True)  # a class-only last block computes no other token
    for indices in (0, 4, [3], [-4], []):
        with pytest.raises(ValueError, match="give"):
            model.forward_intermediates(x, indices)
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


@pytest.mark.parametrize(
    "options",
    [
        {"indices": 2},
        {"indices": [0, -1]},
        {"indices": [3, 1], "norm": True},
        {"indices": [1], "stop_early": True},
        {"indices": 3, "stop_early": True, "norm": True, "output_fmt": "NLC"},
        {"output_fmt": "NLC"},
        {"indices": [0, 2], "intermediates_only": True},
    ],
)
def test_forward_intermediates_gives_what_timms_gives_on_the_same_weights(options):
    """The door timm's ViTs share, with timm's meaning: an int takes the last n blocks, a list those blocks (in the
    blocks' order), norm passes them through the final norm, stop_early computes no later block, output_fmt lays
    the patch tokens out as (B, D, g, g) or (B, N, D), intermediates_only leaves the final tokens out."""
    timm = pytest.importorskip("timm")
    from helpers import randomize_

    torch.manual_seed(0)
    theirs = randomize_(timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=64, depth=4)).eval()
    ours = foodvit.load_weights(
        foodvit.create_model("ViT-Ti/16", num_classes=5, image_size=64, depth=4), theirs.state_dict()
    )
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        mine, reference = ours.eval().forward_intermediates(x, **options), theirs.forward_intermediates(x, **options)
        if not options.get("intermediates_only"):
            torch.testing.assert_close(mine[0], reference[0], rtol=1e-5, atol=1e-5)  # the final tokens
            mine, reference = mine[1], reference[1]
        assert [m.shape for m in mine] == [r.shape for r in reference]
        for m, r in zip(mine, reference, strict=True):
            torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-5)
        features = ours.forward_features(x)
        torch.testing.assert_close(features, theirs.forward_features(x), rtol=1e-5, atol=1e-5)
        for pre_logits in (False, True):
            torch.testing.assert_close(
                ours.forward_head(features, pre_logits), theirs.forward_head(features, pre_logits), rtol=1e-5, atol=1e-5
            )


def test_a_mask_shows_the_hidden_patches_as_the_mask_token_before_the_positions():
    torch.manual_seed(0)
    model = tiny(pool="gap").eval()
    x = torch.randn(2, 3, 32, 32)
    token = torch.randn(model.config.embed_dim)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, 3] = mask[1, 0] = True
    with torch.no_grad():
        patches = model.patch_embed(x)
        patches[mask] = token
        z = torch.cat([model.cls_token.expand(2, -1, -1), patches], dim=1) + model.pos_embed
        for block in model.blocks:
            z, _ = block(z)
        masked = model.forward_features(x, mask=mask, mask_token=token)
        torch.testing.assert_close(masked, model.norm(z), rtol=1e-6, atol=1e-6)
        unmasked = model.forward_features(x, mask=torch.zeros_like(mask), mask_token=token)
        assert torch.equal(unmasked, model.forward_features(x))
    with pytest.raises(ValueError, match="needs a mask token"):
        model.forward_features(x, mask=mask)
