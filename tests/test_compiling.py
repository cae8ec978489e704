"""--compile (training/compiling.py): the train step compiled by torch.compile computes what the eager one does, to
float noise; inductor draws eager PyTorch's random numbers; without a C++ compiler on the CPU the step runs
uncompiled, said once. Inductor's C++ kernels for the whole step take about 30 s of g++ on a cold cache: the suite
traces the whole step through TorchDynamo and AOTAutograd (the graphs inductor would be given) and runs inductor on
a small module; `python -m bench.speed.compiled` compares the whole step under inductor."""

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


@pytest.mark.slow  # TorchDynamo traces a training's steps (seconds); the fast tier keeps the fallback's test
def test_the_traced_step_learns_what_the_eager_one_does(tmp_path, monkeypatch):
    """--compile hands the trainer's whole step to torch.compile; here its graphs run as AOTAutograd traced them
    (backend "aot_eager": what inductor would receive, without its C++, so no compiler is needed). The step is one
    graph, traced once and reused by the next steps, and learns what the eager step does."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    given: list[dict] = []

    def traced(module, **options):
        given.append(options)
        return real_compile(module, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", traced)
    monkeypatch.setattr(compiling, "cpp_compiler", lambda: "g++")  # aot_eager compiles no C++
    photos = make_photo_folder(tmp_path / "photos", n_train=4, n_test=2)
    runs = {}
    for name, flag in (("eager", "--no-compile"), ("compiled", "--compile")):
        torch._dynamo.reset()
        counters.clear()
        # 12 photos in batches of 4: three steps, the last two through the graph the first traced
        assert (
            main(["train", "--data", str(photos), "--out", str(tmp_path / name), *TINY, "--batch-size", "4", flag]) == 0
        )
        runs[name] = metrics(tmp_path / name)
    assert given == [{"options": {"fallback_random": True}}]  # inductor told to draw as eager PyTorch does
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1
    assert len(runs["eager"]) == len(runs["compiled"]) == 1
    for eager, compiled in zip(runs["eager"], runs["compiled"], strict=True):
        assert eager.keys() == compiled.keys()
        for key in eager:  # other kernels, other rounding: float noise, no more
            assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-4), key


class _Drawing(torch.nn.Module):
    """The random draws a step makes inside the compiled graph: dropout's mask and the localization loss's pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.randint(0, x.shape[0], (8,))
        return self.dropout(self.linear(x))[pairs]


@pytest.mark.slow  # inductor compiles C++ kernels (seconds on a cold cache); the fast tier keeps the fallback
@pytest.mark.skipif(compiling.cpp_compiler() is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_inductor_draws_the_random_numbers_eager_pytorch_draws(monkeypatch):
    import torch._inductor.config as inductor

    # inductor compiles the kernels in this process: its pool of compiling processes, each importing PyTorch, costs
    # more to start than these small kernels cost to compile
    monkeypatch.setattr(inductor, "compile_threads", 1)
    # scalar kernels: choosing vector instructions compiles a probe program for each set the CPU reports, on a cold
    # cache (about 8 s of g++ here, against 2 s for the kernels), and which instructions add the numbers changes no
    # draw; inductor keeps the empty list of sets for the rest of this process (no other test here runs inductor)
    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", False)
    torch._dynamo.reset()
    module = _Drawing().train()
    x = torch.randn(32, 16)
    torch.manual_seed(0)
    eager = module(x)
    compiled = compiling.compile_step(module, torch.device("cpu"))
    assert compiled is not module
    torch.manual_seed(0)
    assert torch.allclose(compiled(x), eager, atol=1e-6)  # the same photos paired and the same features dropped
    assert (eager == 0).any() and not torch.equal(eager, module(x))  # the draws did draw
