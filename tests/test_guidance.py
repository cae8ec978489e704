"""Locality guidance: blocks' patch tokens, through 1x1 adapters, learn a CNN teacher's feature maps
(the loss computed by hand here), the teacher frozen and outside the model; a guided run trains its
teacher once, keeps the adapters in its checkpoint and resumes exactly."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import make_photo_folder
from test_train import small_config

from foodvit.errors import ConfigError
from foodvit.model.variants import create_model
from foodvit.rundir.directory import load_checkpoint
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.distill import Distillation
from foodvit.training.objectives.guidance import LocalityGuidance, epoch_weight, guided_blocks
from foodvit.training.run import resume, train
from foodvit.training.teacher import Teacher, build_teacher


def test_the_guided_blocks_spread_over_the_depth_and_leave_the_last_one_to_the_classifier():
    assert guided_blocks(6) == [1, 2, 4]
    assert guided_blocks(12) == [3, 6, 10]
    assert guided_blocks(2) == [0, 0, 0]
    with pytest.raises(ConfigError, match="--depth 2 or more"):
        guided_blocks(1)


def test_a_fourth_stage_guides_the_last_block_as_well():
    assert guided_blocks(6, 4) == [1, 2, 4, 5]  # --guidance-stages 4: the teacher's last stage guides the last block
    assert guided_blocks(2, 4) == [0, 0, 0, 1]
    with pytest.raises(ConfigError, match="--guidance-stages must be 3 or 4"):
        guided_blocks(6, 2)


def by_hand(vit, teacher, adapters, blocks, images):
    """The guidance loss written out: block outputs, teacher stages, pooled to the coarser grid, teacher
    standardised."""
    x = vit._embed(images)  # Eq. 1, then the blocks by hand
    outputs = []
    for block in vit.blocks:
        x, _ = block(x)
        outputs.append(x)
    t = teacher.maxpool(teacher.relu(teacher.bn1(teacher.conv1(images))))
    maps = []
    for layer in (teacher.layer1, teacher.layer2, teacher.layer3, teacher.layer4)[: len(blocks)]:
        t = layer(t)
        maps.append(t)
    losses = []
    for adapter, b, target in zip(adapters, blocks, maps, strict=True):
        tokens = outputs[b][:, 1:]  # the class token left out
        g = int(tokens.shape[1] ** 0.5)
        student = adapter(tokens.transpose(1, 2).reshape(len(images), -1, g, g))
        size = min(g, target.shape[-1])
        student, target = F.adaptive_avg_pool2d(student, size), F.adaptive_avg_pool2d(target, size)
        mean, var = target.mean(1, keepdim=True), target.var(1, unbiased=False, keepdim=True)
        losses.append(((student - (target - mean) / torch.sqrt(var + 1e-5)) ** 2).mean())
    return sum(losses) / len(losses)


def test_the_loss_is_the_adapted_tokens_error_against_the_teachers_standardised_maps():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=64, depth=3)  # 8 x 8 tokens; ResNet stages 16, 8, 4
    teacher = build_teacher("resnet18", 3)
    guidance = LocalityGuidance(vit, 0.3, teacher)
    wrapped = WithObjectives(vit, [guidance])
    wrapped.set_teacher(Teacher(teacher))
    images = torch.randn(2, 3, 64, 64)
    wrapped.train()
    logits, extra = wrapped(images)
    torch.testing.assert_close(logits, vit(images), rtol=1e-5, atol=1e-5)  # the ViT's own logits
    with torch.no_grad():
        expected = 0.3 * by_hand(vit, teacher, guidance.adapters, guidance.blocks, images)
    torch.testing.assert_close(extra, expected, rtol=1e-4, atol=1e-6)
    assert [a.out_channels for a in guidance.adapters] == [64, 128, 256]  # ResNet-18's stage widths
    extra.backward()
    assert all(a.weight.grad.abs().sum() > 0 for a in guidance.adapters)
    assert vit.blocks[1].attn.qkv.weight.grad.abs().sum() > 0  # the guided blocks learn from it
    assert all(p.grad is None for p in teacher.parameters()) and not teacher.training
    assert {id(p) for p in wrapped.parameters()} == {id(p) for p in vit.parameters()} | {
        id(p) for p in guidance.adapters.parameters()
    }
    _, nothing = wrapped.train()(torch.zeros(0, 3, 64, 64))
    assert nothing.item() == 0.0  # an empty share of a batch (distributed) costs nothing


def test_four_stages_add_the_teachers_last_stage_against_the_last_block():
    torch.manual_seed(0)
    teacher = build_teacher("resnet18", 3).eval()
    with pytest.raises(
        ConfigError, match="use --pool gap or --pool seq"
    ):  # a class-token model's last block computes no patch token
        LocalityGuidance(create_model("ViT-Ti/8", num_classes=3, image_size=64, depth=3), 1.0, teacher, stages=4)
    vit = create_model(
        "ViT-Ti/8", num_classes=3, image_size=64, depth=3, pool="gap"
    )  # 8 x 8 tokens; ResNet-18's layer4 at 2 x 2
    three, four = LocalityGuidance(vit, 1.0, teacher), LocalityGuidance(vit, 1.0, teacher, stages=4)
    assert four.blocks == (0, 0, 1, 2) and [a.out_channels for a in four.adapters] == [64, 128, 256, 512]
    # the same first three adapters: the fourth pair is the only change
    for a3, a4 in zip(three.adapters, four.adapters[:3], strict=True):
        a4.load_state_dict(a3.state_dict())
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        loss3, loss4 = (WithObjectives(vit, [g], teacher=Teacher(teacher)).train()(images)[1] for g in (three, four))
        expected = by_hand(vit, teacher, four.adapters, four.blocks, images)
    torch.testing.assert_close(loss4, expected, rtol=1e-4, atol=1e-6)
    x = vit._embed(images)  # the fourth pair alone, written out: the last block against layer4, pooled to its 2 x 2
    for block in vit.blocks:
        x, _ = block(x)
    t = teacher.layer4(
        teacher.layer3(
            teacher.layer2(teacher.layer1(teacher.maxpool(teacher.relu(teacher.bn1(teacher.conv1(images))))))
        )
    )
    student = F.adaptive_avg_pool2d(four.adapters[3](x[:, 1:].transpose(1, 2).reshape(2, -1, 8, 8)), 2)
    target = (t - t.mean(1, keepdim=True)) / torch.sqrt(t.var(1, unbiased=False, keepdim=True) + 1e-5)
    fourth = ((student - target) ** 2).mean()
    torch.testing.assert_close(loss4, (3 * loss3 + fourth) / 4, rtol=1e-4, atol=1e-6)  # the mean over four pairs
    from foodvit.settings.objectives import GuidanceSettings

    with pytest.raises(ConfigError, match="add --guidance W"):
        GuidanceSettings(stages=4)


def test_adds_to_distillation_and_needs_its_teacher():
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2)
    teacher = build_teacher("resnet18", 3).eval()
    guided = WithObjectives(vit, [LocalityGuidance(vit, 1.0, teacher)])
    with pytest.raises(RuntimeError, match="reads the CNN teacher, which was not set"):
        guided.train()(torch.randn(1, 3, 32, 32))
    guided.set_teacher(Teacher(teacher))
    both = WithObjectives(vit, [*guided.objectives, Distillation(2.0)], teacher=Teacher(teacher)).train()
    images = torch.randn(3, 3, 32, 32)
    logits, extra = both(images)
    _, guidance_only = guided(images)
    distill = F.cross_entropy(logits, teacher(images).argmax(1))
    torch.testing.assert_close(extra, guidance_only + 2.0 * distill, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def guided(photos, epochs, schedule="constant"):
    config = small_config(photos, epochs=epochs, batch_size=8)
    return replace(
        config,
        guidance=replace(config.guidance, weight=1.0, schedule=schedule),
        teacher=replace(config.teacher, architecture="resnet18"),
    )


@pytest.fixture(scope="module")
def uninterrupted(photos, tmp_path_factory):
    """(folder, result) of guided(photos, 2, "linear") trained uninterrupted, once for the tests that compare a
    stopped or staged run with it: its ResNet-18 teacher is most of a test's time."""
    out = tmp_path_factory.mktemp("guided") / "whole"
    return out, train(guided(photos, 2, "linear"), out, quiet=True)


