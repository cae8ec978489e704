"""The numbers behind the pictures, and each picture command on a tiny trained run."""

import math
import os

import numpy as np
import pytest
import torch
from helpers import DRAW_FIGURES, assert_drawn_png, make_photo, make_photo_folder, randomize_, report_figures
from PIL import Image

import foodvit
from foodvit.cli.main import main
from foodvit.data.preprocess import make_preprocess
from foodvit.data.sources import resolve
from foodvit.data.transforms import eval_transform
from foodvit.viz.attention import (
    attention_distances_over,
    attention_rollout,
    explain,
    filter_components,
    mean_attention_distance,
    position_similarity,
    rollout_map,
)
from foodvit.viz.plotting import save_figure


def _model(**overrides):
    torch.manual_seed(0)
    return randomize_(foodvit.create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=3, **overrides)).eval()


def test_rollout_rows_are_distributions_and_the_map_fills_the_grid():
    model = _model()
    with torch.no_grad():
        attentions = model.forward_intermediates(torch.randn(2, 3, 32, 32), attention=True, intermediates_only=True)
    rollout = attention_rollout(attentions)
    assert rollout.shape == (2, 17, 17)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 17))
    heat = rollout_map(rollout, 1, 4)
    assert heat.shape == (2, 4, 4)
    torch.testing.assert_close(heat.flatten(1).sum(-1), torch.ones(2))
    gap = _model(class_token=False, pool="gap")
    with torch.no_grad():
        attentions = gap.forward_intermediates(torch.randn(1, 3, 32, 32), attention=True, intermediates_only=True)
    assert rollout_map(attention_rollout(attentions), 0, 4).shape == (1, 4, 4)


def test_rollout_of_identity_attention_is_the_identity():
    eye = torch.eye(5).expand(1, 2, 5, 5)
    torch.testing.assert_close(attention_rollout([eye, eye, eye]), torch.eye(5)[None])


def test_rollout_of_no_layers_is_an_error_not_none():
    with pytest.raises(ValueError, match="at least one layer"):
        attention_rollout([])


def test_position_similarity_is_one_on_the_diagonal_and_symmetric():
    sim = position_similarity(_model().pos_embed, 1)
    assert sim.shape == (16, 16)
    torch.testing.assert_close(sim.diagonal(), torch.ones(16))
    torch.testing.assert_close(sim, sim.T)
    assert sim.abs().max() <= 1 + 1e-6


def test_mean_attention_distance_of_identity_and_uniform_attention():
    # a 2 x 2 grid of 4-px patches: centres (0,0), (0,4), (4,0), (4,4); from any patch the
    # distances are 0, 4, 4 and 4*sqrt(2), so uniform attention averages (8 + 4*sqrt(2)) / 4.
    uniform = torch.full((3, 2, 5, 5), 1 / 5)  # (B, h, T, T) with a class token
    d = mean_attention_distance([uniform, uniform], num_prefix_tokens=1, grid=2, patch_size=4)
    assert d.shape == (2, 2)
    torch.testing.assert_close(d, torch.full((2, 2), (8 + 4 * math.sqrt(2)) / 4))

    model = _model()
    identity = torch.eye(17).expand(2, 3, 17, 17)
    model.forward_intermediates = lambda x, **_: [identity[: len(x)]] * 3  # attention forced to the identity
    distances = attention_distances_over(model, torch.randn(5, 3, 32, 32), batch_size=2)
    assert distances.shape == (3, 3) and torch.count_nonzero(distances) == 0


def test_filter_components_are_orthonormal():
    model = _model()
    components, explained = filter_components(model.patch_embed.proj.weight, 28)
    assert components.shape == (28, 3, 8, 8)
    flat = components.flatten(1)
    torch.testing.assert_close(flat @ flat.T, torch.eye(28), atol=1e-5, rtol=0)
    assert torch.all(explained[:-1] >= explained[1:]) and explained.sum() <= 1


