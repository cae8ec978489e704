"""`foodvit export`: ONNX (fp32, int8), TorchScript and torch.export files of a tiny run trained
here, checked against the PyTorch model; predicting from an .onnx file without PyTorch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import needs, run_without_torch

from foodvit.cli.main import main
from foodvit.deploy.export import relative_difference
from foodvit.deploy.predictor import Predictor

pytestmark = needs(
    "onnxruntime",
    "onnxscript",
    why="the export tests need the export extra: pip install -e '.[export]' (make test installs it)",
)


@pytest.fixture(scope="module")
def run(shared_run):
    return shared_run  # one block is a whole graph to export: patch embedding, attention, MLP, head


def _batch(predictor, photos, n):
    files = sorted((photos / "test").rglob("*.jpg"))[:n]
    return np.stack([predictor.prepare(f) for f in files])


def test_onnx_logits_equal_the_models_at_batch_1_and_5(run, shared_onnx):
    out, photos = run
    torch_model, exported = Predictor.from_run(out), Predictor.open(shared_onnx)
    assert (
        exported.model is None
        and exported.classes == torch_model.classes
        and exported.preprocess == torch_model.preprocess
    )
    for n in (1, 5):
        x = _batch(torch_model, photos, n)
        got, expected = exported.logits(x), torch_model.logits(x)
        assert got.shape == (n, 3)
        assert relative_difference(got, expected) <= 1e-4


def test_evaluate_and_predict_on_the_onnx_file_equal_those_on_the_run(run, shared_onnx, capsys):
    out, photos = run
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data", str(photos), "--json"]) == 0
    on_run = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(shared_onnx), "--data", str(photos), "--json"]) == 0
    on_onnx = json.loads(capsys.readouterr().out)
    assert on_onnx["accuracy"] == on_run["accuracy"] and on_onnx["confusion"] == on_run["confusion"]
    assert on_onnx["loss"] == pytest.approx(on_run["loss"], rel=1e-5)
    images = [str(p) for p in sorted((photos / "test").rglob("*.jpg"))[:4]]
    assert main(["predict", str(out), *images, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["predict", str(shared_onnx), *images, "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    for x, y in zip(a, b, strict=True):
        assert x["label"] == y["label"]
        for name, p in x["probabilities"].items():
            assert y["probabilities"][name] == pytest.approx(p, abs=1e-5)


def test_predicting_from_onnx_needs_no_torch(shared_onnx, run):
    _, photos = run
    photo = sorted((photos / "test" / "sushi").iterdir())[0]
    result = run_without_torch(["predict", shared_onnx, photo, "--json"])
    assert result.returncode == 0, result.stderr
    [answer] = json.loads(result.stdout)
    assert answer["label"] in ("pizza", "steak", "sushi") and answer["image"] == str(photo)


@pytest.mark.slow  # an int8 export (shared with test_quantize); the fast tier exports fp32 (shared_onnx)
def test_int8_is_smaller_and_keeps_the_answers(run, shared_onnx, shared_onnx_int8, capsys):
    _, photos = run
    path, _ = shared_onnx_int8  # `foodvit export --quantize int8` of the run
    assert shared_onnx.stat().st_size / path.stat().st_size >= 2.5
    capsys.readouterr()
    assert main(["evaluate", str(shared_onnx), "--data", str(photos), "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)["accuracy"]
    assert main(["evaluate", str(path), "--data", str(photos), "--json"]) == 0
    int8 = json.loads(capsys.readouterr().out)["accuracy"]
    assert abs(int8 - fp32) <= 0.1  # within a few of the 9 test photos


@pytest.mark.parametrize("fmt", ["torchscript", "exported-program"])
def test_torch_formats_carry_the_metadata_and_give_the_models_logits(run, tmp_path, fmt, capsys):
    import torch

    out, photos = run
    path = tmp_path / f"model.{'pt' if fmt == 'torchscript' else 'pt2'}"
    assert main(["export", str(out), "--format", fmt, "--out", str(path)]) == 0
    assert "max relative logit difference" in capsys.readouterr().out
    predictor = Predictor.from_run(out)
    x = _batch(predictor, photos, 3)
    extra = {"foodvit.classes": ""}
    if fmt == "torchscript":
        loaded = torch.jit.load(str(path), _extra_files=extra)
    else:
        loaded = torch.export.load(str(path), extra_files=extra).module()
    assert json.loads(extra["foodvit.classes"]) == ["pizza", "steak", "sushi"]
    with torch.inference_mode():
        got = loaded(torch.from_numpy(x)).numpy()
    assert relative_difference(got, predictor.logits(x)) <= 1e-4


def test_bad_exports_and_foreign_files_are_one_line(run, tmp_path, capsys):
    out, _ = run
    capsys.readouterr()
    (tmp_path / "unfinished").mkdir()
    assert main(["export", str(tmp_path / "unfinished"), "--out", str(tmp_path / "x.onnx")]) == 2
    assert "no trained model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", str(out), "--format", "tflite", "--out", str(tmp_path / "x.tflite")])
    assert "invalid choice: 'tflite'" in capsys.readouterr().err
    assert (
        main(["export", str(out), "--format", "torchscript", "--quantize", "int8", "--out", str(tmp_path / "x.pt")])
        == 2
    )
    assert "int8 quantisation is for --format onnx" in capsys.readouterr().err
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 50)
    assert main(["predict", str(tmp_path / "corrupt.onnx"), "photo.jpg"]) == 2
    assert "is not a readable ONNX model" in capsys.readouterr().err
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "foreign.onnx")
    assert main(["evaluate", str(tmp_path / "foreign.onnx")]) == 2
    assert "not one exported by foodvit" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing.onnx"), "photo.jpg"]) == 2
    assert "missing.onnx does not exist" in capsys.readouterr().err


def test_an_export_onnx_runtime_cannot_load_is_one_line_naming_no_temporary_file(run, tmp_path, monkeypatch, capsys):
    """--opset 26 exported, and ONNX Runtime 1.32 refused the file (its Attention node): the message named the
    temporary `.q.onnx.<hex>.partial.onnx` and said to export again, which fails the same way."""
    import onnxruntime

    class Refusing:  # as ONNX Runtime words it, naming the file it was given (the temporary one, said as --out)
        def __init__(self, path, *args, **kwargs):
            raise RuntimeError(
                f"[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model from {path} failed:This is an invalid model."
            )

    monkeypatch.setattr(onnxruntime, "InferenceSession", Refusing)
    out, _ = run
    capsys.readouterr()
    assert main(["export", str(out), "--out", str(tmp_path / "q.onnx"), "--opset", "26"]) == 2
    err = capsys.readouterr().err
    assert (
        "the exported model does not load in ONNX Runtime (RuntimeError: [ONNXRuntimeError] : 10 : INVALID_GRAPH : "
        f"Load model from {tmp_path / 'q.onnx'} failed"
        in err
        and f"nothing was written: give a lower --opset (ONNX Runtime {onnxruntime.__version__} may not run opset 26"
        in err
    )
    assert ".partial" not in err and list(tmp_path.iterdir()) == []


def test_the_destination_is_checked_before_anything(run, tmp_path, capsys):
    out, _ = run
    capsys.readouterr()
    cases = [
        (
            ["--format", "torchscript", "--out", str(tmp_path / "x.onnx")],
            f"--out {tmp_path / 'x.onnx'}: --format torchscript writes a .pt file, "
            "and what opens it looks for that name; "
            f"use --out {tmp_path / 'x.pt'}, or --format onnx to write the file x.onnx is named for",
        ),
        (["--out", str(tmp_path / "m.txt")], f"use --out {tmp_path / 'm.onnx'}"),
        (["--format", "exported-program", "--out", str(tmp_path / "m.pt")], "writes a .pt2 file"),
        (["--out", "/sys/m.onnx"], "cannot write m.onnx into /sys ("),
        (["--out", str(tmp_path)], f"--out {tmp_path} is a folder; give a file name, e.g. {tmp_path / 'model.onnx'}"),
    ]
    for flags, message in cases:
        assert main(["export", str(out), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "m.txt").exists()


def test_an_existing_file_is_overwritten_only_with_force(run, tmp_path, capsys):
    out, _ = run
    path = tmp_path / "model.pt"
    path.write_bytes(b"keep me")
    capsys.readouterr()
    assert main(["export", str(out), "--format", "torchscript", "--out", str(path)]) == 2
    assert (
        f"--out {path} exists; add --force to overwrite it" in capsys.readouterr().err
        and path.read_bytes() == b"keep me"
    )
    assert main(["export", str(out), "--format", "torchscript", "--out", str(path), "--force"]) == 0
    assert path.read_bytes() != b"keep me"
    # a TorchScript export is not a run: foodvit predict says so, and what to do, instead of a weights_only error
    assert main(["predict", str(path), str(sorted((run[1] / "test").rglob("*.jpg"))[0])]) == 2
    err = capsys.readouterr().err
    assert (
        f"{path} is a TorchScript export (foodvit export --format torchscript), which foodvit does not read back" in err
    )
    assert "weights_only" not in err and "torch.jit.load(path)" in err


def test_commands_that_need_a_run_say_which_take_an_onnx_file(shared_onnx, run, tmp_path, capsys):
    _, photos = run
    photo = str(sorted((photos / "test").rglob("*.jpg"))[0])
    expected = (
        f"{shared_onnx} is an ONNX export: foodvit predict, evaluate and serve take it; "
        "this command needs the trained run directory"
    )
    capsys.readouterr()
    for argv in (
        ["explain", str(shared_onnx), photo, "--out", str(tmp_path / "e.png")],
        ["export", str(shared_onnx), "--out", str(tmp_path / "again.onnx")],
    ):  # serve takes it (test_serve_onnx.py)
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and "expected a .safetensors" not in err, err


def test_a_forced_export_that_fails_its_check_keeps_the_previous_file(run, tmp_path, monkeypatch, capsys):
    # with --force the new file used to replace the old one before the parity check, which then deleted it
    import foodvit.deploy.export as export_module

    out, _ = run
    path = tmp_path / "model.pt"
    path.write_bytes(b"a good export of yesterday")
    monkeypatch.setattr(export_module, "relative_difference", lambda a, b: 1.0)  # the check fails
    assert main(["export", str(out), "--format", "torchscript", "--out", str(path), "--force"]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert path.read_bytes() == b"a good export of yesterday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no staging file left beside it


@pytest.mark.slow  # a second ONNX export of the run, with attention; the fast tier exports without it (shared_onnx)
def test_with_attention_the_file_gives_the_rollout_explain_draws(run, shared_onnx_attention, shared_onnx):
    from PIL import Image

    from foodvit.deploy.onnx_runtime import OnnxBackend
    from foodvit.viz.attention import explain

    out, photos = run
    torch_model, exported = Predictor.from_run(out), Predictor.open(shared_onnx_attention)
    backend = OnnxBackend(shared_onnx_attention)
    assert backend.outputs == ["logits", "attention"] and json.loads(backend.metadata["foodvit.outputs"]) == [
        "logits",
        "attention",
    ]
    grid = torch_model.model.config.grid_size
    for n in (1, 5):
        x = _batch(torch_model, photos, n)
        maps = backend.attention(x)
        assert maps.shape == (n, grid, grid)
        assert np.abs(maps - torch_model.backend.attention(x)).max() <= 1e-4
        assert relative_difference(exported.logits(x), torch_model.logits(x)) <= 1e-4  # the logits as without it
    photo = Image.open(sorted((photos / "test" / "steak").iterdir())[0]).convert("RGB")
    assert exported.has_attention
    assert np.abs(exported.attention(photo) - explain(torch_model, photo)["rollout"].numpy()).max() <= 1e-4
    plain = Predictor.open(shared_onnx)  # exported without it: no map, and no error
    assert not plain.has_attention and plain.attention(photo) is None
    assert json.loads(OnnxBackend(shared_onnx).metadata["foodvit.outputs"]) == ["logits"]


def test_with_attention_is_for_onnx_only(run, tmp_path, capsys):
    out, _ = run
    assert (
        main(["export", str(out), "--format", "torchscript", "--out", str(tmp_path / "m.pt"), "--with-attention"]) == 2
    )
    err = capsys.readouterr().err
    assert "--with-attention is for --format onnx" in err and "Traceback" not in err


@pytest.mark.slow  # each export with attention is 10 s of tracing: the fast tier exports without it (shared_onnx)
@pytest.mark.parametrize(
    "options",
    [
        {"pool": "seq", "stem": "conv"},  # the default recipe's model
        {"pool": "gap"},
        {"pool": "seq", "stem": "conv", "mlp_conv": True},  # deviation 12's grid
        {"distill_token": True},
    ],
)  # the class token: shared_onnx_attention
def test_the_attention_output_reads_the_tokens_as_each_pooling_does(options, tmp_path):
    # the graph's rollout goes through pool_readout's every branch: the mean of the patch rows, the learned
    # sequence-pooling weights, the class and distillation tokens' rows
    import torch
    from helpers import randomize_

    import foodvit
    from foodvit.data.preprocess import make_preprocess
    from foodvit.deploy.export import _export_onnx
    from foodvit.deploy.onnx_runtime import OnnxBackend

    torch.manual_seed(0)
    model = randomize_(foodvit.create_model("ViT-Ti/8", num_classes=3, image_size=32, depth=2, **options)).eval()
    predictor = Predictor(model, ["a", "b", "c"], make_preprocess(32, (0.5,) * 3, (0.5,) * 3))
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    _export_onnx(predictor, tmp_path / "m.onnx", None, None, x, with_attention=True)
    backend = OnnxBackend(tmp_path / "m.onnx")
    assert np.abs(backend.attention(x) - predictor.backend.attention(x)).max() <= 1e-4
    assert relative_difference(backend(x), predictor.logits(x)) <= 1e-4


def test_the_parity_check_takes_the_first_photos_given_as_its_help_says(run, tmp_path, capsys):
    import foodvit.deploy.export as export_module
    from foodvit.cli.main import build_parser

    out, photos = run
    given = sorted(photos.glob("*/*/*.jpg"))
    assert len(given) > export_module.PARITY_PHOTOS
    path = tmp_path / "model.pt"
    assert main(["export", str(out), "--format", "torchscript", "--out", str(path), "--photos", *map(str, given)]) == 0
    assert f"parity on {export_module.PARITY_PHOTOS} photos" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--help"])
    assert f"the first {export_module.PARITY_PHOTOS} used" in " ".join(capsys.readouterr().out.split())


def _terminated_midway(stand_in: str, argv: list[str], out: Path, scratch: Path) -> None:
    """foodvit run with argv in another Python, after `stand_in` (code that replaces a step of the export with one
    that writes its files and sends the process SIGTERM): it unwinds as ctrl-C does, says what is left, and leaves
    nothing in `scratch`, its temporary folder."""
    code = f"import os, signal, sys, tempfile\nfrom pathlib import Path\n{stand_in}"
    code += f"from foodvit.cli.main import main\nsys.exit(main({argv!r}))\n"
    ended = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"},
    )
    assert ended.returncode == 143, ended.stderr[-2000:]
    assert ended.stderr.strip().splitlines()[-1] == (
        f"interrupted: {out} was not written, and nothing else is left; run the same command again to export"
    )
    assert list(scratch.iterdir()) == []


def test_sigterm_in_an_export_unwinds_as_ctrl_c_and_leaves_nothing(run, tmp_path):
    # export took SIGTERM's default: killed at once, its staging file beside --out and its temporary folder left
    out, scratch = tmp_path / "out" / "model.onnx", tmp_path / "scratch"
    scratch.mkdir()
    stand_in = (  # the ONNX export stood in for by its files (a temporary folder, the staging file): seconds less
        "from foodvit.deploy import export\n"
        "def terminated_while_writing(predictor, staging, *args, **kwargs):\n"
        "    with tempfile.TemporaryDirectory() as tmp:\n"
        "        (Path(tmp) / 'fp32.onnx').write_bytes(b'model')\n"
        "        staging.write_bytes(b'model')\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "export._export_onnx = terminated_while_writing\n"
    )
    _terminated_midway(stand_in, ["export", str(run[0]), "--out", str(out)], out, scratch)
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("command", ["export-space", "export-web"])
def test_sigterm_in_a_folder_export_unwinds_as_ctrl_c_and_leaves_nothing(run, tmp_path, command):
    # export-space and export-web took SIGTERM's default: a hidden .folder.<hex>/ left beside the one asked for
    out, scratch = tmp_path / "out" / "site", tmp_path / "scratch"
    scratch.mkdir()
    stand_in = (  # the folder's filling stood in for by a file in it
        "from foodvit import files\n"
        "from foodvit.deploy import space\n"
        "made = files.atomic_folder\n"
        "def killed_while_filling(target, fill):\n"
        "    def fill_then_terminated(tmp):\n"
        "        (Path(tmp) / 'app.py').write_text('app')\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return made(target, fill_then_terminated)\n"
        "files.atomic_folder = space.atomic_folder = killed_while_filling\n"
    )
    argv = [command, str(run[0]), *(["--out"] if command == "export-web" else []), str(out)]
    _terminated_midway(stand_in, argv, out, scratch)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left in (["scratch"], ["out", "scratch"])  # the folder's parent made, or not: nothing in it