def test_the_linear_schedule_moves_the_weight_to_the_first_epochs_and_halves_it_in_all():
    assert [epoch_weight(0.5, "constant", e, 4) for e in range(4)] == [0.5] * 4
    assert [epoch_weight(2.0, "linear", e, 4) for e in range(4)] == [2.0, 1.5, 1.0, 0.5]
    weights = [epoch_weight(1.0, "linear", e, 100) for e in range(100)]
    assert weights[0] == 1.0 and weights[-1] == pytest.approx(0.01) and min(weights) > 0
    assert sum(weights) / 100 == pytest.approx(0.505)  # the constant 0.5's guidance in all, moved early
    with pytest.raises(ConfigError, match="constant or linear"):
        epoch_weight(1.0, "cosine", 0, 4)


def test_a_schedule_needs_guidance_and_each_epoch_trains_at_its_weight(photos, tmp_path):
    from foodvit.settings.objectives import GuidanceSettings
    from foodvit.training.trainer import Trainer

    with pytest.raises(ConfigError, match="add --guidance W"):
        GuidanceSettings(schedule="linear")
    for schedule, expected in (("linear", [1.0, 0.75, 0.5, 0.25]), ("constant", [1.0] * 4)):
        trainer = Trainer(guided(photos, 4, schedule), tmp_path / schedule, quiet=True, log=lambda *a, **k: None)
        seen = []
        for epoch in range(4):
            trainer._before_epoch(epoch)
            seen.append(trainer.objectives.objectives[0].weight_at(trainer.objectives.epoch, 4))
        assert seen == expected
    # and the loss reads it: the linear run's guidance term at its last epoch is a quarter of its first's
    trainer_linear = Trainer(guided(photos, 4, "linear"), tmp_path / "loss", quiet=True, log=lambda *a, **k: None)
    composed = trainer_linear.objectives
    composed.set_teacher(Teacher(build_teacher("resnet18", 3)))
    composed.train()
    images = torch.randn(2, 3, 32, 32)

    def term(epoch):
        trainer_linear._before_epoch(epoch)
        with torch.no_grad():
            torch.manual_seed(0)  # any other objective draws the same both times (drloc's pairs)
            return composed.terms(images)[1]["guidance"]

    first, last = term(0), term(3)
    assert first > 0
    torch.testing.assert_close(last, 0.25 * first)


