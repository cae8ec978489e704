"""Distillation from a CNN teacher (DeiT's hard-label distillation): the loss, the wrapper, and a run
that trains its teacher first, saves it, reports it, and resumes without training it again."""

import json
import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import make_photo_folder
from test_train import small_config
from torch import nn

from foodvit.errors import ConfigError, RunError
from foodvit.model.variants import create_model
from foodvit.model.vit import Heads
from foodvit.rundir.directory import load_checkpoint
from foodvit.settings.overrides import with_settings
from foodvit.settings.run import RunConfig
from foodvit.training.objectives.base import Batch, Outputs
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.distill import Distillation
from foodvit.training.objectives.drloc import Localization
from foodvit.training.run import resume, train
from foodvit.training.teacher import Teacher, build_teacher


class Fixed(nn.Module):
    """A 'teacher' whose predicted class for each image is given."""

    def __init__(self, classes):
        super().__init__()
        self.classes = classes

    def forward(self, x):
        return F.one_hot(torch.as_tensor(self.classes[: x.shape[0]]), 3).float() * 5


def test_loss_is_the_cross_entropy_against_the_teachers_classes():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    wrapped = WithObjectives(vit, [Distillation(weight=0.7)], teacher=Teacher(Fixed([2, 0, 1, 1])))
    images = torch.randn(4, 3, 32, 32)
    wrapped.train()
    logits, extra = wrapped(images)
    torch.testing.assert_close(logits, vit(images), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(extra, 0.7 * F.cross_entropy(logits, torch.tensor([2, 0, 1, 1])))
    wrapped.eval()
    assert wrapped(images).logits.shape == (4, 3)  # the step's Output in either mode; a prediction is the ViT's own


def test_at_a_temperature_the_loss_is_the_scaled_divergence_from_the_teachers_softened_probabilities():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    nn.init.normal_(vit.head.weight)  # a head that does not start at zero: the student's probabilities are not uniform
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 3))
    images = torch.randn(4, 3, 32, 32)
    wrapped = WithObjectives(vit, [Distillation(weight=0.7, temperature=3.0)], teacher=Teacher(teacher)).train()
    logits, extra = wrapped(images)
    p = torch.softmax(teacher(images).detach() / 3, dim=1)  # the teacher's probabilities at T = 3, by hand
    q = torch.softmax(logits / 3, dim=1)
    by_hand = 0.7 * 9 * (p * (p.log() - q.log())).sum(dim=1).mean()
    torch.testing.assert_close(extra, by_hand, rtol=1e-5, atol=1e-6)
    hard = WithObjectives(vit, [Distillation(weight=0.7)], teacher=Teacher(teacher)).train()(images)[1]
    assert not torch.isclose(extra, hard)  # not the hard term
    # a student that copies the teacher's logits has nothing left to learn from it, at any temperature
    taught = teacher(images).detach()
    copying = Outputs(tokens=torch.zeros(0), heads=Heads(torch.zeros(0), taught, None))
    assert (
        Distillation(1.0, temperature=2.0, teacher=Teacher(teacher)).loss(Batch(images, vit), copying).abs().item()
        < 1e-6
    )
    empty = WithObjectives(vit, [Distillation(weight=1.0, temperature=3.0)], teacher=Teacher(teacher)).train()
    assert empty(torch.zeros(0, 3, 32, 32))[1].item() == 0.0  # an empty share costs nothing


def test_at_a_temperature_with_the_token_its_own_head_learns_the_teachers_probabilities():
    torch.manual_seed(0)
    vit = token_vit()
    nn.init.normal_(vit.head_dist.weight)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 3))
    images = torch.randn(4, 3, 32, 32)
    wrapped = WithObjectives(vit, [Distillation(weight=1.0, temperature=2.0)], teacher=Teacher(teacher)).train()
    outputs, terms = wrapped.terms(images)
    p = torch.softmax(teacher(images).detach() / 2, dim=1)
    by_hand = 4 * (p * (p.log() - torch.log_softmax(outputs.heads.distilled / 2, dim=1))).sum(dim=1).mean()
    torch.testing.assert_close(terms["distill"], by_hand, rtol=1e-5, atol=1e-6)
    terms["distill"].backward()
    assert vit.head_dist.weight.grad.abs().sum() > 0 and (
        vit.head.weight.grad is None or vit.head.weight.grad.abs().sum() == 0
    )


