"""Self-supervised pre-training (--pretrain-epochs): the hidden patches' pixels reach no token, the
engine minimises the reconstruction loss alone without reading a label, a run pre-trains before
its supervised epochs, keeps the fact in its checkpoint and resumes without pre-training again."""

from dataclasses import replace

import pytest
import torch
from helpers import make_photo_folder
from test_train import small_config

from foodvit.errors import ConfigError
from foodvit.model.variants import create_model
from foodvit.rundir.directory import PRETRAINING_FILE, load_checkpoint
from foodvit.settings.run import PretrainSettings, RunConfig, TrainConfig
from foodvit.training.engine import Output, TrainingDiverged, train_one_epoch
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.masked import MaskedPatches, draw_mask, patch_pixels
from foodvit.training.pretrain import masked_image_modelling
from foodvit.training.run import resume, train


def reconstructions(task, images, seed=5):
    """The decoder's predictions for the hidden patches, and the loss, with the mask of `seed`."""
    seen = {}
    handle = task.objectives[0].reconstruction.decoder.register_forward_hook(
        lambda m, a, out: seen.__setitem__("out", out)
    )
    torch.manual_seed(seed)
    try:
        logits, loss = task(images)
    finally:
        handle.remove()
    return logits, seen["out"], loss


def test_no_token_sees_the_pixels_of_a_hidden_patch_in_pre_training():
    # shifted patch tokens hold half-patch shifted copies of their neighbours' pixels: with token masking
    # alone (the auxiliary --masked) a hidden patch's pixels reach its neighbours, in pre-training they do not
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, pool="gap", pos_embed="sincos2d", stem="spt")
    pre, aux = masked_image_modelling(vit, 0.5).train(), WithObjectives(vit, [MaskedPatches(vit, 1.0, 0.5)]).train()
    images = torch.randn(2, 3, 32, 32)
    torch.manual_seed(5)
    hidden = draw_mask(2, 16, 0.5, images.device)  # the draw the tasks make after manual_seed(5)
    repainted = torch.where(
        hidden.reshape(2, 1, 4, 4).repeat_interleave(8, -2).repeat_interleave(8, -1), torch.randn(2, 3, 32, 32), images
    )
    logits, first, loss = reconstructions(pre, images)
    _, second, other_loss = reconstructions(pre, repainted)
    assert logits is None
    torch.testing.assert_close(
        first, second, rtol=0, atol=0
    )  # the same predictions: nothing of the hidden pixels got in
    assert other_loss.item() != pytest.approx(loss.item())  # only the targets changed
    target = patch_pixels(images, 8)[hidden]
    assert loss.item() == pytest.approx(((first - target) ** 2).mean().item(), rel=1e-5)
    _, leaked, _ = reconstructions(aux, images)
    _, leaked_other, _ = reconstructions(aux, repainted)
    assert not torch.allclose(leaked, leaked_other)  # the contrast: token masking alone lets them through


def test_pre_training_trains_the_encoder_and_not_the_head():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, pool="seq", pos_embed="sincos2d", stem="conv")
    task = masked_image_modelling(vit, 0.5).train()
    _, loss = task(torch.randn(4, 3, 32, 32))
    loss.backward()
    assert all(p.grad is not None for p in task.parameters())  # as DistributedDataParallel expects
    assert vit.head.weight.grad.abs().sum() == 0 and vit.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert (
        task.objectives[0].reconstruction.mask_token.grad.abs().sum() > 0
        and vit.patch_embed.stem.layers[0].weight.grad.abs().sum() > 0
    )
    # a distillation token's head, which the stage does not train either, still gets its gradient of 0
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1, pool="gap", distill_token=True)
    _, loss = masked_image_modelling(vit, 0.5).train()(torch.randn(2, 3, 32, 32))
    loss.backward()
    assert vit.head_dist.weight.grad is not None and vit.head_dist.weight.grad.abs().sum() == 0


def test_the_engine_minimises_a_self_supervised_loss_alone_without_reading_labels():
    class Squares(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return Output(None, ((self.w * x) ** 2).mean())

    x = torch.tensor([[1.0], [3.0]])
    model = Squares()
    labels = torch.tensor([99, -7])  # no class would take these: a cross-entropy over them fails
    row = train_one_epoch(model, [(x, labels)], torch.optim.SGD(model.parameters(), lr=0.01))
    assert (
        row["train_objective"] == pytest.approx(4 * 5)
        and row["train_loss"] == pytest.approx(20)
        and row["train_acc"] == 0
    )
    assert model.w.item() == pytest.approx(2 - 0.01 * 2 * 2 * 5)  # d/dw mean(w^2 x^2) = 2 w mean(x^2) = 20


def test_pre_training_is_refused_where_it_cannot_work_with_what_to_do():
    with pytest.raises(ConfigError, match="--pretrain-epochs.*--pool gap or --pool seq"):
        masked_image_modelling(create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1), 0.5)
    with pytest.raises(ConfigError, match="--freeze-backbone"):
        RunConfig(pretrain=PretrainSettings(epochs=5), train=TrainConfig(freeze_backbone=True))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def pretraining(photos, epochs, pretrain_epochs=2):
    config = small_config(photos, epochs=epochs, batch_size=8)
    return replace(
        config, vit=replace(config.vit, pool="gap"), pretrain=replace(config.pretrain, epochs=pretrain_epochs)
    )


