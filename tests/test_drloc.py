"""Dense relative localization (Liu et al. 2021): offsets, the head, the wrapper, the engine's
auxiliary loss."""

import pytest
import torch
from torch import nn

from foodvit.model.variants import create_model
from foodvit.training.engine import Output, train_one_epoch
from foodvit.training.objectives.compose import WithObjectives
from foodvit.training.objectives.drloc import DenseRelativeLocalization, Localization, pair_offsets


def test_pair_offsets_are_row_and_column_differences_over_the_grid():
    # grid 4: flat 5 = (row 1, col 1), 14 = (row 3, col 2), 3 = (row 0, col 3)
    first, second = torch.tensor([5, 14, 3]), torch.tensor([14, 5, 3])
    expected = torch.tensor([[-2, -1], [2, 1], [0, 0]]) / 4
    torch.testing.assert_close(pair_offsets(first, second, 4), expected)


def test_head_learns_offsets_from_tokens_that_know_their_place():
    torch.manual_seed(0)
    grid, D = 4, 16
    places = torch.randn(grid * grid, D)  # every position a distinct token
    head = DenseRelativeLocalization(D, pairs=32, hidden=64)
    tokens = places.expand(8, -1, -1)  # (B, N, D)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    first = head(tokens).item()
    for _ in range(300):
        loss = head(tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # predicting offset 0 everywhere costs E|offset| = 1.25 / 4 = 0.31 a coordinate on a 4 x 4 grid
    with torch.no_grad():
        final = sum(head(tokens).item() for _ in range(5)) / 5
    assert final < 0.05 and first > 0.2


def test_head_refuses_a_token_count_off_a_square_grid():
    head = DenseRelativeLocalization(8)
    with pytest.raises(ValueError, match="a square grid of patch tokens, got 15"):
        head(torch.zeros(2, 15, 8))


def test_head_reads_the_grid_of_each_batch(monkeypatch):
    """Progressive resizing trains at a smaller grid first: the offsets are those of the batch's grid."""
    import foodvit.training.objectives.drloc

    grids = []
    monkeypatch.setattr(
        foodvit.training.objectives.drloc,
        "pair_offsets",
        lambda a, b, grid: (grids.append(grid), pair_offsets(a, b, grid))[1],
    )
    head = DenseRelativeLocalization(4, pairs=16, hidden=8)
    for grid in (3, 5):
        assert torch.isfinite(head(torch.randn(2, grid * grid, 4)))
    assert grids == [3, 5]


def test_wrapper_gives_the_vits_logits_and_trains_both():
    torch.manual_seed(0)
    for pool, class_token in (("gap", False), ("cls", True)):
        vit = create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, pool=pool, class_token=class_token)
        objective = Localization(vit.config.embed_dim, weight=0.5, pairs=8)
        wrapped = WithObjectives(vit, [objective])
        images = torch.randn(2, 3, 32, 32)
        wrapped.eval()  # one type in either mode: the step's Output (a prediction is the ViT's own)
        torch.testing.assert_close(wrapped(images).logits, vit.eval()(images), rtol=1e-5, atol=1e-5)
        wrapped.train()
        logits, extra = wrapped(images)
        torch.testing.assert_close(logits, vit(images), rtol=1e-5, atol=1e-5)  # no dropout in this config
        assert extra.ndim == 0 and extra.item() > 0
        extra.backward()
        assert vit.patch_embed.proj.weight.grad.abs().sum() > 0  # the task reaches the tokeniser
        assert all(p.grad is not None for p in objective.drloc.parameters())


class Tupled(nn.Module):
    """A module that returns the engine's Output: logits and an auxiliary loss, like the wrapper."""

    def __init__(self, extra: float):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.extra = extra

    def forward(self, x):
        logits = torch.zeros(x.shape[0], 2)
        return Output(logits, self.extra * self.w.sum())


def test_engine_adds_the_auxiliary_loss_to_the_gradient_but_reports_cross_entropy():
    model = Tupled(extra=2.0)
    model.w.data.fill_(0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [(torch.zeros(4, 1), torch.tensor([0, 1, 0, 1]))]
    row = train_one_epoch(model, loader, opt)
    # d(extra)/dw = 2, so one SGD step moves w by -0.1 x 2; the cross-entropy alone is log 2
    torch.testing.assert_close(model.w.detach(), torch.tensor([0.3]))
    assert abs(row["train_loss"] - torch.log(torch.tensor(2.0)).item()) < 1e-6
    # what was minimised includes the auxiliary term: log 2 + 2 x w, with w = 0.5 when it was computed
    assert abs(row["train_objective"] - (torch.log(torch.tensor(2.0)).item() + 1.0)) < 1e-6