def test_a_temperature_without_distillation_is_refused():
    with pytest.raises(
        ConfigError, match="--distill-temperature softens the classes of a teacher that --distill reads"
    ):
        RunConfig.from_dict({"optim": {"distill_temperature": 3.0}})
    assert RunConfig.from_dict({"distill": {"weight": 1.0, "temperature": 3.0}}).distill.temperature == 3.0


def test_teacher_is_frozen_and_outside_the_trained_parameters():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    teacher = build_teacher("resnet18", 3)
    wrapped = WithObjectives(vit, [Distillation(weight=1.0)], teacher=Teacher(teacher))
    assert {id(p) for p in wrapped.parameters()} == {id(p) for p in vit.parameters()}
    assert all(not k.startswith("teacher") for k in wrapped.state_dict())
    wrapped.train()
    assert not teacher.training  # batch-norm statistics stay as trained
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    _, extra = wrapped(torch.randn(4, 3, 32, 32))
    extra.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert vit.head.weight.grad.abs().sum() > 0  # the ViT learns from the teacher (its head starts at zero)


def test_adds_to_the_localization_loss():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    localization = WithObjectives(vit, [Localization(vit.config.embed_dim, weight=0.5, pairs=4)])
    wrapped = WithObjectives(vit, [*localization.objectives, Distillation(weight=2.0)], teacher=Teacher(Fixed([1, 1])))
    wrapped.train()
    images = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    logits, extra = wrapped(images)
    torch.manual_seed(1)
    _, drloc_only = localization(images)  # same pairs drawn
    torch.testing.assert_close(extra, drloc_only + 2.0 * F.cross_entropy(logits, torch.tensor([1, 1])))


def test_an_empty_share_of_a_batch_costs_nothing():
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    wrapped = WithObjectives(vit, [Distillation(weight=1.0)], teacher=Teacher(build_teacher("resnet18", 3))).train()
    _, extra = wrapped(torch.zeros(0, 3, 32, 32))
    assert extra.item() == 0.0


def test_unknown_teacher_and_a_wrapper_without_teacher_are_refused():
    with pytest.raises(ConfigError, match="--teacher must be one of resnet18"):
        build_teacher("vgg11", 3)
    with pytest.raises(ConfigError, match="--teacher must be one of"):
        RunConfig.from_dict({"optim": {"distill": 1.0, "teacher": "alexnet"}})
    wrapped = WithObjectives(
        create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1), [Distillation(weight=1.0)]
    ).train()
    with pytest.raises(RuntimeError, match="reads the CNN teacher, which was not set"):
        wrapped(torch.randn(1, 3, 32, 32))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    # 12 training photos, batches of 8 and 4: each epoch of the resnet18 teacher (11 M parameters under
    # Adam) costs two steps
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def distilled(photos, epochs=2):
    config = small_config(photos, epochs=epochs, batch_size=8)
    return replace(
        config, distill=replace(config.distill, weight=1.0), teacher=replace(config.teacher, architecture="resnet18")
    )


@pytest.fixture(scope="module")
def distilled_run(photos, tmp_path_factory):
    """(folder, result) of distilled(photos) trained once for the tests that read it (or a copy of it):
    a ResNet-18 teacher is most of a test's time."""
    out = tmp_path_factory.mktemp("distilled") / "run"
    return out, train(distilled(photos), out, quiet=True)


def test_a_distilled_run_trains_saves_and_reports_its_teacher(distilled_run):
    out, result = distilled_run
    teacher = load_checkpoint(out / "teacher.pt")
    assert teacher["format"] == "foodvit-teacher" and teacher["architecture"] == "resnet18"
    assert [row["epoch"] for row in teacher["history"]] == [1, 2] and 0 <= teacher["history"][-1]["test_acc"] <= 1
    card = json.loads((out / "model.json").read_text())
    assert card["metrics"]["teacher_test_acc"] == teacher["history"][-1]["test_acc"]
    assert (
        "## CNN teacher" in (out / "report.md").read_text()
        and "its labels (distillation, weight 1)" in (out / "report.md").read_text()
    )
    state = load_checkpoint(out / "checkpoint.pt")
    assert not any(k.startswith(("teacher", "layer1", "fc.")) for k in state["model"])  # the checkpoint holds the ViT
    assert len(result.history) == 2