def test_attention_extraction_leaves_the_logits_unchanged():
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens, _ = model.forward_intermediates(x, attention=True)
        torch.testing.assert_close(model.forward_head(tokens), model(x), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    # generated photos even with FOODVIT_DATA set: the pictures need a trained run, not a good one, and
    # the tiny recipe's epoch on FoodVision Mini is test_train's realdata test already
    data = str(make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=6, n_test=4, size=(120, 150)))
    out = tmp_path_factory.mktemp("runs") / "tiny"
    with report_figures():  # most_wrong.png is among the pictures
        assert main(["train", "--recipe", "tiny", "--data", data, "--out", str(out), "--epochs", "1", "--quiet"]) == 0
    photo = sorted((resolve(data) / "test" / "pizza").iterdir())[0]
    return out, photo


def _not_blank(path):
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 20 and len(np.unique(pixels)) > 50, path


@pytest.mark.slow  # every picture command on a trained run; the fast tier keeps inspect's pictures (test_cli) and the
# run's own figures (test_train)
def test_each_picture_command_writes_a_real_png(tiny_run, tmp_path):
    run, photo = tiny_run
    assert main(["patches", str(photo), "--out", str(tmp_path / "patches.png")]) == 0
    assert main(["patches", str(photo), "--feature-maps", str(run), "--out", str(tmp_path / "maps.png")]) == 0
    assert main(["explain", str(run), str(photo), "--heads", "--out", str(tmp_path / "explain.png")]) == 0
    assert main(["inspect", str(run), "--images", "8", "--out", str(tmp_path / "inspect")]) == 0
    for name in (
        "patches.png",
        "maps.png",
        "explain.png",
        "inspect/filters.png",
        "inspect/pos_similarity.png",
        "inspect/attention_distance.png",
    ):
        _not_blank(tmp_path / name)
    _not_blank(run / "most_wrong.png")
    assert "most_wrong.png" in (run / "report.md").read_text()


def test_the_reports_figures_draw_any_history_class_count_and_outcome(tmp_path):
    # the suite's trainings skip them (conftest), so here they are drawn from results of each shape a run
    # can end with: a validation split that starts late, no test row, four classes, nothing or some wrong
    history = [
        {"epoch": 1, "train_loss": 1.3, "train_acc": 0.3, "train_objective": 1.5, "val_loss": None, "val_acc": None},
        {"epoch": 2, "train_loss": 1.1, "train_acc": 0.5, "train_objective": 1.2, "val_loss": 1.2, "val_acc": 0.4},
    ]
    classes = ["pizza", "steak", "sushi", "ramen"]
    photos = [str(make_photo(tmp_path / f"{i}.jpg", (40 * i, 90, 200), size=(50, 60), seed=i)) for i in range(4)]
    test = {"confusion": torch.tensor([[3, 1, 0, 0], [0, 2, 0, 1], [0, 0, 4, 0], [1, 0, 0, 2]])}
    some_wrong = (
        [{"image": p, "label": c, "probability": 0.6} for p, c in zip(photos, classes, strict=True)],
        ["pizza", "sushi", "sushi", "pizza"],
    )
    none_wrong = ([{"image": p, "label": c, "probability": 0.9} for p, c in zip(photos, classes, strict=True)], classes)
    for outcome, (results, truths) in {"some": some_wrong, "none": none_wrong}.items():
        figures = DRAW_FIGURES(history, test, results, truths, classes)
        assert sorted(figures) == ["confusion", "curves", "most_wrong"]
        for name, figure in figures.items():
            assert_drawn_png(save_figure(figure, tmp_path / f"{outcome}-{name}.png"))
    assert len(figures["most_wrong"].axes) == 1  # nothing wrong: a line saying so, not a grid of photos
    assert [t.get_text() for t in figures["confusion"].axes[0].get_yticklabels()] == classes