@pytest.mark.slow  # a stopped training and its resume; exact resume itself is shown fast in test_train
def test_a_guided_run_keeps_its_adapters_and_resumes_as_an_uninterrupted_one(
    photos, uninterrupted, tmp_path, monkeypatch
):
    """With the linear schedule: the resumed epoch trains at its own weight (0.5), as the whole run's did."""
    whole_run, whole = uninterrupted
    state = load_checkpoint(whole_run / "checkpoint.pt")
    assert set(state["guidance"]) == {f"{k}.{p}" for k in range(3) for p in ("weight", "bias")}
    assert not any(k.startswith("adapters") for k in state["model"])  # the model file holds the ViT alone
    assert (whole_run / "teacher.pt").is_file()
    assert "locality guidance, weight 1, falling linearly towards 0" in (whole_run / "report.md").read_text()
    import foodvit.training.stages as S  # the teacher's fit runs there
    import foodvit.training.trainer as T

    real, calls = T.fit, {"n": 0}

    def stop_after_one_student_epoch(model, *args, **kwargs):
        calls["n"] += 1
        return real(
            model, *args, **({**kwargs, "epochs": 1} if calls["n"] == 2 else kwargs)
        )  # the teacher's fit is the first

    for module in (T, S):
        monkeypatch.setattr(module, "fit", stop_after_one_student_epoch)
    out = tmp_path / "stopped"
    train(guided(photos, 2, "linear"), out, quiet=True)
    for module in (T, S):
        monkeypatch.setattr(module, "fit", real)
    resumed = resume(out, quiet=True)
    assert resumed.history[-1]["train_loss"] == pytest.approx(whole.history[-1]["train_loss"], rel=1e-5)
    assert resumed.test["acc"] == pytest.approx(whole.test["acc"])