def test_a_teacher_that_would_see_one_photo_at_32_px_is_refused_with_a_batch_size_that_works(photos, tmp_path, capsys):
    # 12 photos in batches of 11 leave one for the last step, which a ResNet-18 at 32 px (a 1 x 1 last
    # feature map) cannot put through batch norm in training: said before it trains, with a batch size
    # that works; at 10 it trains
    config = distilled(photos, epochs=1)
    with pytest.raises(
        ConfigError,
        match=r"resnet18 teacher cannot train on a single photo at 32 px .* 12 photos an epoch in "
        r"batches of 11 give a process one photo in a step: give --batch-size 10, or an --image-size above 32",
    ):
        train(replace(config, train=replace(config.train, batch_size=11)), tmp_path / "one", quiet=True)
    assert not (tmp_path / "one" / "teacher.pt").exists()
    assert train(replace(config, train=replace(config.train, batch_size=10)), tmp_path / "ten", quiet=True).history


def test_a_teacher_of_its_own_side_that_would_see_one_photo_is_told_of_its_side(photos, tmp_path):
    config = distilled(photos, epochs=1)
    config = replace(config, teacher=replace(config.teacher, size=32), train=replace(config.train, batch_size=11))
    with pytest.raises(ConfigError, match=r"give --batch-size 10, or a --teacher-size above 32"):
        train(config, tmp_path / "one", quiet=True)


@pytest.mark.slow  # a stopped training and its resume; the teacher's reuse is also shown by the interruption test
def test_a_resumed_run_loads_its_teacher_and_ends_as_an_uninterrupted_one(photos, distilled_run, tmp_path, monkeypatch):
    _, whole = distilled_run  # the same settings, uninterrupted
    out = tmp_path / "stopped"
    import foodvit.training.trainer as T

    calls = {"n": 0}
    real = T.fit

    def stop_after_one_student_epoch(model, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the student's fit (the teacher's is the first)
            kwargs = {**kwargs, "epochs": 1}
        return real(model, *args, **kwargs)

    import foodvit.training.stages as S  # the teacher's fit runs there

    for module in (T, S):
        monkeypatch.setattr(module, "fit", stop_after_one_student_epoch)
    train(distilled(photos, epochs=2), out, quiet=True)
    assert len(load_checkpoint(out / "checkpoint.pt")["history"]) == 1
    for module in (T, S):
        monkeypatch.setattr(module, "fit", real)
    saved_teacher = (out / "teacher.pt").read_bytes()
    calls_after = {"n": 0}

    def count(model, *args, **kwargs):
        calls_after["n"] += 1
        return real(model, *args, **kwargs)

    for module in (T, S):
        monkeypatch.setattr(module, "fit", count)
    resumed = resume(out, quiet=True)
    assert calls_after["n"] == 1  # the student's epochs only
    assert (out / "teacher.pt").read_bytes() == saved_teacher
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])
    assert resumed.history[-1]["train_loss"] == pytest.approx(whole.history[-1]["train_loss"], rel=1e-5)


