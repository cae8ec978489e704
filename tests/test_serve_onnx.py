"""`foodvit serve model.onnx` and `foodvit export-space --onnx`: the server, its page and a Space on
ONNX Runtime, in processes where importing torch fails; answers compared with the run's, and the page in a
real browser (Debian's Chromium driven by Playwright, as in test_browser.py)."""

import json
import signal
import sys

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx: pip install -e '.[test]'")

from helpers import (  # noqa: E402
    BLOCK_TORCH,
    free_port,
    launch_server,
    needs,
    server_output,
    start_server,
    stop_server,
    wait_for_server,
    without_torch,
)

from foodvit.cli.main import main  # noqa: E402
from foodvit.deploy.onnx_runtime import NO_ATTENTION  # noqa: E402
from foodvit.deploy.predictor import Predictor  # noqa: E402

pytestmark = needs(
    "fastapi",
    "gradio",
    "onnxruntime",
    "onnxscript",
    why="the .onnx server tests need the serve and export extras: pip install -e '.[serve,export]' "
    "(make test installs them)",
)


@pytest.fixture(scope="module")
def run(shared_run):
    return shared_run


@pytest.fixture(scope="module")
def exported(run, shared_onnx, shared_onnx_attention, tmp_path_factory):
    """{name: path}: the run as fp32 and dynamic int8 .onnx files with the attention output, and shared_onnx."""
    out, _ = run
    files = {"fp32": shared_onnx_attention, "int8": tmp_path_factory.mktemp("onnx") / "int8.onnx", "plain": shared_onnx}
    assert (
        main(["export", str(out), "--out", str(files["int8"]), "--with-attention", "--quantize", "int8-dynamic"]) == 0
    )
    return files


def _photos(run):
    _, photos = run
    return [sorted((photos / "test" / c).iterdir())[0] for c in ("pizza", "steak", "sushi")]


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    """{name: url}: `foodvit serve` of each of exported's files, each in a process where importing torch fails,
    started together and shared by the tests below, which only send them requests. Each is stopped at the end as
    Ctrl+C stops it: the server stops and main returns 130; then the check for torch modules runs, over all that
    was asked of it (a torch module loaded would make it exit 1)."""
    processes, urls = {}, {}
    try:
        ports = {name: free_port() for name in exported}
        for name, path in exported.items():  # launched together: one imports Gradio while another waits for a core
            # an upload cache of each server's own: Gradio files an upload under its content's hash, the same photo
            # goes to several of these servers, and a server that stops deletes the files it received
            cache = {"GRADIO_TEMP_DIR": str(tmp_path_factory.mktemp("gradio"))}
            examples = ["--no-examples"] if name == "int8" else []  # the page without examples, torch-free too
            command = without_torch(["serve", path, "--port", ports[name], "--threads", "1", *examples])
            processes[name] = launch_server(command, env=cache)
        for name, port in ports.items():
            urls[name] = wait_for_server(processes[name], port)
        yield urls
        for process in processes.values():
            process.send_signal(signal.SIGINT)
        for name, process in processes.items():
            assert process.wait(timeout=30) == 130, f"{name}: {server_output(process)}"
    finally:
        for process in processes.values():
            stop_server(process)


@pytest.mark.slow  # servers in other Pythons
@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_an_onnx_file_is_served_without_torch_and_answers_as_the_run(run, served, kind):
    gradio_client = pytest.importorskip("gradio_client")
    out, _ = run
    reference = Predictor.from_run(out)
    url = served[kind]
    health = httpx.get(url + "/health").json()
    assert health == {"status": "ok", "model": reference.name, "classes": reference.classes}
    for photo in _photos(run):
        answer = httpx.post(url + "/predict", files={"file": (photo.name, photo.read_bytes())}, timeout=60).json()
        expected = reference.classify(photo)
        for name, p in expected["probabilities"].items():  # int8: within a few hundredths of a tiny model's answer
            assert answer["probabilities"][name] == pytest.approx(p, abs=1e-4 if kind == "fp32" else 0.05)
        if kind == "fp32":
            assert answer["label"] == expected["label"]
    empty = httpx.post(url + "/predict", files={"file": ("empty.jpg", b"")})
    assert empty.status_code == 400 and set(empty.json()) == {"error"}  # the same limits and errors as a run
    client = gradio_client.Client(url + "/", verbose=False)
    label, _, overlay = client.predict(gradio_client.handle_file(str(_photos(run)[0])), api_name="/classify")
    assert label["label"] in reference.classes and overlay  # the attention overlay, drawn from the ONNX output
    # Ctrl+C, exit 130 and no torch module loaded: checked as `served` stops the server


@pytest.mark.slow  # servers in other Pythons
def test_a_file_without_the_attention_output_serves_the_page_without_the_overlay_saying_so(run, served):
    gradio_client = pytest.importorskip("gradio_client")
    url = served["plain"]
    assert NO_ATTENTION in httpx.get(url + "/config").text  # the page's one line
    client = gradio_client.Client(url + "/", verbose=False)
    label, table, overlay = client.predict(gradio_client.handle_file(str(_photos(run)[1])), api_name="/classify")
    assert overlay is None and "probability" in table


