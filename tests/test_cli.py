"""The command line: options generated from the config, and each command's contract."""

import json

import numpy as np
import pytest
from helpers import make_photo_folder
from PIL import Image

from foodvit.cli import main
from foodvit.config import RunConfig, list_recipes, load_recipe


def test_summary_ends_with_the_total(capsys):
    assert main(["summary", "ViT-B/16", "--num-classes", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "Total params: 85,800,963"
    assert any("patch_embed" in line and line.rstrip().endswith("True") and "[1, 196, 768]" in line for line in out)
    assert any(line.strip().startswith("head (Linear)") and "[1, 3]" in line and "2,307" in line for line in out)
    last_block = next(line for line in out if line.strip().startswith("11 (Block)"))
    assert "[1, 197, 768]" in last_block and "[1, 1, 768]" in last_block  # only the class token leaves the last block
    assert any(line.startswith("Block 11 outputs the class token only") for line in out)


def test_errors_are_one_line_with_what_to_do(capsys):
    assert main(["summary", "ViT-B/16", "--image-size", "250"]) == 2
    assert "image size 250 is not divisible by patch size 16; use --image-size 240 or 256" in capsys.readouterr().err


def test_every_recipe_loads_and_names_what_it_reproduces():
    assert {"course", "paper", "tiny", "default"} <= set(list_recipes())
    for name in list_recipes():
        config = load_recipe(name)
        assert isinstance(config, RunConfig) and config.recipe == name
    course = load_recipe("course")
    assert (course.model, course.optim.optimizer, course.optim.lr, course.optim.weight_decay) == ("ViT-B/16", "adam", 3e-3, 0.3)
    assert course.optim.decay_all and course.train.batch_size == 32 and course.train.epochs == 10 and course.data.augment == "none"
    paper = load_recipe("paper")
    assert paper.vit["dropout"] == 0.1 and paper.optim.clip_grad == 1.0 and paper.optim.schedule == "cosine"


def test_bad_recipe_files_are_explained(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text('[optim]\nlearning_rate = 1\n')
    with pytest.raises(ValueError, match=r"unknown OptimConfig setting\(s\) learning_rate"):
        load_recipe(str(bad))
    with pytest.raises(ValueError, match=r"unknown recipe 'nope'.*course"):
        load_recipe("nope")


def test_command_line_overrides_every_section(tmp_path):
    import argparse

    from foodvit.config import add_config_options, apply_overrides

    parser = argparse.ArgumentParser()
    add_config_options(parser)
    args = parser.parse_args(["--lr", "0.01", "--pool", "gap", "--augment", "strong", "--epochs", "3",
                              "--betas", "0.9,0.95", "--cache", "false", "--data", "x"])
    config = apply_overrides(load_recipe("tiny"), args)
    assert config.optim.lr == 0.01 and config.optim.betas == (0.9, 0.95)
    assert config.vit == {"image_size": 64, "depth": 4, "pool": "gap"}
    assert config.data.augment == "strong" and config.data.cache is False and config.data.source == "x"
    assert config.train.epochs == 3 and config.optim.weight_decay == load_recipe("tiny").optim.weight_decay
    with pytest.raises(SystemExit):
        parser.parse_args(["--pool", "max"])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    photos = make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=6, n_test=3)
    out = tmp_path_factory.mktemp("runs") / "cli"
    code = main(["train", "--recipe", "tiny", "--data", str(photos), "--out", str(out), "--epochs", "1",
                 "--image-size", "32", "--depth", "1", "--quiet"])
    assert code == 0
    return out, photos


def test_evaluate_json_contract(run, capsys):
    out, photos = run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0  # the run's own data source by default
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"accuracy", "loss", "n", "per_class", "confusion"}
    assert result["n"] == 9 and set(result["per_class"]) == {"pizza", "steak", "sushi"}
    assert sum(map(sum, result["confusion"])) == 9
    correct = sum(result["confusion"][i][i] for i in range(3))
    assert result["accuracy"] == pytest.approx(correct / 9)


def test_evaluate_accepts_a_folder_of_class_folders(run, capsys):
    out, photos = run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data", str(photos / "test"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 9


def test_predict_json_contract_and_plot(run, capsys, tmp_path):
    out, photos = run
    images = [str(p) for p in sorted((photos / "test" / "pizza").iterdir())[:2]]
    capsys.readouterr()
    assert main(["predict", str(out), *images, "--top-k", "2", "--json", "--plot", str(tmp_path / "p.png")]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in results] == images
    for r in results:
        assert set(r) == {"image", "label", "probability", "top_k", "seconds"}
        assert len(r["top_k"]) == 2 and r["top_k"][0] == [r["label"], r["probability"]]
    with Image.open(tmp_path / "p.png") as picture:
        assert len(np.unique(np.asarray(picture.convert("L")))) > 10  # a real picture, not a blank canvas


def test_predict_reports_each_bad_photo_and_predicts_the_rest(run, capsys, tmp_path):
    out, photos = run
    good = str(sorted((photos / "test" / "pizza").iterdir())[0])
    (tmp_path / "fake.jpg").write_bytes(b"nope")
    bad = [str(tmp_path / "fake.jpg"), str(tmp_path / "missing.jpg"), "https://example.com/pizza.jpg"]
    capsys.readouterr()
    assert main(["predict", str(out), bad[0], good, bad[1], bad[2], "--json"]) == 1  # some photos failed
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert [r["image"] for r in results] == [bad[0], good, bad[1], bad[2]]
    assert "label" in results[1] and all("error" in results[i] for i in (0, 2, 3))
    assert "URLs are not supported; download the photo first" in results[3]["error"]
    assert "missing.jpg does not exist" in results[2]["error"]
    assert captured.err.count("foodvit predict: skipped") == 3 and "Traceback" not in captured.err
    assert main(["evaluate", str(tmp_path), "--json"]) == 2
    assert "no trained model" in capsys.readouterr().err