def test_a_four_stage_guided_run_trains_four_adapters_and_says_so(photos, tmp_path):
    config = guided(photos, 1)
    config = replace(config, vit=replace(config.vit, pool="gap"), guidance=replace(config.guidance, stages=4))
    train(config, tmp_path / "run", quiet=True)
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert set(state["guidance"]) == {f"{k}.{p}" for k in range(4) for p in ("weight", "bias")}
    assert state["guidance"]["3.weight"].shape[0] == 512  # layer4's width
    report = (tmp_path / "run" / "report.md").read_text()
    assert (
        "its four stages' feature maps, the last against the ViT's last block (locality guidance, weight 1)" in report
    )


def test_a_guided_runs_teacher_is_the_network_distillation_trains(photos, tmp_path):
    """bench/accuracy/curve.py takes a guided study's teacher.pt as its ResNet-18 point: the network a guided
    run saves is, weight for weight, the one distillation (and so the curve's CNN) trains alone."""
    from foodvit.rundir.directory import TEACHER_FILE
    from foodvit.training.trainer import Trainer

    config = guided(photos, 1)
    train(config, tmp_path / "guided", quiet=True)
    saved = load_checkpoint(tmp_path / "guided" / TEACHER_FILE)
    assert len(saved["history"]) == 1  # trained for its epoch
    (tmp_path / "alone").mkdir()
    distilled = replace(
        config,
        guidance=replace(config.guidance, weight=0.0, stages=3, schedule="constant"),
        distill=replace(config.distill, weight=1.0),
    )
    alone = Trainer(distilled, tmp_path / "alone", quiet=True, log=lambda *a, **k: None).teacher().module.state_dict()
    assert saved["model"].keys() == alone.keys()
    for key in alone:
        torch.testing.assert_close(saved["model"][key], alone[key], rtol=0, atol=0)


def test_a_run_started_up_to_its_first_epoch_resumes_to_the_whole_runs_model(photos, uninterrupted, tmp_path):
    """foodvit cv --jobs trains a fold's teacher as a task of its own (train_stages), then the fold's task resumes
    the run: the same teacher, the same model, to the bit."""
    import foodvit
    from foodvit.training.run import train_stages

    whole_run, whole = uninterrupted
    train_stages(guided(photos, 2, "linear"), tmp_path / "staged")
    staged = load_checkpoint(tmp_path / "staged" / "checkpoint.pt")
    assert staged["epoch"] == 0 and not (tmp_path / "staged" / "model.safetensors").exists()
    resumed = resume(tmp_path / "staged", quiet=True)
    timing = ("seconds", "images_per_s", "model_share")
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed.history] == [
        {k: v for k, v in r.items() if k not in timing} for r in whole.history
    ]
    teachers = [load_checkpoint(run / "teacher.pt")["model"] for run in (whole_run, tmp_path / "staged")]
    assert all(torch.equal(teachers[0][k], teachers[1][k]) for k in teachers[0])
    models = [foodvit.load_model(run).state_dict() for run in (whole_run, tmp_path / "staged")]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