def test_characters_the_font_lacks_are_named_once_in_the_log_not_warned_each(tmp_path, caplog, recwarn, monkeypatch):
    """A class name in CJK or an emoji: matplotlib warns once per character per figure (noise even under
    --quiet). Under the command line's policy save_figure names the characters in one log line, once a process,
    and shows other warnings as they came; without it matplotlib's own warnings are left alone."""
    import logging
    import warnings

    import matplotlib

    import foodvit.viz.plotting as plotting
    from foodvit.viz.plotting import subplots

    monkeypatch.setattr(plotting, "_told", set())

    def draw(title, name):
        fig, ax = subplots(figsize=(2, 2))
        ax.set_title(title)
        ax.plot([0, 1], [0, 1])
        with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}):  # a font with no CJK, on every machine
            assert_drawn_png(save_figure(fig, tmp_path / name))

    with caplog.at_level(logging.WARNING, logger="foodvit.viz.plotting"):
        draw("寿司 🍣 sushi", "a.png")
        draw("寿司 and 寿", "b.png")  # nothing new to name
        draw("pizza ラ", "c.png")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the figures draw 寿 司 🍣 as empty boxes: matplotlib's font (DejaVu Sans) lacks them")
    assert lines[1].startswith("the figures draw ラ as empty boxes")
    assert not [w for w in recwarn if "missing from font" in str(w.message)]

    fig, ax = subplots(figsize=(2, 2))  # a warning of another kind while drawing still reaches the caller
    ax.plot([0, 1], [0, 1])
    real_savefig = fig.savefig

    def savefig(*args, **kwargs):
        warnings.warn("something else", UserWarning, stacklevel=2)
        real_savefig(*args, **kwargs)

    monkeypatch.setattr(fig, "savefig", savefig)
    with pytest.warns(UserWarning, match="something else"):
        assert_drawn_png(plotting.save_figure(fig, tmp_path / "d.png"))
    # a library caller's process, where the command line set no policy, keeps matplotlib's own warnings
    monkeypatch.setattr(plotting, "_told", None)
    caplog.clear()
    with pytest.warns(UserWarning, match=r"Glyph \d+ .* missing from font"):
        draw("寿司", "e.png")
    assert not caplog.records


def test_a_run_whose_class_names_its_font_lacks_says_so_in_one_line(tmp_path, capsys, recwarn, monkeypatch):
    """`foodvit train --quiet` on classes named in CJK: one line names the characters, and none of matplotlib's
    warnings, one per character and per figure, from laying the figures out as well as from saving them."""
    import matplotlib

    import foodvit.viz.plotting as plotting

    monkeypatch.setattr(plotting, "_told", set())
    data = make_photo_folder(tmp_path / "d", n_train=4, n_test=2, classes=("寿司", "ピザ"))
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}), report_figures():
        argv = ["train", "--recipe", "tiny", "--data", str(data), "--epochs", "1", "--quiet"]
        assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert err.count("as empty boxes") == 1 and "寿 司" in err and "ピ ザ" in err, err
    assert not [w for w in recwarn if "missing from font" in str(w.message)]


def test_patch_grid_errors_name_both_sizes(tmp_path, capsys):
    Image.new("RGB", (50, 40), (1, 2, 3)).save(tmp_path / "p.png")
    assert (
        main(
            [
                "patches",
                str(tmp_path / "p.png"),
                "--image-size",
                "100",
                "--patch-size",
                "16",
                "--out",
                str(tmp_path / "x.png"),
            ]
        )
        == 2
    )
    assert "image size 100 is not a multiple of the patch size 16; use 96 or 112" in capsys.readouterr().err
    out = str(tmp_path / "x.png")
    assert main(["patches", str(tmp_path / "p.png"), "--image-size", "1024", "--patch-size", "2000", "--out", out]) == 2
    assert "--patch-size 2000 is larger than the image (1024 px); give at most 1024" in capsys.readouterr().err
    # a photo that is not there, or a URL, is named as predict names it (not "damaged or truncated?")
    assert main(["patches", str(tmp_path / "gone.png"), "--out", out]) == 2
    assert f"{tmp_path / 'gone.png'} does not exist" in capsys.readouterr().err
    assert main(["patches", "https://example.com/a.jpg", "--out", out]) == 2
    assert "is a URL: URLs are not supported; download the photo first" in capsys.readouterr().err