def test_a_foreign_teacher_file_is_refused(distilled_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(distilled_run[0], out)
    (out / "model.safetensors").unlink()  # as a run stopped before writing its model (a finished run is not resumed)
    state = load_checkpoint(out / "teacher.pt")
    for foreign in ({**state, "architecture": "resnet34"}, [1, 2, 3]):  # a list was an AttributeError's traceback
        torch.save(foreign, out / "teacher.pt")
        with pytest.raises(RunError, match="not this run's resnet18 CNN teacher"):
            resume(out, quiet=True)


def test_an_interruption_after_the_teacher_keeps_it_and_resumes_from_there(
    photos, distilled_run, tmp_path, monkeypatch
):
    _, whole = distilled_run  # the same settings, uninterrupted
    out = tmp_path / "stopped"
    import foodvit.training.trainer as T

    real, calls = T.fit, {"n": 0}

    def interrupt_the_student(model, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(model, *args, **kwargs)

    import foodvit.training.stages as S  # the teacher's fit runs there

    for module in (T, S):
        monkeypatch.setattr(module, "fit", interrupt_the_student)
    with pytest.raises(KeyboardInterrupt):
        train(distilled(photos, epochs=2), out, quiet=True)
    assert (out / "teacher.pt").is_file() and load_checkpoint(out / "checkpoint.pt")["epoch"] == 0
    for module in (T, S):
        monkeypatch.setattr(module, "fit", real)
    resumed = resume(out, quiet=True)
    assert [r["epoch"] for r in resumed.history] == [1, 2]
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])
    assert resumed.history[-1]["train_loss"] == pytest.approx(whole.history[-1]["train_loss"], rel=1e-5)


# DeiT's distillation token (model.py deviation 9) ----------------------------------------------


def token_vit(**changes):
    torch.manual_seed(0)
    return create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, distill_token=True, **changes)


