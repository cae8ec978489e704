"""The training loop's mechanics, on toy models: per-image metrics, schedules, decay groups,
accumulation, clipping, NaN handling, EMA."""

import math

import pytest
import torch
from torch import nn

from foodvit.settings.run import OptimConfig
from foodvit.training import engine
from foodvit.training.engine import Classifier, StepSettings, TrainingDiverged, evaluate, fit, train_one_epoch
from foodvit.training.optim import build_ema, build_optimizer, lr_factor, param_groups


class Fixed(nn.Module):
    """Predicts class 0 for inputs > 0, else class 1 (plus a trainable bias so optimisers run)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        x = x.flatten(1)[:, :1]
        return torch.cat([x, -x], dim=1) * 10 + self.bias


def test_accuracy_is_per_image_with_unequal_batches():
    # batch 1: 3 photos, all right; batch 2: 1 photo, wrong.
    # Per image: 3/4 = 0.75. The course's mean of batch means would say (1.0 + 0.0) / 2 = 0.5.
    loader = [
        (torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([0, 0, 0])),
        (torch.tensor([[1.0]]), torch.tensor([1])),
    ]
    result = evaluate(Fixed(), loader)
    assert result["acc"] == 0.75 and result["n"] == 4
    assert result["confusion"].tolist() == [[3, 0], [1, 0]]
    model = Fixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    assert train_one_epoch(Classifier(model), loader, opt)["train_acc"] == 0.75
    # loss is the mean over photos, not over batches
    per_photo = torch.nn.functional.cross_entropy(
        Fixed()(torch.tensor([[1.0], [2.0], [3.0], [1.0]])), torch.tensor([0, 0, 0, 1])
    )
    assert result["loss"] == pytest.approx(per_photo.item(), rel=1e-6)


def test_warmup_then_cosine_and_linear():
    assert lr_factor(0, 100, 10, "cosine") == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, "cosine") == pytest.approx(1.0)
    assert lr_factor(10, 100, 10, "cosine") == pytest.approx(1.0)
    assert lr_factor(55, 100, 10, "cosine") == pytest.approx(0.5)
    assert lr_factor(100, 100, 10, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(55, 100, 10, "linear") == pytest.approx(0.5)
    assert lr_factor(70, 100, 0, "constant") == 1.0


def test_no_weight_decay_on_biases_norms_class_token_and_position_embedding():
    from foodvit import create_model

    model = create_model("ViT-Ti/8", image_size=16, num_classes=3, depth=1)
    groups = param_groups(model, 0.05)
    decayed = {id(p) for p in groups[0]["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in decayed}
    assert "blocks.0.attn.qkv.weight" in names and "head.weight" in names
    assert not names & {"cls_token", "pos_embed", "blocks.0.attn.qkv.bias", "blocks.0.norm1.weight", "norm.bias"}
    assert groups[1]["weight_decay"] == 0.0
    everything = param_groups(model, 0.3, decay_all=True)
    assert len(everything) == 1 and len(everything[0]["params"]) == len(list(model.parameters()))


def test_gradient_accumulation_equals_one_big_batch():
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    base = nn.Linear(5, 3)
    results = []
    for batches, accum in (([(x, y)], 1), ([(x[:4], y[:4]), (x[4:], y[4:])], 2)):
        model = nn.Linear(5, 3)
        model.load_state_dict(base.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        train_one_epoch(Classifier(model), batches, opt, settings=StepSettings(accum_steps=accum))
        results.append(model.weight.detach().clone())
    torch.testing.assert_close(results[0], results[1])


def test_gradient_clipping_bounds_the_update():
    model = nn.Linear(4, 2)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = [(torch.randn(16, 4) * 100, torch.randint(0, 2, (16,)))]
    train_one_epoch(Classifier(model), batch, opt, settings=StepSettings(clip_grad=0.01))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (after - before).norm().item() == pytest.approx(0.01, rel=1e-3)


def test_sharpness_aware_minimisation_steps_with_the_gradient_at_the_worst_nearby_weights():
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    base = nn.Linear(5, 3)
    w = [p.detach().clone() for p in base.parameters()]

    def gradient(weights):  # the batch's mean cross-entropy at these weights, by hand
        weights = [t.clone().requires_grad_() for t in weights]
        nn.functional.cross_entropy(x @ weights[0].T + weights[1], y).backward()
        return [t.grad for t in weights]

    rho, lr = 0.3, 0.5
    g = gradient(w)
    norm = torch.sqrt(sum((t**2).sum() for t in g))
    worst = gradient([t + rho * d / norm for t, d in zip(w, g, strict=True)])
    expected = [t - lr * d for t, d in zip(w, worst, strict=True)]
    for batches, accum in (([(x, y)], 1), ([(x[:4], y[:4]), (x[4:], y[4:])], 2)):
        model = nn.Linear(5, 3)
        model.load_state_dict(base.state_dict())
        row = train_one_epoch(
            Classifier(model),
            batches,
            torch.optim.SGD(model.parameters(), lr=lr),
            settings=StepSettings(accum_steps=accum, sam=rho),
        )
        for got, want in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(got.detach(), want)
        # the step's loss is the first pass's, at w
        assert row["train_loss"] == pytest.approx(nn.functional.cross_entropy(x @ w[0].T + w[1], y).item(), rel=1e-6)
    # not the plain step: the worst point's gradient differs from the gradient at w
    assert not torch.allclose(expected[0], w[0] - lr * g[0], atol=1e-4)


def test_sharpness_aware_minimisation_updates_batch_norm_statistics_once_a_step():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    batch = [(torch.randn(16, 4) * 3 + 1, torch.randint(0, 2, (16,)))]
    stats = []
    for rho in (0.0, 0.5):
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
        model.load_state_dict(base.state_dict())
        train_one_epoch(
            Classifier(model), batch, torch.optim.SGD(model.parameters(), lr=0.1), settings=StepSettings(sam=rho)
        )
        stats.append(
            [model[1].running_mean.clone(), model[1].running_var.clone(), model[1].num_batches_tracked.clone()]
        )
    # the statistics come from the first pass, at the same weights: as without SAM, one batch counted
    for without, with_sam in zip(*stats, strict=True):
        torch.testing.assert_close(without, with_sam)
    assert stats[1][2].item() == 1 and not torch.equal(stats[1][0], torch.zeros(6))


def test_nan_loss_stops_training_with_a_clear_error():
    class Poison(Fixed):
        def forward(self, x):
            return super().forward(x) * float("nan")

    model = Poison()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TrainingDiverged, match="the loss became nan at step 1"):
        train_one_epoch(Classifier(model), [(torch.ones(2, 1), torch.tensor([0, 1]))], opt)


def test_weights_overflowed_by_the_last_step_stop_training_with_a_clear_error():
    # the loss is finite at every step (it is checked before the step): the last step's update overflows
    model = nn.Linear(1, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e30)
    with pytest.raises(TrainingDiverged, match="the weights became NaN or infinite at step 1 of 1"):
        train_one_epoch(Classifier(model), [(torch.full((2, 1), 1e30), torch.tensor([0, 1]))], opt)


def test_ema_update_rule():
    model = nn.Linear(3, 1, bias=False)
    ema = build_ema(model, decay=0.9)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update_parameters(model)  # the first update copies
    torch.testing.assert_close(ema.module.weight, torch.ones(1, 3))
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update_parameters(model)  # then ema = 0.9 ema + 0.1 w
    torch.testing.assert_close(ema.module.weight, torch.full((1, 3), 0.9 * 1.0 + 0.1 * 3.0))
    assert build_ema(model, 0.0) is None


def test_optimizers_from_config():
    model = nn.Linear(3, 2)
    cpu = torch.device("cpu")
    assert isinstance(build_optimizer(model, OptimConfig(optimizer="adam"), cpu), torch.optim.Adam)
    assert isinstance(build_optimizer(model, OptimConfig(optimizer="adamw"), cpu), torch.optim.AdamW)
    sgd = build_optimizer(model, OptimConfig(optimizer="sgd", momentum=0.9), cpu)
    assert sgd.defaults["momentum"] == 0.9
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, OptimConfig(), cpu)


def test_fit_reports_each_split_per_epoch_and_soft_targets_train():
    torch.manual_seed(0)
    x = torch.randn(12, 4)
    y = (x[:, 0] > 0).long()
    soft = torch.nn.functional.one_hot(y, 2).float() * 0.9 + 0.05  # mixup-like targets
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    history = fit(
        Classifier(model),
        [(x, soft)],
        {"val": [(x, y)], "test": [(x, y)]},
        opt,
        epochs=3,
        show_progress=False,
        eval_model=lambda: model,
    )
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert {"train_loss", "train_acc", "val_loss", "val_acc", "test_loss", "test_acc", "lr", "seconds"} <= set(
        history[0]
    )
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert all(math.isfinite(row["test_loss"]) for row in history)


def test_train_loss_is_plain_cross_entropy_and_the_objective_is_what_was_minimised():
    # label smoothing 0.2 and soft (mixed) targets: the objective is the smoothed, mixed loss; the
    # train loss is the plain cross-entropy against each photo's dominant class, as val/test report
    model = Fixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    images = torch.tensor([[0.3], [-0.1], [0.05]])
    soft = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.4, 0.6]])
    row = train_one_epoch(Classifier(model), [(images, soft)], opt, settings=StepSettings(label_smoothing=0.2))
    logits = Fixed()(images)
    plain = nn.functional.cross_entropy(logits, soft.argmax(1)).item()
    objective = nn.functional.cross_entropy(logits, soft, label_smoothing=0.2).item()
    assert row["train_loss"] == pytest.approx(plain, rel=1e-6)
    assert row["train_objective"] == pytest.approx(objective, rel=1e-6)
    assert abs(row["train_loss"] - row["train_objective"]) > 0.05  # really two different numbers


class DtypeSeen(nn.Module):
    """A linear classifier that records the dtype its matrix product computed in, at each call."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.seen: list[torch.dtype] = []

    def forward(self, x):
        out = self.linear(x)
        self.seen.append(out.dtype)
        return out