def test_explain_reads_attention_through_the_models_pooling():
    # a class token kept but not pooled (the default recipe): the picture must show what the pooled
    # patch tokens attend to, not the class token's row
    model = _model(pool="gap")
    preprocess = make_preprocess(32, (0.5,) * 3, (0.5,) * 3)
    predictor = foodvit.Predictor(model, ["a", "b", "c"], preprocess)
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    result = explain(predictor, photo)
    x = eval_transform(preprocess)(photo)[None]
    with torch.no_grad():
        tokens, attentions = model.forward_intermediates(x, attention=True)
        logits = model.forward_head(tokens)
    rollout = attention_rollout(attentions)  # (1, 17, 17), token 0 the class token
    patch_mean = rollout[:, 1:].mean(dim=1)[:, 1:]
    torch.testing.assert_close(result["rollout"], (patch_mean / patch_mean.sum()).reshape(4, 4))
    class_row = rollout[:, 0, 1:] / rollout[:, 0, 1:].sum()
    assert not torch.allclose(result["rollout"], class_row.reshape(4, 4), atol=1e-3)
    assert result["read_by"] == "the mean of the patch tokens"
    last = attentions[-1][0, :, 1:, 1:].mean(dim=1)  # (h, N): each head, averaged over the patch queries
    torch.testing.assert_close(result["heads"], (last / last.sum(-1, keepdim=True)).reshape(-1, 4, 4))
    assert [label for label, _ in result["top_k"]][0] == predictor.classes[logits.argmax().item()]
    cls_model = _model()  # pool='cls': the class token's row, as before
    with torch.no_grad():
        cls_rollout = attention_rollout(cls_model.forward_intermediates(x, attention=True)[1])
    row = cls_rollout[:, 0, 1:]
    torch.testing.assert_close(
        explain(foodvit.Predictor(cls_model, predictor.classes, preprocess), photo)["rollout"],
        (row / row.sum()).reshape(4, 4),
    )


def test_explain_with_the_distillation_token_reads_both_tokens_as_the_prediction_does():
    # prediction averages Eq. 4's head (the class token) and the distillation token's head: the
    # picture must read both rows, not the class token's alone
    model = _model(distill_token=True)
    preprocess = make_preprocess(32, (0.5,) * 3, (0.5,) * 3)
    predictor = foodvit.Predictor(model, ["a", "b", "c"], preprocess)
    photo = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    result = explain(predictor, photo)
    with torch.no_grad():
        _, attentions = model.forward_intermediates(eval_transform(preprocess)(photo)[None], attention=True)
    rollout = attention_rollout(attentions)  # (1, 18, 18): class token, distillation token, 16 patches
    both = (rollout[:, 0, 2:] + rollout[:, 1, 2:]) / 2
    torch.testing.assert_close(result["rollout"], (both / both.sum()).reshape(4, 4))
    class_row = rollout[:, 0, 2:] / rollout[:, 0, 2:].sum()
    assert not torch.allclose(result["rollout"], class_row.reshape(4, 4), atol=1e-3)
    last = (attentions[-1][0, :, 0, 2:] + attentions[-1][0, :, 1, 2:]) / 2  # (h, N)
    torch.testing.assert_close(result["heads"], (last / last.sum(-1, keepdim=True)).reshape(-1, 4, 4))
    assert result["read_by"] == "the class token and the distillation token"


def test_the_numpy_overlay_draws_the_picture_pytorch_and_matplotlib_drew():
    # the demo page draws the overlay without PyTorch or matplotlib (viz/overlay.py): the same picture
    import torch.nn.functional as F
    from matplotlib import colormaps

    from foodvit.viz.figures import overlay_array
    from foodvit.viz.overlay import jet

    x = np.concatenate([np.linspace(0, 1, 20001), [1 / 256, 255 / 256, 0.5]])
    np.testing.assert_allclose(jet(x), colormaps["jet"](x)[..., :3], atol=1e-12)
    rng = np.random.default_rng(0)
    for grid, size in ((4, 32), (8, 64), (14, 224)):
        image = torch.from_numpy(rng.integers(0, 256, (3, size, size), dtype=np.uint8))
        heat = torch.rand(grid, grid, generator=torch.Generator().manual_seed(grid)).double()
        up = F.interpolate(heat[None, None], size=(size, size), mode="bilinear", align_corners=False)[0, 0]
        up = (up - up.min()) / (up.max() - up.min() + 1e-12)
        mixed = 0.55 * image.permute(1, 2, 0).numpy() / 255.0 + 0.45 * colormaps["jet"](up.numpy())[..., :3]
        expected = (np.clip(mixed, 0, 1) * 255).round().astype(np.uint8)  # the torch + matplotlib drawing it replaces
        got = overlay_array(image, heat).astype(int)
        assert np.abs(got - expected).max() <= 1 and (got != expected).mean() < 0.01  # a last-bit rounding, at most


