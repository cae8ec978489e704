"""The training objectives as a run composes them (training/objectives): every combination trains,
each adds its own term and no other's, the order they are given in changes nothing, their parts go
to the checkpoint and come back, and a new objective is its class and one registry entry."""

import itertools
from dataclasses import fields, replace

import pytest
import torch
from helpers import make_photo_folder
from test_train import small_config
from torch import nn

from foodvit.model.variants import create_model
from foodvit.rundir.directory import load_checkpoint
from foodvit.settings.objectives import OBJECTIVES, STUDENT_SETTINGS, ObjectiveSettings
from foodvit.settings.overrides import with_settings
from foodvit.settings.run import RunConfig
from foodvit.training import objectives
from foodvit.training.objectives import REGISTRY, checkpoint_keys
from foodvit.training.objectives.base import Objective
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.teacher import Teacher, build_teacher

WEIGHTS = {"drloc": 0.5, "masked": 1.0, "guidance": 1.0, "distill": 1.0, "contrast": 0.5}


def weights(on) -> RunConfig:
    """Settings with the objectives `on` at their weights in WEIGHTS."""
    return with_settings(RunConfig(), {f"{name}.weight": WEIGHTS[name] for name in on})


KEYS = {"drloc": "auxiliary", "masked": "masked", "guidance": "guidance", "contrast": "contrast"}


@pytest.fixture(scope="module")
def teacher():
    """One ResNet-18 for every combination that needs one: a frozen teacher is only read."""
    torch.manual_seed(0)
    return Teacher(build_teacher("resnet18", 3))


def small_vit(seed: int = 0):
    torch.manual_seed(seed)
    return create_model(
        "ViT-Ti/8",
        num_classes=3,
        image_size=32,
        depth=2,
        embed_dim=48,
        num_heads=3,
        mlp_dim=96,
        pool="gap",
        pos_embed="sincos2d",
    )


def test_the_registry_is_the_settings_table_each_name_its_modules_objective():
    assert list(REGISTRY) == [o.name for o in OBJECTIVES] == [f.name for f in fields(RunConfig)][5:10]
    assert all(
        REGISTRY[o.name].settings is o and REGISTRY[o.name].__module__.endswith(f".{o.name}") for o in OBJECTIVES
    )
    assert {o.name for o in OBJECTIVES} <= set(STUDENT_SETTINGS)  # every objective's section shapes the ViT alone
    assert checkpoint_keys() == ("auxiliary", "masked", "guidance", "contrast")  # what checkpoint.pt has always held


# each objective alone, every pair and all of them together: composing adds the objectives' terms over one shared
# forward pass, so what two objectives could do to each other (read the same tokens, prepare the same batch) shows
# in their pair, and all five together is the largest case; the 15 threes and fours would take this path again
@pytest.mark.parametrize(
    "on",
    [c for n in (1, 2, len(WEIGHTS)) for c in itertools.combinations(WEIGHTS, n)],
    ids="+".join,
)
def test_each_objective_every_pair_and_all_together_train_and_keep_their_parts(on, teacher):
    vit = small_vit()
    composed = objectives.build(vit, weights(on), num_classes=3)
    assert composed.needs_teacher == ("guidance" in on or "distill" in on)
    composed.set_teacher(teacher)
    images = torch.randn(4, 3, 32, 32)

    def total() -> torch.Tensor:
        torch.manual_seed(7)  # the same token pairs, hidden patches and second views each time
        return composed.train()(images)[1].detach()

    whole, terms = total(), []
    for objective in composed.objectives:  # each one's own term: what doubling its weight adds
        objective.weight *= 2
        terms.append(total() - whole)
        objective.weight /= 2
    assert len(terms) == len(on) and all(t > 0 for t in terms)  # every term reaches the total...
    torch.testing.assert_close(sum(terms), whole)  # ...and the total is their sum
    logits, extra = composed.train()(images)
    assert logits.shape == (4, 3) and torch.isfinite(extra) and extra.item() > 0
    extra.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in vit.parameters())  # the ViT learns from it
    state = composed.state_dict_of_parts(checkpoint_keys())
    assert {key for key, part in state.items() if part is not None} == {KEYS[name] for name in on if name in KEYS}
    again = objectives.build(small_vit(1), weights(on), num_classes=3)
    again.load_parts(state)
    for key, part in again.state_dict_of_parts(checkpoint_keys()).items():
        if part is not None:
            assert all(torch.equal(part[name], state[key][name]) for name in part)


