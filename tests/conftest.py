import os
import sys
from pathlib import Path

import pytest

# Each pytest process takes its share of the cores: under `pytest -n 2` on 2 cores, two threads a
# worker would be four threads on two cores, and OpenMP's waiting threads spin and burn the time (an
# 8-epoch tiny training took 1.2 s of CPU with one thread, 7.6 s with two, beside another process).
THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

# Read once, before any test's monkeypatching of the environment.
REAL_DATA = os.environ.get("FOODVIT_DATA")

# The upload limit of the shared server: small, so that test_serve can send a body over it cheaply.
UPLOAD_LIMIT_MB = 1.0


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name == "test_notebook.py":  # executes the whole walkthrough over FoodVision Mini: minutes
            item.add_marker(pytest.mark.slow)
        if (
            "shared_server" in item.fixturenames
        ):  # a server in another Python: torch and Gradio imported again, 10-15 s here
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    """Each process that runs tests sets its PyTorch threads before its first test. Not at this file's import:
    under `pytest -n 2` the process that only hands out the tests would import PyTorch (3 s) before starting its
    workers, and run none."""
    import torch

    torch.set_num_threads(THREADS)


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


@pytest.fixture(scope="session", autouse=True)
def _gradio_cache_of_this_process(tmp_path_factory):
    """An upload cache for this pytest process's pages and servers (they inherit it): Gradio files an upload under
    its content's hash, and a page that stops deletes the files it received, so a page stopping in the other worker
    would delete the same generated photo from under this one's server."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
        yield


@pytest.fixture
def real_data() -> Path:
    """The FoodVision Mini folder, when FOODVIT_DATA names it (set by .ci/run)."""
    path = REAL_DATA
    if not path or not (Path(path) / "train").is_dir():
        pytest.skip("FOODVIT_DATA does not name a FoodVision Mini folder")
    return Path(path)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's program for the browser tests: FOODVIT_CHROMIUM, else Debian's /usr/bin/chromium (Playwright's
    own browser download is never used). Missing: the test skips, or fails under CI=true (helpers.missing_tool)."""
    import shutil

    from helpers import missing_tool

    path = os.environ.get("FOODVIT_CHROMIUM", "/usr/bin/chromium")
    if not (Path(path).is_file() or shutil.which(path)):
        missing_tool(
            f"browser test: no Chromium at {path}; install it with `apt-get install -y chromium` "
            "(or set FOODVIT_CHROMIUM to a Chromium binary)"
        )
    return path


# Files made once for the whole suite: a trained run, its photos and its .onnx exports, made by the
# first pytest process (xdist worker) that needs each, under a file lock, and read by every test file
# that only needs "a trained run" (each export is seconds of torch.export). Tests read them, never
# change them: each process checks at its end that they are as made.