@pytest.mark.parametrize("options", [{"pool": "gap"}, {}, {"pool": "seq"}, {"distill_token": True}])
def test_the_predictors_attention_is_the_rollout_explain_draws(options):
    model = _model(**options)
    predictor = foodvit.Predictor(model, ["a", "b", "c"], make_preprocess(32, (0.5,) * 3, (0.5,) * 3))
    photo = Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 48, 3), dtype=np.uint8))
    assert predictor.has_attention
    got = predictor.attention(photo)
    assert got.shape == (4, 4) and got.sum() == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(got, explain(predictor, photo)["rollout"].numpy(), atol=1e-6)


def test_the_confusion_figure_of_many_classes_stays_a_picture_of_bounded_size():
    # a side of 1.3 inches a class and a text a cell: 101 classes drew a 12,000-pixel figure in 6 GB, and 300 classes
    # had the run killed for memory at its very end, its report never written
    from matplotlib.text import Text

    from foodvit.training.report import WRITTEN_UP_TO, plot_confusion

    few = plot_confusion(torch.eye(3, dtype=torch.long) * 4, ["pizza", "steak", "sushi"])
    many = plot_confusion(torch.eye(300, dtype=torch.long), [f"class {i}" for i in range(300)])
    cells = lambda fig: [t for t in fig.axes[0].findobj(Text) if "%" in t.get_text()]  # noqa: E731
    assert len(cells(few)) == 9 and cells(many) == []
    assert tuple(many.get_size_inches()) == (1.3 * WRITTEN_UP_TO + 2.5, 1.1 * WRITTEN_UP_TO + 2)
    assert len(many.axes[0].get_xticklabels()) == 60


def test_a_class_folder_not_named_in_utf8_is_refused_and_a_file_so_named_is_drawn(tmp_path):
    # training finished, then its report died on matplotlib's TypeError for the name's surrogates
    from helpers import make_photo_folder

    from foodvit.data.folders import class_names
    from foodvit.errors import DataError
    from foodvit.viz.plotting import drawable

    root = make_photo_folder(tmp_path / "photos", n_train=1, n_test=1)
    os.rename(bytes(root / "train" / "steak"), bytes(root / "train") + b"/caf\xe9")
    with pytest.raises(DataError, match=r"caf\\xe9 is named in bytes that are not UTF-8; rename it in UTF-8"):
        class_names(root / "train")
    assert drawable(os.fsdecode(b"caf\xe9.jpg")) == "caf\ufffd.jpg"


def test_a_long_class_name_is_drawn_inside_its_figure(tmp_path):
    # a name of 80 characters ran past its panel and out of the confusion figure and the photo grid
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from foodvit.training.report import plot_confusion
    from foodvit.viz.figures import photo_grid
    from foodvit.viz.plotting import LABEL_WIDTH, drawable

    long = ["a " * 40 + "pizza", "a " * 40 + "steak", "sushi"]
    shown = [drawable(name) for name in long]
    assert all(len(name) == LABEL_WIDTH for name in shown[:2]) and shown[2] == "sushi"
    assert shown[0] != shown[1] and shown[0].endswith("a pizza") and "\u2026" in shown[0]
    assert drawable("x" * LABEL_WIDTH) == "x" * LABEL_WIDTH  # as long as the width: whole
    photo = Image.new("RGB", (20, 20))
    path = tmp_path / ("b" * 90 + ".jpg")
    photo.save(path)
    grid = photo_grid([({"image": str(path), "label": long[1], "probability": 0.5}, long[0])], "Test predictions")
    for fig in (plot_confusion(torch.eye(3, dtype=torch.long), long), grid):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        for text in fig.findobj(Text):
            if text.get_text() and text.get_visible():
                extent = text.get_window_extent(canvas.get_renderer())
                assert fig.bbox.x0 - 1 <= extent.x0 and extent.x1 <= fig.bbox.x1 + 1, text.get_text()
