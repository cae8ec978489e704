"""Instance discrimination (--contrast): SimCLR's loss (computed by hand here), the second view's crop,
flip and colours, the wrapper's term from both views' pooled states, prediction by the ViT alone, and
a run that keeps the projection in its checkpoint, not in its model."""

import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import make_photo_folder
from test_train import small_config

from foodvit.errors import ConfigError
from foodvit.model.variants import create_model
from foodvit.rundir.directory import load_checkpoint
from foodvit.settings.objectives import ContrastSettings
from foodvit.settings.run import RunConfig
from foodvit.training.objectives import build
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.contrast import (
    InstanceDiscrimination,
    crop_resize,
    distort_colours,
    draw_boxes,
    nt_xent,
    second_view,
)
from foodvit.training.resizing import AnyGrid
from foodvit.training.run import train


def test_the_loss_is_simclrs_nt_xent_by_hand():
    torch.manual_seed(0)
    first, second = torch.randn(3, 4), torch.randn(3, 4)
    z = F.normalize(torch.cat([first, second]), dim=1)
    terms = []
    for i in range(6):  # each view against the other five, its pair the same photo's other view
        pair = (i + 3) % 6
        others = [j for j in range(6) if j != i]
        similarity = {j: (z[i] @ z[j]).item() / 0.5 for j in others}
        terms.append(-similarity[pair] + math.log(sum(math.exp(s) for s in similarity.values())))
    assert nt_xent(first, second, 0.5).item() == pytest.approx(sum(terms) / 6, rel=1e-5)


def test_views_nearer_their_own_pair_lose_less_and_no_pairs_lose_nothing():
    torch.manual_seed(0)
    first = torch.randn(8, 16)
    near = first + 0.1 * torch.randn(8, 16)
    assert nt_xent(first, near, 0.2) < nt_xent(
        first, near.roll(1, dims=0), 0.2
    )  # the same views paired with another photo's
    assert nt_xent(first, near, 0.1) < nt_xent(first, near, 1.0)  # a sharper temperature rewards the right pairs more
    empty = nt_xent(torch.zeros(0, 16, requires_grad=True), torch.zeros(0, 16), 0.2)
    assert empty.item() == 0.0 and empty.requires_grad


def test_the_crop_boxes_lie_inside_the_image_with_the_asked_area_and_shape():
    torch.manual_seed(0)
    boxes = draw_boxes(500, 40, 40, scale=(0.35, 0.5))
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 40).all() and (left + w <= 40).all()
    share, aspect = (h * w).float() / 1600, w.float() / h.float()
    assert share.min() > 0.33 and share.max() < 0.52  # the scale asked, up to rounding to whole pixels
    assert aspect.min() > 0.7 and aspect.max() < 1.43 and aspect.std() > 0.05  # 3/4 to 4/3, and they vary
    assert len({tuple(b) for b in boxes.tolist()}) > 400
    whole = draw_boxes(50, 12, 30, scale=(1.0, 1.0))
    assert (whole[:, 2] <= 12).all() and (whole[:, 3] <= 30).all()  # clipped to the image


def test_a_box_is_cut_out_and_resized_to_the_batchs_side():
    images = torch.zeros(2, 3, 8, 8)
    images[:, 0, :4, :4] = 1.0  # the top-left quarter red
    out = crop_resize(images, torch.tensor([[0, 0, 4, 4], [0, 0, 8, 8]]))
    assert out.shape == images.shape
    torch.testing.assert_close(out[0, 0], torch.ones(8, 8))  # the red quarter fills the view
    torch.testing.assert_close(out[0, 1:], torch.zeros(2, 8, 8))
    torch.testing.assert_close(out[1], images[1])  # the whole image: itself


