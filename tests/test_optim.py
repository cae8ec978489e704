"""Weight-decay groups of the optimiser a real Trainer builds: found by identity through the
localization loss's wrapper, with a frozen backbone and with EMA."""

from dataclasses import replace

import pytest
import torch
from helpers import make_photo_folder

from foodvit.recipes import load_recipe
from foodvit.settings.model import VitSettings
from foodvit.training.optim import param_groups
from foodvit.training.trainer import Trainer


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=4, n_test=2)


def trainer_for(photos, tmp_path, **changes):
    """A Trainer of a tiny learned-position, class-token ViT, with optimiser and train changes."""
    config = load_recipe("tiny")
    config = replace(
        config,
        vit=VitSettings(image_size=32, depth=1, pos_embed="learned", pool="cls"),
        data=replace(config.data, source=str(photos)),
        optim=replace(config.optim, **{k: v for k, v in changes.items() if k == "ema"}),
        drloc=replace(config.drloc, weight=changes.get("drloc", 0.0)),
        train=replace(config.train, **{k: v for k, v in changes.items() if k == "freeze_backbone"}),
    )
    return Trainer(config, tmp_path, quiet=True)


def decay_of(trainer) -> dict[str, float]:
    """name in the ViT -> the weight decay its optimiser group applies (absent: not optimised)."""
    group_of = {id(p): g["weight_decay"] for g in trainer.optimizer.param_groups for p in g["params"]}
    return {name: group_of[id(p)] for name, p in trainer.model.named_parameters() if id(p) in group_of}


@pytest.mark.parametrize("changes", [{}, {"drloc": 0.5}, {"ema": 0.9}, {"drloc": 0.5, "ema": 0.9}])
def test_class_token_and_position_embedding_are_never_decayed(photos, tmp_path, changes):
    trainer = trainer_for(photos, tmp_path, **changes)
    decay = decay_of(trainer)
    assert decay["cls_token"] == 0.0 and decay["pos_embed"] == 0.0  # the wrapper let them be decayed before
    assert decay["blocks.0.attn.qkv.bias"] == 0.0 and decay["norm.weight"] == 0.0
    assert decay["blocks.0.attn.qkv.weight"] == decay["head.weight"] == trainer.config.optim.weight_decay > 0
    if changes.get("drloc"):  # the auxiliary head is optimised too, its matrices decayed
        aux = {id(p) for p in trainer.trained.objectives[0].part.parameters()}
        groups = {id(p): g["weight_decay"] for g in trainer.optimizer.param_groups for p in g["params"]}
        assert aux <= set(groups) and sorted({groups[i] for i in aux}) == [0.0, trainer.config.optim.weight_decay]


def test_frozen_backbone_optimises_the_head_alone(photos, tmp_path):
    trainer = trainer_for(photos, tmp_path, freeze_backbone=True, drloc=0.5)
    assert set(decay_of(trainer)) == {"head.weight", "head.bias"}
    assert (
        not len(trainer.objectives.objectives) and trainer.trained.model is trainer.model
    )  # no localization loss for a backbone it cannot train


def test_decay_groups_are_found_through_any_wrapper():
    from foodvit import create_model

    vit = create_model("ViT-Ti/8", image_size=16, num_classes=3, depth=1)
    wrapper = torch.nn.Sequential(torch.nn.Identity(), torch.nn.ModuleDict({"inner": vit}))
    direct = [[id(p) for p in g["params"]] for g in param_groups(vit, 0.1)]
    wrapped = [[id(p) for p in g["params"]] for g in param_groups(wrapper, 0.1)]
    assert wrapped == direct


def test_a_warmup_longer_than_the_training_is_said_with_how_far_the_rate_gets(caplog):
    from foodvit.settings.run import OptimConfig
    from foodvit.training.optim import build_scheduler

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    with caplog.at_level("WARNING", logger="foodvit"):
        build_scheduler(optimizer, OptimConfig(warmup_epochs=8, schedule="cosine"), steps_per_epoch=4, epochs=2)
    assert (
        "the warm-up (8 epochs) is longer than the training (2 epochs): the learning rate rises to 0.25 of --lr"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="foodvit"):
        build_scheduler(optimizer, OptimConfig(warmup_epochs=2, schedule="cosine"), steps_per_epoch=4, epochs=2)
    assert caplog.text == ""  # a warm-up as long as the training reaches its peak at the end: said nothing


def test_a_warmup_of_1e308_epochs_is_said_and_the_rate_stays_near_0(caplog):
    # its steps overflowed: int(round(inf)), an OverflowError's traceback
    from foodvit.settings.run import OptimConfig
    from foodvit.training.optim import build_scheduler

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    with caplog.at_level("WARNING", logger="foodvit"):
        scheduler = build_scheduler(optimizer, OptimConfig(warmup_epochs=1e308), steps_per_epoch=4, epochs=2)
    assert "the warm-up (1e+308 epochs) is longer than the training (2 epochs)" in caplog.text
    for _ in range(8):
        optimizer.step()
        scheduler.step()
    assert 0 < optimizer.param_groups[0]["lr"] < 1e-15