def test_the_order_of_composition_changes_no_term_and_no_total(teacher):
    vit = small_vit()
    built = objectives.build(vit, weights(WEIGHTS), num_classes=3).objectives
    images = torch.randn(4, 3, 32, 32)
    results = []
    for order in (list(built), list(reversed(built)), [built[2], built[4], built[0], built[3], built[1]]):
        composed = WithObjectives(vit, order, order=REGISTRY.values(), teacher=teacher).train()
        torch.manual_seed(3)
        _, terms = composed.terms(images)
        torch.manual_seed(3)
        results.append((composed(images)[1], terms))
    for total, terms in results[1:]:
        assert torch.equal(total, results[0][0])  # bit for bit
        assert terms.keys() == results[0][1].keys() and all(torch.equal(terms[k], results[0][1][k]) for k in terms)
    assert list(results[0][1]) == list(WEIGHTS)  # each objective's own term, by name


def test_a_frozen_backbone_gets_no_objective():
    vit = small_vit()
    composed = objectives.build(vit, weights(WEIGHTS), num_classes=3, frozen=True)
    assert not len(composed.objectives) and not composed.needs_teacher
    assert all(v is None for v in composed.state_dict_of_parts(checkpoint_keys()).values())


def test_the_distillation_temperature_reaches_the_loss(teacher):
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    images = torch.randn(4, 3, 32, 32)
    terms = {}
    for t in (0.0, 3.0):
        composed = objectives.build(
            vit, with_settings(RunConfig(), {"distill.weight": 1.0, "distill.temperature": t}), num_classes=3
        )
        composed.set_teacher(teacher)
        assert composed.objectives[0].temperature == t
        terms[t] = composed.train()(images)[1]
    logits = vit.train()(images)
    taught = torch.softmax(teacher.logits(images) / 3, dim=1)
    by_hand = 9 * (taught * (taught.log() - torch.log_softmax(logits / 3, dim=1))).sum(dim=1).mean()
    torch.testing.assert_close(terms[3.0], by_hand, rtol=1e-5, atol=1e-6)  # soft at 3, as --distill-temperature 3 says
    torch.testing.assert_close(
        terms[0.0], torch.nn.functional.cross_entropy(logits, teacher.logits(images).argmax(1)), rtol=1e-5, atol=1e-6
    )


class Toy(Objective):
    """A new objective, as a contributor would add one: the pooled state's squared length, through a part of its own."""

    settings = ObjectiveSettings("toy", "toy objective", object)
    checkpoint_key = "toy"

    def __init__(self, embed_dim: int) -> None:
        super().__init__(0.5)
        self.scale = nn.Linear(embed_dim, 1)

    @classmethod
    def enabled(cls, config: RunConfig) -> bool:
        return True

    @classmethod
    def build(cls, model, config, num_classes):
        return cls(model.config.embed_dim)

    @property
    def part(self) -> nn.Module:
        return self.scale

    def loss(self, batch, outputs) -> torch.Tensor:
        return self.scale(outputs.heads.pooled).pow(2).mean()


def test_a_new_objective_is_its_class_and_one_registry_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(objectives, "REGISTRY", {**REGISTRY, "toy": Toy})
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    config = small_config(photos, epochs=1, batch_size=8)
    config = replace(config, vit=replace(config.vit, pool="gap"), drloc=replace(config.drloc, weight=0.5))
    from foodvit.training.run import train

    result = train(config, tmp_path / "run", quiet=True)
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert set(state["toy"]) == {"weight", "bias"} and state["auxiliary"] is not None  # its part beside drloc's
    assert result.history[0]["train_objective"] > result.history[0]["train_loss"]
    assert not any(k.startswith("scale") for k in state["model"])  # the saved model is the ViT alone