def test_the_colours_are_stretched_shifted_and_greyed_as_drawn():
    torch.manual_seed(0)
    images = torch.randn(3, 3, 4, 4)
    contrast, shift = torch.tensor([1.0, 1.5, 1.0]), torch.tensor([[0.0, 0.0, 0.0], [0.1, -0.2, 0.3], [0.0, 0.0, 0.0]])
    out = distort_colours(images, contrast, shift, torch.tensor([False, False, True]))
    torch.testing.assert_close(out[0], images[0])
    mean = images[1].mean()
    torch.testing.assert_close(out[1], (images[1] - mean) * 1.5 + mean + shift[1][:, None, None])
    torch.testing.assert_close(out[2], images[2].mean(0, keepdim=True).expand(3, 4, 4))


def test_the_second_view_is_another_view_of_the_same_size_repeated_by_the_seed():
    images = torch.randn(4, 3, 16, 16)
    torch.manual_seed(3)
    view = second_view(images)
    torch.manual_seed(3)
    assert view.shape == images.shape and torch.equal(view, second_view(images))
    assert not torch.allclose(view, images)


def test_the_second_view_flips_and_greys_a_share_of_the_photos(monkeypatch):
    import foodvit.training.objectives.contrast as C

    images = torch.randn(400, 3, 8, 8)  # the whole photo each time: the flip and the grey are what remain to see
    monkeypatch.setattr(C, "draw_boxes", lambda B, H, W: torch.tensor([[0, 0, H, W]]).repeat(B, 1))
    monkeypatch.setattr(C, "CONTRAST", (1.0, 1.0))
    monkeypatch.setattr(C, "SHIFT", 0.0)
    torch.manual_seed(0)
    view = C.second_view(images)
    grey = (view.std(dim=1) < 1e-6).flatten(1).all(1)  # the three channels equal
    shown = torch.where(grey[:, None, None, None], images.mean(1, keepdim=True).expand_as(images), images)
    flipped = (view - shown.flip(-1)).abs().flatten(1).amax(1) < 1e-5
    kept = (view - shown).abs().flatten(1).amax(1) < 1e-5
    assert (flipped ^ kept).all()  # each photo flipped or not, nothing else
    assert 0.4 < flipped.float().mean() < 0.6 and 0.12 < grey.float().mean() < 0.28  # half flipped, a fifth grey


def vit_for(pool: str):
    torch.manual_seed(0)
    return create_model(
        "ViT-Ti/8",
        num_classes=3,
        image_size=32,
        depth=2,
        embed_dim=48,
        num_heads=3,
        mlp_dim=96,
        pool=pool,
        pos_embed="sincos2d",
    )