@pytest.mark.parametrize("pool", ["cls", "gap"])
def test_the_token_is_a_second_prefix_token_and_prediction_averages_the_two_heads(pool):
    vit = token_vit(pool=pool).eval()
    assert vit.config.num_prefix_tokens == 2 and vit.config.num_tokens == 16 + 2
    images = torch.randn(3, 3, 32, 32)
    tokens, attentions = vit.forward_intermediates(images, attention=True)
    assert tokens.shape == (3, 18, 192) and attentions[0].shape[-1] == 18  # both tokens attend and are attended to
    pooled = vit.forward_head(tokens, pre_logits=True)
    by_hand = (vit.head(pooled) + vit.head_dist(tokens[:, 1])) / 2  # [class; distillation; patches]
    torch.testing.assert_close(
        vit(images), by_hand, rtol=1e-5, atol=1e-5
    )  # with pool='cls', the last block's fast path too
    heads = vit.forward_head(vit.forward_features(images), heads=True)
    torch.testing.assert_close(heads.logits, vit.head(pooled), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(heads.distilled, vit.head_dist(tokens[:, 1]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(heads.prediction(), by_hand, rtol=1e-5, atol=1e-5)
    assert type(heads) is Heads  # the two heads, by name, and no auxiliary loss from the plain ViT


def test_the_token_starts_apart_from_the_class_token_and_is_not_decayed():
    vit = token_vit()
    assert torch.count_nonzero(vit.cls_token) == 0 and 0.005 < vit.dist_token.std().item() < 0.04  # DeiT: N(0, 0.02)
    assert {"cls_token", "dist_token"} <= vit.no_weight_decay()
    assert torch.count_nonzero(vit.head_dist.weight) == 0  # zero-initialised like the paper's head


def test_with_the_token_the_teacher_trains_the_distillation_head_and_the_labels_the_class_head():
    vit = token_vit()
    nn.init.normal_(
        vit.head_dist.weight, std=0.1
    )  # as after some training: a zero head passes no gradient back to the token
    wrapped = WithObjectives(vit, [Distillation(weight=0.7)], teacher=Teacher(Fixed([2, 0, 1, 1]))).train()
    images = torch.randn(4, 3, 32, 32)
    logits, extra = wrapped(images)
    torch.manual_seed(0)
    heads = vit.forward_head(vit.forward_features(images), heads=True)
    torch.testing.assert_close(
        logits, heads.logits, rtol=1e-5, atol=1e-5
    )  # the engine's CE against y reads Eq. 4's head
    torch.testing.assert_close(
        extra, 0.7 * F.cross_entropy(heads.distilled, torch.tensor([2, 0, 1, 1])), rtol=1e-5, atol=1e-5
    )
    extra.backward()
    assert vit.head.weight.grad is None  # the teacher's term does not reach the class head ...
    assert (
        vit.head_dist.weight.grad.abs().sum() > 0 and vit.dist_token.grad.abs().sum() > 0
    )  # ... it trains the token's


def test_with_the_token_the_localization_loss_still_reads_the_patch_tokens_only():
    vit = token_vit(pool="gap")
    localization = Localization(vit.config.embed_dim, weight=0.5, pairs=4)
    wrapped = WithObjectives(vit, [localization, Distillation(weight=1.0)], teacher=Teacher(Fixed([1, 0]))).train()
    images = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    _, extra = wrapped(images)
    tokens = vit.forward_features(images)
    torch.manual_seed(1)
    drloc = 0.5 * localization.drloc(tokens[:, 2:])  # 16 patch tokens: a 4 x 4 grid, not 18
    torch.testing.assert_close(
        extra, drloc + F.cross_entropy(vit.head_dist(tokens[:, 1]), torch.tensor([1, 0])), rtol=1e-5, atol=1e-5
    )


def test_the_token_needs_a_teacher(capsys, tmp_path):
    with pytest.raises(
        ConfigError, match="--distill-token trains its own head on a teacher's classes: add --distill W"
    ):
        RunConfig.from_dict({"vit": {"distill_token": True}})
    with pytest.raises(ConfigError, match="no --freeze-backbone"):
        RunConfig.from_dict(
            {"vit": {"distill_token": True}, "optim": {"distill": 1.0}, "train": {"freeze_backbone": True}}
        )
    from foodvit.cli.main import main

    try:
        code = main(["train", "--distill-token", "--out", str(tmp_path / "never")])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and "add --distill W" in err and "Traceback" not in err and not (tmp_path / "never").exists()


def test_weights_keep_both_prefix_positions_and_fine_tuning_replaces_both_heads():
    from foodvit.model.weights import load_weights

    source = token_vit(pos_embed="learned")
    bigger = create_model("ViT-Ti/8", num_classes=5, image_size=48, depth=2, distill_token=True, pos_embed="learned")
    load_weights(bigger, source.state_dict(), skip_head=True)  # timm's names: dist_token, head_dist
    torch.testing.assert_close(
        bigger.pos_embed[:, :2], source.pos_embed[:, :2]
    )  # class and distillation positions kept
    assert bigger.pos_embed.shape == (1, 36 + 2, 192) and torch.equal(bigger.dist_token, source.dist_token)
    assert bigger.head_dist.weight.shape == (5, 192) and torch.count_nonzero(bigger.head_dist.weight) == 0


def test_a_run_with_the_token_saves_a_model_that_predicts_with_both_heads(photos, tmp_path):
    from foodvit.rundir.trained import load_model

    config = distilled(photos, epochs=1)
    config = replace(config, vit=replace(config.vit, distill_token=True))
    train(config, tmp_path / "run", quiet=True)
    card = json.loads((tmp_path / "run" / "model.json").read_text())
    assert card["model"]["distill_token"] is True
    model = load_model(tmp_path / "run").eval()
    images = torch.randn(2, 3, model.config.image_size, model.config.image_size)
    tokens = model.forward_features(images)
    torch.testing.assert_close(model(images), model.forward_head(tokens), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(model.head_dist.weight) > 0  # the distillation head was trained and saved


def test_the_report_says_what_the_vit_learned_from_its_teacher():
    from foodvit.training.report import teacher_section

    config = with_settings(
        RunConfig(),
        {"distill.weight": 0.5, "distill.temperature": 2.0, "guidance.weight": 1.0, "guidance.schedule": "linear"},
    )
    history = [{"epoch": 1, "seconds": 1.0, "test_acc": 0.25}, {"epoch": 2, "seconds": 1.5, "test_acc": 0.5}]
    [title, _, text, _] = teacher_section(config, history, "runs/lender")
    assert title == "## CNN teacher" and "for 2 epochs (2 s, in runs/lender, which lent it to this run)" in text
    assert (
        "its probabilities at temperature 2 (soft distillation, weight 0.5) and its feature maps (locality "
        "guidance, weight 1, falling linearly towards 0 over the epochs)"
    ) in text
    assert teacher_section(config, [], None) == []