@pytest.fixture(scope="module")
def browser(chromium):
    pytest.importorskip("playwright", reason="browser test: pip install -e '.[test,serve]' for Playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.mark.slow  # a browser (Debian's Chromium, driven by Playwright: see test_browser.py), on the servers above
def test_the_onnx_page_draws_the_overlay_from_the_files_output_or_says_it_has_none(served, run, browser):
    photo = sorted((run[1] / "test" / "sushi").iterdir())[0]
    for name in ("fp32", "plain"):  # fp32 has the attention output, plain has not
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(served[name] + "/", wait_until="networkidle")
            page.locator("#foodvit-photo input[type=file]").set_input_files(str(photo))
            page.locator("#foodvit-probabilities", has_text="answered in").wait_for(timeout=60_000)
            if name == "fp32":
                page.wait_for_function(
                    "() => { const img = document.querySelector('#foodvit-attention img');"
                    " return img && img.complete && img.naturalWidth >= 224; }",
                    timeout=30_000,
                )
            else:
                assert NO_ATTENTION in page.locator("#foodvit-no-attention").inner_text()
                assert page.locator("#foodvit-attention img").count() == 0
        finally:
            page.close()


def test_serving_a_bad_onnx_file_is_one_line(run, shared_onnx, tmp_path, capsys):
    import onnx

    foreign = tmp_path / "foreign.onnx"
    proto = onnx.load(str(shared_onnx))
    del proto.metadata_props[:]
    onnx.save(proto, str(foreign))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(shared_onnx.read_bytes()[:5000])
    for path, says in (
        (foreign, "not one exported by foodvit"),
        (corrupt, "not a readable ONNX model"),
        (tmp_path / "missing.onnx", "does not exist"),
    ):
        capsys.readouterr()
        assert main(["serve", str(path), "--port", str(free_port())]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow  # starts a server in another Python
def test_an_onnx_space_installs_no_torch_starts_offline_without_it_and_answers_like_the_run(run, tmp_path):
    out, _ = run
    space = tmp_path / "space"
    assert main(["export-space", str(out), str(space), "--onnx", "--examples", "1"]) == 0
    requirements = (space / "requirements.txt").read_text()
    assert "onnxruntime" in requirements and "gradio" in requirements
    assert not any(
        line.startswith(("torch", "torchvision", "timm", "safetensors")) for line in requirements.splitlines()
    )
    assert (space / "model" / "model.onnx").is_file() and not (space / "model" / "model.safetensors").exists()
    card = json.dumps(Predictor.open(space / "model" / "model.onnx").card)
    assert str(run[1]) not in card  # the training data by its name, not where it lay
    port = free_port()
    app = BLOCK_TORCH + "import runpy\nrunpy.run_path('app.py', run_name='__main__')\n"
    process, url = start_server(
        [sys.executable, "-c", app],
        port,
        cwd=space,
        env={"GRADIO_SERVER_PORT": str(port), "PYTHONPATH": "", "FOODVIT_DATA": ""},
    )
    try:
        photo = _photos(run)[2]
        answer = httpx.post(url + "/predict", files={"file": (photo.name, photo.read_bytes())}, timeout=60).json()
        expected = Predictor.from_run(out).classify(photo)
        assert answer["label"] == expected["label"]
        for name, p in expected["probabilities"].items():
            assert answer["probabilities"][name] == pytest.approx(p, abs=1e-4)
    finally:
        stop_server(process)


def test_quantize_without_onnx_is_refused_for_a_space(run, tmp_path, capsys):
    out, _ = run
    assert main(["export-space", str(out), str(tmp_path / "space"), "--quantize", "int8"]) == 2
    err = capsys.readouterr().err
    assert "add --onnx" in err and "Traceback" not in err


def test_an_onnx_space_without_the_runs_photos_at_hand_is_one_line(run, tmp_path, monkeypatch, capsys):
    out, _ = run
    monkeypatch.setattr(Predictor, "photos_at_hand", lambda self, per_class, split="test": [])
    assert main(["export-space", str(out), str(tmp_path / "space"), "--onnx"]) == 2
    err = capsys.readouterr().err
    assert "set FOODVIT_DATA" in err and "Traceback" not in err and not (tmp_path / "space").exists()


@pytest.mark.slow  # two exports and a Space built; the fast tier keeps serve's .onnx checks
def test_an_int8_onnx_space_carries_the_quantised_model_with_its_attention_output(run, tmp_path):
    from foodvit.deploy.onnx_runtime import OnnxBackend

    out, _ = run
    space = tmp_path / "space"
    assert main(["export-space", str(out), str(space), "--onnx", "--quantize", "int8-dynamic", "--examples", "0"]) == 0
    backend = OnnxBackend(space / "model" / "model.onnx")
    assert json.loads(backend.metadata["foodvit.quantize"])["method"] == "dynamic" and backend.has_attention
    assert "torch" not in (space / "requirements.txt").read_text()