def _made_once(tmp_path_factory, unchanged: list, name: str, make) -> Path:
    """tmp/NAME, made by make(path) once for the session's workers; a worker that finds it being made
    waits for it, and one made in part (its maker failed) is made again. It joins `unchanged`, the
    files this process checks at its end."""
    import shutil

    from filelock import FileLock

    from foodvit.files import atomic_write

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above every worker's own
    path, done = root / "shared-files" / name, root / "shared-files" / f"{name}.done"
    path.parent.mkdir(exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not done.exists():
            if path.is_dir():
                shutil.rmtree(path)
            path.unlink(missing_ok=True)
            make(path)
            atomic_write(done, lambda tmp: Path(tmp).write_text(_fingerprint(path)))  # whole, or absent
    unchanged.append(path)
    return path


def _fingerprint(path: Path) -> str:
    """Every file's name, size and content digest under path (or of the file path)."""
    import hashlib

    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return "\n".join(
        f"{p.relative_to(path.parent)} {p.stat().st_size} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in files
    )


@pytest.fixture(scope="session")
def _shared_files_unchanged():
    """At this process's end: the shared files it used are as made (no test changed them)."""
    used: list[Path] = []
    yield used
    for path in used:
        made, now = path.parent.joinpath(f"{path.name}.done").read_text().splitlines(), _fingerprint(path).splitlines()
        changed = sorted(set(made) ^ set(now))
        assert not changed, f"a test changed the shared {path.name} (tests must copy it first): " + "; ".join(
            changed[:6]
        )


@pytest.fixture(scope="session")
def shared_photos(tmp_path_factory, _shared_files_unchanged) -> Path:
    """A FoodVision-like folder of generated photos (64 x 80), 6 train and 3 test photos a class."""
    from helpers import make_photo_folder

    return _made_once(
        tmp_path_factory,
        _shared_files_unchanged,
        "photos",
        lambda path: make_photo_folder(path, n_train=6, n_test=3, size=(64, 80)),
    )


@pytest.fixture(scope="session")
def shared_run(shared_photos, tmp_path_factory, _shared_files_unchanged):
    """(run, photos): the tiny recipe (ViT-Ti/8, 32 px, one block, one epoch) trained through the
    command line on shared_photos."""
    from foodvit.cli.main import main

    def make(out):
        assert (
            main(
                [
                    "train",
                    "--recipe",
                    "tiny",
                    "--data",
                    str(shared_photos),
                    "--out",
                    str(out),
                    "--epochs",
                    "1",
                    "--image-size",
                    "32",
                    "--depth",
                    "1",
                    "--quiet",
                ]
            )
            == 0
        )

    return _made_once(tmp_path_factory, _shared_files_unchanged, "run", make), shared_photos


def _export(shared_run, tmp_path_factory, unchanged, name: str, *options: str) -> Path:
    from foodvit.cli.main import main

    def make(path):
        assert main(["export", str(shared_run[0]), "--out", str(path), *options]) == 0

    return _made_once(tmp_path_factory, unchanged, f"{name}.onnx", make)


@pytest.fixture(scope="session")
def shared_onnx(shared_run, tmp_path_factory, _shared_files_unchanged) -> Path:
    """shared_run exported by `foodvit export` as an fp32 .onnx file (the logits only)."""
    return _export(shared_run, tmp_path_factory, _shared_files_unchanged, "plain")


@pytest.fixture(scope="session")
def shared_onnx_attention(shared_run, tmp_path_factory, _shared_files_unchanged) -> Path:
    """shared_run exported with `--with-attention`: the logits and the attention rollout."""
    return _export(shared_run, tmp_path_factory, _shared_files_unchanged, "attention", "--with-attention")


@pytest.fixture(scope="session")
def shared_onnx_int8(shared_run, tmp_path_factory, _shared_files_unchanged) -> tuple[Path, str]:
    """(file, what the command printed): shared_run exported by `foodvit export --quantize int8`, which measures
    static and dynamic int8 and keeps one (test_export and test_quantize read it)."""
    import contextlib
    import io

    from foodvit.cli.main import main

    def make(folder):
        folder.mkdir()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["export", str(shared_run[0]), "--out", str(folder / "int8.onnx"), "--quantize", "int8"]) == 0
        (folder / "printed.txt").write_text(printed.getvalue())

    folder = _made_once(tmp_path_factory, _shared_files_unchanged, "int8", make)
    return folder / "int8.onnx", (folder / "printed.txt").read_text()


@pytest.fixture(scope="session")
def shared_server(shared_run):
    """The base URL of `foodvit serve` on shared_run, with an upload limit of UPLOAD_LIMIT_MB."""
    from helpers import free_port, start_server, stop_server

    run, _ = shared_run
    port = free_port()
    process, url = start_server(
        [
            sys.executable,
            "-m",
            "foodvit",
            "serve",
            str(run),
            "--port",
            str(port),
            "--max-upload-mb",
            str(UPLOAD_LIMIT_MB),
            "--threads",
            "1",
        ],
        port,
    )
    yield url
    stop_server(process)