@pytest.mark.parametrize("native", [True, False])
def test_bf16_autocast_trains_on_a_cpu_with_native_bf16_and_evaluates_in_float32(monkeypatch, native):
    # settings.amp on the CPU: the training steps run under bf16 autocast only where the CPU multiplies bf16 natively
    # (else it would emulate it, slower); evaluation is float32 either way, as prediction and ONNX Runtime are
    monkeypatch.setattr(engine, "cpu_computes_bf16", lambda: native)
    x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    model = DtypeSeen()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = StepSettings(amp=True)
    trained = torch.bfloat16 if native else torch.float32
    train_one_epoch(Classifier(model), [(x, y)], opt, settings=amp)
    evaluate(model, [(x, y)], amp)
    assert model.seen == [trained, torch.float32]
    model.seen.clear()
    # sharpness-aware minimisation's second forward pass, at the worst nearby weights, is a training step's too
    train_one_epoch(Classifier(model), [(x, y)], opt, settings=StepSettings(amp=True, sam=0.05))
    assert model.seen == [trained, trained]
    model.seen.clear()
    train_one_epoch(Classifier(model), [(x, y)], opt, settings=StepSettings(amp=False))
    assert model.seen == [torch.float32]
    assert engine.computes_bf16(amp, training=True) is native
    assert engine.computes_bf16(amp, training=False) is False
    assert engine.computes_bf16(StepSettings(torch.device("cuda"), amp=True), training=False) is True


def test_the_chip_a_run_trains_on_is_named_with_its_family_and_model(monkeypatch):
    """engine.processor: the CPU's model name from the first processor's block of /proc/cpuinfo, with its family and
    model numbers (a virtual machine may name two generations alike), else the platform's word for it."""
    import pathlib
    import platform

    real = pathlib.Path.read_text
    info = {"text": ""}

    def read_text(self, *args, **kwargs):
        if str(self) != "/proc/cpuinfo":
            return real(self, *args, **kwargs)
        if info["text"] is None:
            raise PermissionError("unreadable")
        return info["text"]

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(platform, "processor", lambda: "x86_64-ish")
    cpu = torch.device("cpu")
    info["text"] = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\n"
        "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Another\n"
    )
    assert engine.processor(cpu) == "AMD EPYC (family 25, model 17)"
    info["text"] = "processor\t: 0\nmodel name\t: Apple M2\n"  # no family or model numbers
    assert engine.processor(cpu) == "Apple M2"
    info["text"] = None
    assert engine.processor(cpu) == "x86_64-ish"
