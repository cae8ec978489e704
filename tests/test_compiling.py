"""--compile (training/compiling.py): the train step compiled by torch.compile computes what the eager one does, to
float noise; without a C++ compiler on the CPU the step runs uncompiled, said once."""

import csv
from pathlib import Path

import pytest
import torch
from helpers import library_messages_on_stderr, make_photo_folder

import foodvit.training.compiling as compiling
from foodvit.cli.main import main

# a tiny ViT with the localization loss's wrapper around it: the step the trainer compiles, one graph to build
TINY = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--drloc", "0.5", "--quiet"]


def test_without_a_cpp_compiler_the_step_runs_uncompiled_said_once(monkeypatch, capsys):
    monkeypatch.setattr(compiling, "cpp_compiler", lambda: None)
    monkeypatch.setattr(compiling, "_said", set())
    library_messages_on_stderr()
    module = torch.nn.Linear(2, 2)
    assert compiling.compile_step(module, torch.device("cpu")) is module
    assert compiling.compile_step(module, torch.device("cpu")) is module
    assert capsys.readouterr().err.count("no C++ compiler") == 1


def metrics(run: Path) -> list[dict]:
    with (run / "metrics.csv").open(newline="") as f:
        timing = ("seconds", "images_per_s", "model_share")
        return [{k: float(v) for k, v in row.items() if k not in timing and v} for row in csv.DictReader(f)]


@pytest.mark.slow  # inductor compiles the step's forward and backward (tens of seconds); the fallback stays fast
@pytest.mark.skipif(compiling.cpp_compiler() is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_the_compiled_step_learns_what_the_eager_one_does(tmp_path, monkeypatch):
    import torch._inductor.config as inductor

    # inductor compiles the kernels in this process: its pool of compiling processes, each importing PyTorch, costs
    # more to start than this one small graph costs to compile (the step and its numbers are the same)
    monkeypatch.setattr(inductor, "compile_threads", 1)
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    runs = {}
    for name, flag in (("eager", "--no-compile"), ("compiled", "--compile")):
        assert main(["train", "--data", str(photos), "--out", str(tmp_path / name), *TINY, flag]) == 0
        runs[name] = metrics(tmp_path / name)
    assert len(runs["eager"]) == len(runs["compiled"]) == 1
    for eager, compiled in zip(runs["eager"], runs["compiled"], strict=True):
        assert eager.keys() == compiled.keys()
        for key in eager:  # other kernels, other rounding: float noise, no more
            assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-4), key
