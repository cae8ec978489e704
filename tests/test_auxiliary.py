"""The auxiliary losses stacked as a run wires them (training/auxiliary.py): every combination
trains, each term adds to the others, their parts go to the checkpoint and come back."""

import itertools

import pytest
import torch

from foodvit.config import OptimConfig
from foodvit.model.variants import create_model
from foodvit.training import auxiliary
from foodvit.training.distill import build_teacher

LOSSES = {"drloc": 0.5, "masked": 1.0, "guidance": 1.0, "distill": 1.0, "contrast": 0.5}


@pytest.fixture(scope="module")
def teacher():
    """One ResNet-18 for every combination that needs one: a frozen teacher is only read."""
    torch.manual_seed(0)
    return build_teacher("resnet18", 3)


@pytest.mark.parametrize("on", [c for n in range(1, len(LOSSES) + 1) for c in itertools.combinations(LOSSES, n)], ids="+".join)
def test_every_combination_trains_and_keeps_its_parts(on, teacher):
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, embed_dim=48, num_heads=3, mlp_dim=96, pool="gap",
                       pos_embed="sincos2d")
    aux = auxiliary.wrap(vit, OptimConfig(**{name: LOSSES[name] for name in on}), num_classes=3)
    assert aux.need_teacher == ("guidance" in on or "distill" in on)
    if aux.need_teacher:
        aux.set_teacher(teacher)
    images = torch.randn(4, 3, 32, 32)

    def total() -> torch.Tensor:
        torch.manual_seed(7)  # the same token pairs and hidden patches each time
        return aux.trained.train()(images)[1].detach()

    whole, terms = total(), []
    for wrapper in (aux.localization, aux.masked, aux.guide, aux.distiller, aux.contrast):
        if wrapper is not None:  # each loss's own term: what doubling its weight adds
            wrapper.weight *= 2
            terms.append(total() - whole)
            wrapper.weight /= 2
    assert len(terms) == len(on) and all(t > 0 for t in terms)  # every term reaches the total...
    torch.testing.assert_close(sum(terms), whole)  # ...and the total is their sum
    logits, extra = aux.trained.train()(images)
    assert logits.shape == (4, 3) and torch.isfinite(extra) and extra.item() > 0
    extra.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in vit.parameters())  # the ViT learns from it
    state = aux.state_dict()
    assert {key for key, part in state.items() if part is not None} == {k for k, n in (("auxiliary", "drloc"), ("masked", "masked"),
                                                                                       ("guidance", "guidance"), ("contrast", "contrast")) if n in on}
    torch.manual_seed(1)
    again = auxiliary.wrap(create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, embed_dim=48, num_heads=3, mlp_dim=96,
                                        pool="gap", pos_embed="sincos2d"), OptimConfig(**{name: LOSSES[name] for name in on}), num_classes=3)
    again.load_state_dict(state)
    for key, part in again.state_dict().items():
        if part is not None:
            assert all(torch.equal(part[name], state[key][name]) for name in part)
    aux.trained.eval()
    torch.testing.assert_close(aux.trained(images), vit(images), rtol=0, atol=0)  # prediction: the ViT alone


def test_a_frozen_backbone_gets_no_auxiliary_loss():
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2)
    aux = auxiliary.wrap(vit, OptimConfig(**LOSSES), num_classes=3, frozen=True)
    assert aux.trained is vit and not aux.need_teacher and all(v is None for v in aux.state_dict().values())


def test_the_distillation_temperature_reaches_the_loss(teacher):
    torch.manual_seed(0)
    vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=1)
    images = torch.randn(4, 3, 32, 32)
    terms = {}
    for t in (0.0, 3.0):
        aux = auxiliary.wrap(vit, OptimConfig(distill=1.0, distill_temperature=t), num_classes=3)
        aux.set_teacher(teacher)
        assert aux.distiller.temperature == t
        terms[t] = aux.trained.train()(images)[1]
    logits = vit.train()(images)
    taught = torch.softmax(teacher(images).detach() / 3, dim=1)
    by_hand = 9 * (taught * (taught.log() - torch.log_softmax(logits / 3, dim=1))).sum(dim=1).mean()
    torch.testing.assert_close(terms[3.0], by_hand, rtol=1e-5, atol=1e-6)  # soft at 3, as --distill-temperature 3 says
    torch.testing.assert_close(terms[0.0], torch.nn.functional.cross_entropy(logits, teacher(images).argmax(1)), rtol=1e-5, atol=1e-6)