@pytest.mark.parametrize("pool", ["cls", "seq"])
def test_the_term_contrasts_the_projected_pooled_states_of_both_views(pool):
    vit = vit_for(pool)
    contrast = InstanceDiscrimination(vit.config.embed_dim, 0.7, temperature=0.3)
    wrapped = WithObjectives(vit, [contrast]).train()
    images = torch.randn(4, 3, 32, 32)
    torch.manual_seed(5)
    logits, extra = wrapped(images)
    with torch.no_grad():  # by hand: the first view as given, the second drawn from the same stream
        torch.manual_seed(5)
        view = second_view(images)
        z1 = contrast.projection(vit.forward_head(vit.forward_features(images), pre_logits=True))
        z2 = contrast.projection(vit.forward_head(vit.forward_features(view), pre_logits=True))
        torch.testing.assert_close(logits, vit(images), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(extra, 0.7 * nt_xent(z1, z2, 0.3), rtol=1e-5, atol=1e-6)
    extra.backward()
    assert contrast.projection.mlp[0].weight.grad.abs().sum() > 0 and vit.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
    _, nothing = wrapped.train()(torch.zeros(0, 3, 32, 32))
    assert nothing.item() == 0.0


def test_the_second_view_leaves_a_conv_stems_running_statistics_to_the_photos_as_shown():
    torch.manual_seed(0)
    vit = create_model(
        "ViT-Ti/8",
        num_classes=3,
        image_size=32,
        depth=2,
        embed_dim=48,
        num_heads=3,
        mlp_dim=96,
        pool="seq",
        pos_embed="sincos2d",
        stem="conv",
    )
    plain = copy.deepcopy(vit).train()
    images = torch.randn(4, 3, 32, 32) * 2 + 1
    torch.manual_seed(5)
    logits, extra = WithObjectives(vit, [InstanceDiscrimination(48, 1.0)]).train()(images)
    (logits.sum() + extra).backward()  # both passes' gradients through the stem's batch norms
    assert vit.patch_embed.stem.layers[0].weight.grad.abs().sum() > 0
    plain(images)  # one plain training pass over the same photos
    norms = [(a, b) for a, b in zip(vit.modules(), plain.modules(), strict=True) if isinstance(a, torch.nn.BatchNorm2d)]
    assert norms
    for ours, theirs in norms:
        assert ours.num_batches_tracked.item() == 1
        torch.testing.assert_close(ours.running_mean, theirs.running_mean)
        torch.testing.assert_close(ours.running_var, theirs.running_var)


def test_the_temperature_reaches_the_loss():
    composed = build(vit_for("gap"), RunConfig(contrast=ContrastSettings(weight=1.0, temperature=0.5)), num_classes=3)
    assert composed.objectives[0].temperature == 0.5


def test_both_views_of_a_smaller_batch_take_its_grid_under_progressive_resizing():
    vit = vit_for("gap")
    wrapped = WithObjectives(AnyGrid(vit), [InstanceDiscrimination(48, 1.0)]).train()
    logits, extra = wrapped(torch.randn(4, 3, 16, 16))  # a 2 x 2 grid on a 4 x 4 model
    assert logits.shape == (4, 3) and torch.isfinite(extra) and extra.item() > 0


def test_a_temperature_without_the_loss_or_out_of_range_says_what_to_do():
    with pytest.raises(
        ConfigError, match="--contrast-temperature sets how sharply --contrast compares the two views: add --contrast W"
    ):
        ContrastSettings(temperature=0.5)
    for bad in (0.0, float("nan")):
        with pytest.raises(ConfigError, match="contrast-temperature"):
            ContrastSettings(weight=1.0, temperature=bad)


def test_a_run_keeps_the_projection_in_its_checkpoint_and_not_in_its_model(tmp_path_factory):
    photos = make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)
    config = small_config(photos, epochs=1, batch_size=8)
    run = tmp_path_factory.mktemp("runs") / "run"
    # the default recipe's shape: a conv stem (batch norms) and sequence pooling, beside masked patches
    config = replace(
        config,
        vit=replace(config.vit, stem="conv", pool="seq", pos_embed="sincos2d"),
        contrast=replace(config.contrast, weight=0.5),
        masked=replace(config.masked, weight=1.0),
    )
    result = train(config, run, quiet=True)
    state = load_checkpoint(run / "checkpoint.pt")
    assert set(state["contrast"]) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
    assert not any("projection" in k or k.startswith("mlp.") for k in state["model"])
    assert math.isfinite(result.history[-1]["train_objective"])


@pytest.mark.slow  # two trainings and a resume; exact resume itself is shown fast in test_train
def test_a_contrast_run_resumes_as_an_uninterrupted_one(tmp_path, monkeypatch):
    import foodvit.training.trainer as T
    from foodvit.training.run import resume

    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    config = small_config(photos, epochs=2, batch_size=8)
    config = replace(
        config,
        vit=replace(config.vit, stem="conv", pool="seq", pos_embed="sincos2d"),
        contrast=replace(config.contrast, weight=0.5),
    )
    whole = train(config, tmp_path / "whole", quiet=True)
    real = T.fit
    monkeypatch.setattr(T, "fit", lambda *a, **k: real(*a, **{**k, "epochs": 1}))
    train(config, tmp_path / "stopped", quiet=True)
    monkeypatch.setattr(T, "fit", real)
    resumed = resume(tmp_path / "stopped", quiet=True)  # the projection and the random streams come back
    assert resumed.history[-1]["train_objective"] == pytest.approx(whole.history[-1]["train_objective"], rel=1e-5)
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])
