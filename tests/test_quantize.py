"""int8 .onnx files (deploy/quantize.py): static (QDQ, calibrated on the run's training photos) and
dynamic, and the choice between them by measurement."""

import json

import numpy as np
import pytest
from helpers import needs

from foodvit.cli.main import main
from foodvit.deploy.onnx_runtime import OnnxBackend
from foodvit.deploy.predictor import Predictor
from foodvit.deploy.quantize import choose, describe

pytestmark = needs(
    "onnxruntime",
    "onnxscript",
    why="the export tests need the export extra: pip install -e '.[export]' (make test installs it)",
)


def _inputs(predictor, photos):
    return np.stack([predictor.prepare(f) for f in sorted((photos / "test").rglob("*.jpg"))])


def test_choose_keeps_the_fastest_candidate_within_one_point_of_fp32():
    assert (
        choose({"dynamic": {"latency_ms": 0.6, "agreement": 1.0}, "static": {"latency_ms": 0.4, "agreement": 0.995}})
        == "static"
    )
    assert (
        choose({"dynamic": {"latency_ms": 0.6, "agreement": 1.0}, "static": {"latency_ms": 0.4, "agreement": 0.98}})
        == "dynamic"
    )
    assert (
        choose({"dynamic": {"latency_ms": 0.3, "agreement": 0.99}, "static": {"latency_ms": 0.4, "agreement": 1.0}})
        == "dynamic"
    )
    # neither within the bound: the one that agrees most, not the fastest
    assert (
        choose({"dynamic": {"latency_ms": 0.3, "agreement": 0.9}, "static": {"latency_ms": 0.2, "agreement": 0.8}})
        == "dynamic"
    )
    looser = {"dynamic": {"latency_ms": 0.6, "agreement": 0.97}, "static": {"latency_ms": 0.4, "agreement": 0.97}}
    assert choose(looser, bound=0.05) == "static"


def test_describe_says_when_neither_candidate_kept_fp32s_answers():
    figures = {
        "fp32": {"latency_ms": 2.9},
        "static": {"latency_ms": 2.50, "agreement": 0.97},
        "dynamic": {"latency_ms": 2.52, "agreement": 0.98},
    }
    info = {"asked": "int8", "method": "dynamic", "figures": figures, "probe_photos": 96, "calibration_photos": 96}
    assert "(neither within 1% of fp32's answers: the more agreeing kept)" in describe(info)
    assert "both int8 kinds are slower than fp32 on this machine" not in describe(info)
    figures["dynamic"]["agreement"] = 1.0
    assert "neither" not in describe(info)
    figures["fp32"]["latency_ms"] = 2.0  # faster than both: int8 is said to buy size, not speed
    assert describe(info).endswith(
        "; both int8 kinds are slower than fp32 on this machine: int8 buys a smaller file here, not speed"
    )


@pytest.mark.slow  # an export and its calibration; the fast tier keeps the choice between int8 kinds (test_choose_...)
def test_static_int8_is_calibrated_and_keeps_the_answers(shared_run, tmp_path, capsys):
    out, photos = shared_run
    path = tmp_path / "static.onnx"
    assert main(["export", str(out), "--out", str(path), "--quantize", "int8-static", "--with-attention"]) == 0
    assert "static int8 (as asked, calibrated on 18 training photos)" in capsys.readouterr().out
    backend = OnnxBackend(path)
    info = json.loads(backend.metadata["foodvit.quantize"])
    assert info["method"] == "static" and info["calibration_photos"] == 18  # 6 training photos a class, all of them
    assert any(node.op_type == "QuantizeLinear" for node in __import__("onnx").load(str(path)).graph.node)  # QDQ format
    predictor = Predictor.from_run(out)
    x = _inputs(predictor, photos)
    reference, got = predictor.logits(x), backend(x)
    assert (got.argmax(1) == reference.argmax(1)).mean() >= 8 / 9
    assert np.abs(got - reference).max() <= 0.2 * np.abs(reference).max()
    assert backend.attention(x).shape == (9, 4, 4)  # the attention output kept, in float


@pytest.mark.slow  # two quantisations measured; the fast tier keeps the choice between int8 kinds
def test_int8_measures_both_and_says_which_it_kept(shared_onnx_int8):
    path, line = shared_onnx_int8  # `foodvit export --quantize int8` of the run, and what it printed
    info = json.loads(OnnxBackend(path).metadata["foodvit.quantize"])
    assert (
        info["method"] in ("static", "dynamic")
        and f"quantisation: {info['method']} int8, chosen by measurement" in line
    )
    assert set(info["figures"]) == {"fp32", "static", "dynamic"}
    assert info["method"] == choose({k: info["figures"][k] for k in ("static", "dynamic")})
    assert all(f["latency_ms"] > 0 and 0 <= f["agreement"] <= 1 for f in info["figures"].values())


@pytest.mark.slow  # two more exports; the fast tier keeps the choice between int8 kinds
def test_without_training_photos_int8_is_dynamic_and_int8_static_one_line(shared_run, tmp_path, monkeypatch, capsys):
    import foodvit.deploy.quantize as quantize

    out, _ = shared_run
    monkeypatch.setattr(quantize, "calibration_inputs", lambda predictor: None)
    assert main(["export", str(out), "--out", str(tmp_path / "a.onnx"), "--quantize", "int8"]) == 0
    captured = capsys.readouterr()
    assert "training photos are not at hand" in captured.err and "dynamic int8" in captured.out
    assert json.loads(OnnxBackend(tmp_path / "a.onnx").metadata["foodvit.quantize"])["method"] == "dynamic"
    assert main(["export", str(out), "--out", str(tmp_path / "b.onnx"), "--quantize", "int8-static"]) == 2
    err = capsys.readouterr().err
    assert "int8-dynamic" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.onnx").exists()
