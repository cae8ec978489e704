"""Masked-patch reconstruction: hidden patches' embeddings become the mask token before the
positions are added, the loss is the decoder's error on their normalised pixels (computed by hand
here), prediction is the plain ViT's; a run keeps the task's parts in its checkpoint and resumes exactly."""

from dataclasses import replace

import pytest
import torch
from helpers import make_photo_folder
from test_train import small_config

from foodvit.errors import ConfigError
from foodvit.model.variants import create_model
from foodvit.rundir.directory import load_checkpoint
from foodvit.training import objectives
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.masked import MaskedPatches, draw_mask, patch_pixels
from foodvit.training.run import resume, train


def test_the_mask_hides_exactly_the_ratio_of_each_images_patches_at_random():
    torch.manual_seed(0)
    mask = draw_mask(4, 16, 0.25, torch.device("cpu"))
    assert mask.sum(1).tolist() == [4, 4, 4, 4]
    assert len({tuple(row.tolist()) for row in mask}) > 1  # not the same patches in every image


def test_the_hidden_patches_are_classified_as_the_mask_token_and_their_pixels_reconstructed():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, pool="gap", pos_embed="sincos2d")
    objective = MaskedPatches(vit, 0.7, ratio=0.5)
    wrapped = WithObjectives(vit, [objective]).train()
    images = torch.randn(2, 3, 32, 32)
    torch.manual_seed(5)
    logits, extra = wrapped(images)
    torch.manual_seed(5)
    hidden = draw_mask(2, 16, 0.5, images.device)  # the same draw
    with torch.no_grad():  # by hand: Eq. 1 with the mask token in the hidden patches' place, then the encoder
        x = vit.patch_embed(images)
        x = torch.where(hidden[..., None], objective.reconstruction.mask_token, x)
        x = torch.cat([vit.cls_token.expand(2, -1, -1), x], dim=1) + vit.pos_embed
        for block in vit.blocks:
            x, _ = block(x)
        tokens = vit.norm(x)
        predicted = objective.reconstruction.decoder(tokens[:, 1:][hidden])
        target = images.reshape(2, 3, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(2, 16, 192)[hidden]
        target = (target - target.mean(-1, keepdim=True)) / torch.sqrt(
            target.var(-1, unbiased=False, keepdim=True) + 1e-6
        )
        torch.testing.assert_close(logits, vit.head(tokens[:, 1:].mean(1)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(extra, 0.7 * ((predicted - target) ** 2).mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(patch_pixels(images, 8)[hidden], target)
    extra.backward()
    assert (
        objective.reconstruction.mask_token.grad.abs().sum() > 0 and vit.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
    )
    _, nothing = wrapped.train()(torch.zeros(0, 3, 32, 32))
    assert nothing.item() == 0.0


def test_mask_pixels_keeps_a_hidden_patchs_pixels_from_a_conv_tokenisers_neighbouring_tokens():
    # the conv stem's receptive fields overlap: with the token replaced alone a hidden patch's pixels still
    # reach its neighbours' tokens; with --mask-pixels they reach no token, so repainting them changes
    # no output token (what classifies and reconstructs), only the targets
    from foodvit.settings.overrides import with_settings
    from foodvit.settings.run import RunConfig

    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, pool="seq", pos_embed="sincos2d", stem="conv")
    images = torch.randn(2, 3, 32, 32)
    torch.manual_seed(5)
    hidden = draw_mask(2, 16, 0.25, images.device)  # the draw the task makes after manual_seed(5)
    repainted = torch.where(
        hidden.reshape(2, 1, 4, 4).repeat_interleave(8, -2).repeat_interleave(8, -1), torch.randn(2, 3, 32, 32), images
    )

    def run(task, x):  # the output tokens (the zero-initialised head's logits would be 0 either way) and the loss
        torch.manual_seed(5)
        outputs, terms = WithObjectives(vit, [task]).train().terms(x)
        return outputs.tokens, terms["masked"]

    hiding = objectives.build(
        vit, with_settings(RunConfig(), {"masked.weight": 1.0, "masked.pixels": True}), num_classes=3
    ).objectives[0]
    plain = objectives.build(vit, with_settings(RunConfig(), {"masked.weight": 1.0}), num_classes=3).objectives[0]
    assert hiding.hide_pixels and not plain.hide_pixels
    plain.reconstruction.load_state_dict(hiding.reconstruction.state_dict())
    (tokens, loss), (tokens_again, other_loss) = run(hiding, images), run(hiding, repainted)
    torch.testing.assert_close(tokens, tokens_again, rtol=0, atol=0)
    assert other_loss.item() != pytest.approx(loss.item())  # only the targets changed
    leaked, leaked_again = run(plain, images)[0], run(plain, repainted)[0]
    assert not torch.allclose(leaked, leaked_again)  # the contrast: the neighbours saw the repainted pixels


def test_mask_pixels_without_masked_patches_or_with_the_patch_stem_says_what_to_do():
    from foodvit.settings.objectives import MaskedSettings
    from foodvit.settings.overrides import with_settings
    from foodvit.settings.run import RunConfig

    with pytest.raises(
        ConfigError, match="--mask-pixels hides the pixels of the patches that --masked reconstructs: add --masked W"
    ):
        MaskedSettings(pixels=True)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1, pool="gap")  # the patch stem: nothing to hide
    with pytest.raises(ConfigError, match="--mask-pixels changes nothing with --stem patch.*use --stem conv or spt"):
        objectives.build(vit, with_settings(RunConfig(), {"masked.weight": 1.0, "masked.pixels": True}), num_classes=3)
    assert [
        o.name()
        for o in objectives.build(vit, with_settings(RunConfig(), {"masked.weight": 1.0}), num_classes=3).objectives
    ] == ["masked"]


def test_a_class_token_pooled_model_is_refused_with_what_to_do():
    with pytest.raises(ConfigError, match="--pool gap or --pool seq"):
        MaskedPatches(create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1), 1.0, 0.25)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def masked(photos, epochs):
    config = small_config(photos, epochs=epochs, batch_size=8)
    return replace(
        config,
        vit=replace(config.vit, pool="gap"),
        masked=replace(config.masked, weight=1.0),
        drloc=replace(config.drloc, weight=0.5),
    )


@pytest.mark.slow  # two trainings and a resume; exact resume itself is shown fast in test_train
def test_a_masked_run_keeps_the_tasks_parts_and_resumes_as_an_uninterrupted_one(photos, tmp_path, monkeypatch):
    whole = train(masked(photos, 2), tmp_path / "whole", quiet=True)
    state = load_checkpoint(tmp_path / "whole" / "checkpoint.pt")
    assert set(state["masked"]) == {"mask_token", "decoder.weight", "decoder.bias"} and state["auxiliary"]
    assert not any("mask_token" in k or "decoder" in k for k in state["model"])
    import foodvit.training.trainer as T

    real = T.fit
    monkeypatch.setattr(T, "fit", lambda *a, **k: real(*a, **{**k, "epochs": 1}))
    train(masked(photos, 2), tmp_path / "stopped", quiet=True)
    monkeypatch.setattr(T, "fit", real)
    resumed = resume(tmp_path / "stopped", quiet=True)
    assert resumed.history[-1]["train_loss"] == pytest.approx(whole.history[-1]["train_loss"], rel=1e-5)
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])
