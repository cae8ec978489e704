import os
import sys
from pathlib import Path

import pytest
import torch

# Each pytest process takes its share of the cores: under `pytest -n 2` on 2 cores, two threads a
# worker would be four threads on two cores, and OpenMP's waiting threads spin and burn the time (an
# 8-epoch tiny training took 1.2 s of CPU with one thread, 7.6 s with two, beside another process).
THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
torch.set_num_threads(THREADS)

# Read once, before any test's monkeypatching of the environment.
REAL_DATA = os.environ.get("FOODVIT_DATA")

# The upload limit of the shared server: small, so that test_serve can send a body over it cheaply.
UPLOAD_LIMIT_MB = 1.0


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name == "test_notebook.py":  # executes the whole walkthrough over FoodVision Mini: minutes
            item.add_marker(pytest.mark.slow)
        if "shared_server" in item.fixturenames:  # a server in another Python: torch and Gradio imported again, 10-15 s here
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _no_report_figures():
    """A run's three report figures cost 1-3 s of matplotlib's text layout, and the suite trains about
    a hundred runs in its own processes: they are drawn only inside helpers.report_figures(), where a
    test looks at them or compares a run's files with another Python's (test_train, test_viz,
    test_tracking, test_distributed, test_run_directory's umask). Every training in another Python
    (a command line run as a subprocess, torchrun's ranks, tune's processes, the notebook's kernel)
    draws them as a user's does."""
    from helpers import no_figures

    from foodvit.training import report

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "draw_figures", no_figures)
        yield


@pytest.fixture
def real_data() -> Path:
    """The FoodVision Mini folder, when FOODVIT_DATA names it (set by .ci/run)."""
    path = REAL_DATA
    if not path or not (Path(path) / "train").is_dir():
        pytest.skip("FOODVIT_DATA does not name a FoodVision Mini folder")
    return Path(path)


# Session-wide, so that each pytest process (each xdist worker) trains and serves once for every
# test file that only needs "a trained run" or "a running server". Tests read them, never change them.


@pytest.fixture(scope="session")
def shared_photos(tmp_path_factory) -> Path:
    """A FoodVision-like folder of generated photos (64 x 80), 6 train and 3 test photos a class."""
    from helpers import make_photo_folder

    return make_photo_folder(tmp_path_factory.mktemp("photos"), n_train=6, n_test=3, size=(64, 80))


@pytest.fixture(scope="session")
def shared_run(shared_photos, tmp_path_factory):
    """(run, photos): the tiny recipe (ViT-Ti/8, 32 px, one block, one epoch) trained through the
    command line on shared_photos."""
    from foodvit.cli.main import main

    out = tmp_path_factory.mktemp("runs") / "shared"
    assert main(["train", "--recipe", "tiny", "--data", str(shared_photos), "--out", str(out), "--epochs", "1",
                 "--image-size", "32", "--depth", "1", "--quiet"]) == 0
    return out, shared_photos


def _export(shared_run, tmp_path_factory, name: str, *options: str) -> Path:
    from foodvit.cli.main import main

    out, _ = shared_run
    path = tmp_path_factory.mktemp("onnx") / f"{name}.onnx"
    assert main(["export", str(out), "--out", str(path), *options]) == 0
    return path


# shared_run as .onnx files, exported once a pytest process (each export is seconds of torch.export):
# test_export, test_serve_onnx and test_browser read them, never change them.
@pytest.fixture(scope="session")
def shared_onnx(shared_run, tmp_path_factory) -> Path:
    """shared_run exported by `foodvit export` as an fp32 .onnx file (the logits only)."""
    return _export(shared_run, tmp_path_factory, "plain")


@pytest.fixture(scope="session")
def shared_onnx_attention(shared_run, tmp_path_factory) -> Path:
    """shared_run exported with `--with-attention`: the logits and the attention rollout."""
    return _export(shared_run, tmp_path_factory, "attention", "--with-attention")


@pytest.fixture(scope="session")
def shared_server(shared_run):
    """The base URL of `foodvit serve` on shared_run, with an upload limit of UPLOAD_LIMIT_MB."""
    from helpers import free_port, start_server, stop_server

    run, _ = shared_run
    port = free_port()
    process, url = start_server([sys.executable, "-m", "foodvit", "serve", str(run), "--port", str(port),
                                 "--max-upload-mb", str(UPLOAD_LIMIT_MB), "--threads", "1"], port)
    yield url
    stop_server(process)