def test_a_run_pre_trains_before_its_supervised_epochs(photos, tmp_path):
    pre = train(pretraining(photos, 1), tmp_path / "pre", quiet=True)
    plain = train(pretraining(photos, 1, pretrain_epochs=0), tmp_path / "plain", quiet=True)
    rows = (tmp_path / "pre" / PRETRAINING_FILE).read_text().splitlines()
    assert rows[0] == "epoch,reconstruction_loss,lr,seconds" and [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert all(float(r.split(",")[1]) > 0 for r in rows[1:])
    state = load_checkpoint(tmp_path / "pre" / "checkpoint.pt")
    assert state["pretrained"] is True and not any("mask_token" in k or "decoder" in k for k in state["model"])
    assert (
        not (tmp_path / "plain" / PRETRAINING_FILE).exists()
        and load_checkpoint(tmp_path / "plain" / "checkpoint.pt")["pretrained"] is False
    )
    assert pre.history[0]["train_loss"] != pytest.approx(
        plain.history[0]["train_loss"]
    )  # the same seed, other starting weights
    # sharpness-aware minimisation is the supervised stage's: the stage's losses are those of the run without it
    config = pretraining(photos, 1)
    train(replace(config, optim=replace(config.optim, sam=0.05)), tmp_path / "sam", quiet=True)
    losses = [
        [r.split(",")[1] for r in (tmp_path / run / PRETRAINING_FILE).read_text().splitlines()[1:]]
        for run in ("pre", "sam")
    ]
    assert losses[0] == losses[1]
    assert (
        load_checkpoint(tmp_path / "sam" / "checkpoint.pt")["model"]["head.weight"]
        .ne(load_checkpoint(tmp_path / "pre" / "checkpoint.pt")["model"]["head.weight"])
        .any()
    )  # the supervised steps are SAM's


def test_a_run_that_fails_in_pre_training_says_where_and_leaves_nothing_behind(photos, tmp_path, monkeypatch):
    real, calls = WithObjectives.forward, []

    def diverge(self, images):  # 12 photos in batches of 8: the third step is the second epoch's first
        calls.append(1)
        _, loss = real(self, images)
        return Output(None, loss * float("nan") if len(calls) == 3 else loss)

    monkeypatch.setattr(WithObjectives, "forward", diverge)
    with pytest.raises(
        TrainingDiverged, match="in self-supervised pre-training epoch 2; training stopped and no epoch finished"
    ):
        train(pretraining(photos, 1), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()  # its pretraining.csv too: nothing to resume, nothing left


@pytest.mark.slow  # two trainings and a resume; test_a_run_pre_trains_before_its_supervised_epochs: the stage, fast
def test_a_pre_trained_run_resumes_as_an_uninterrupted_one_without_pre_training_again(photos, tmp_path, monkeypatch):
    whole = train(pretraining(photos, 2), tmp_path / "whole", quiet=True)
    import foodvit.training.trainer as T

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # after the stage, before the first supervised epoch ends

    monkeypatch.setattr(T, "fit", stop)
    with pytest.raises(KeyboardInterrupt):
        train(pretraining(photos, 2), tmp_path / "stopped", quiet=True)
    assert load_checkpoint(tmp_path / "stopped" / "checkpoint.pt")["pretrained"] is True
    monkeypatch.undo()

    def again(trainer, rows):
        raise AssertionError("pre-trained again")

    monkeypatch.setattr(T, "pretrain", again)
    resumed = resume(tmp_path / "stopped", quiet=True)
    assert resumed.history[-1]["train_loss"] == pytest.approx(whole.history[-1]["train_loss"], rel=1e-5)
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])


def test_the_command_line_refuses_pre_training_a_class_token_model_before_reading_a_photo(photos, tmp_path, capsys):
    from foodvit.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", "--data", str(photos), "--pretrain-epochs", "1", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    assert errors == [lines[-1]] and "--pretrain-epochs" in errors[0] and "--pool gap or --pool seq" in errors[0]
    assert not any("reading" in line for line in lines)  # no photo read
    assert not out.exists()
