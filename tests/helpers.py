"""Helpers shared by the tests."""

from contextlib import contextmanager
from importlib.util import find_spec

import pytest
import torch

from foodvit.training import report

DRAW_FIGURES = report.draw_figures  # the real one, before conftest switches it off for the suite


def no_figures(*args, **kwargs) -> dict:
    """report.draw_figures for the suite's trainings: no figure (conftest's _no_report_figures)."""
    return {}


@contextmanager
def report_figures():
    """Runs trained inside the block draw the report's figures, as outside the suite."""
    previous, report.draw_figures = report.draw_figures, DRAW_FIGURES
    try:
        yield
    finally:
        report.draw_figures = previous


def assert_drawn_png(path) -> None:
    """path is a PNG of more than 50 px a side with something drawn on it (dark on light, not blank)."""
    from PIL import Image

    with Image.open(path) as picture:
        low, high = picture.convert("L").getextrema()
        assert picture.format == "PNG" and min(picture.size) > 50 and high - low > 100, path


def needs(*modules: str, why: str):
    """A module-level skip mark for an optional extra, found without importing it: collecting the suite
    (every xdist worker collects every module, the fast tier's deselected ones too) then imports no
    Gradio, ONNX or Playwright; the tests that use them import them when they run."""
    missing = [m for m in modules if find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{why} (missing: {', '.join(missing)})")


def in_ci() -> bool:
    """CI=true (as CI services set it, and .ci/run): the machine is meant to have every tool the suite drives."""
    import os

    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_tool(reason: str) -> None:
    """A program the full suite drives is not here (Chromium, PostgreSQL, ONNX Runtime Web): the test skips, saying
    why, on a developer's machine; under CI=true it fails, since .ci/run installs them and a run that skipped them
    would pass without having tested what they test."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: .ci/run installs it, so it must be here)", pytrace=False)
    pytest.skip(reason)


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values (reference libraries zero some, e.g. the head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_norm_scale = p.ndim == 1 and ("ln" in name or "norm" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_norm_scale else 0.05 * noise)
    return module


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


CLASSES = ("pizza", "steak", "sushi")
_COLOURS = {"pizza": (220, 60, 40), "steak": (110, 60, 30), "sushi": (240, 240, 235)}


def make_photo(path, colour, size=(40, 48), seed=0, mode="RGB", fmt=None):
    """A small photo: a class colour with a darker square somewhere and some noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    pixels = np.empty((h, w, 3), dtype=np.float64)
    pixels[:] = colour
    y, x = rng.integers(0, h // 2), rng.integers(0, w // 2)
    pixels[y : y + h // 3, x : x + w // 3] *= 0.5
    pixels += rng.normal(0, 12, pixels.shape)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    if mode != "RGB":
        image = image.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format=fmt)
    return path


def damaged_exif_photo(path, size=(40, 48)):
    """A JPEG whose EXIF block says two entries and holds one (as one of the seven-class test photos
    does): the photo decodes, and Pillow's TIFF parser warns "Corrupt EXIF data" on reading the block."""
    import struct

    from PIL import Image

    entries = struct.pack("<H", 2) + struct.pack("<HHII", 0x0112, 3, 1, 1)
    Image.new("RGB", size, (200, 40, 40)).save(path, exif=b"Exif\x00\x00II*\x00" + struct.pack("<I", 8) + entries)
    return path


def make_photo_folder(root, n_train=12, n_test=6, classes=CLASSES, size=(40, 48)):
    """A FoodVision-like ImageFolder tree of generated JPEGs: root/{train,test}/<class>/*.jpg."""
    for split, n in (("train", n_train), ("test", n_test)):
        for c, name in enumerate(classes):
            for i in range(n):
                seed = 1000 * c + i + (500 if split == "test" else 0)
                make_photo(root / split / name / f"{i:03d}.jpg", _COLOURS.get(name, (30 * c, 90, 160)), size, seed)
    return root


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], port: int, cwd=None, env=None, timeout: float = 120.0, ready: str = "/health"):
    """Start a server process and wait until GET `ready` answers; (process, base URL). The caller
    stops it (stop_server). The process's output goes to a temporary file, quoted in the failure
    message and removed by stop_server."""
    process = launch_server(command, cwd, env)
    return process, wait_for_server(process, port, timeout, ready)


def launch_server(command: list[str], cwd=None, env=None):
    """The server process of start_server, started and not waited for (wait_for_server): servers launched one
    after another start side by side. Its output goes to a temporary file (server_output)."""
    import os
    import subprocess
    import tempfile

    log = tempfile.NamedTemporaryFile("w+", prefix="foodvit-server-", suffix=".log", delete=False)
    process = subprocess.Popen(
        command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
    )
    process.log_path = log.name
    log.close()
    return process


def server_output(process) -> str:
    """The end of what a launch_server process wrote (its output file's name first)."""
    with open(process.log_path) as log:
        return f"(output in {process.log_path}):\n{log.read()[-3000:]}"


def wait_for_server(process, port: int, timeout: float = 120.0, ready: str = "/health") -> str:
    """Wait until GET `ready` of a launch_server process answers 200: its base URL; killed, and a RuntimeError
    quoting its output, if it exits or does not answer within `timeout` seconds."""
    import time

    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} {server_output(process)}")
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"server did not answer within {timeout:.0f} s {server_output(process)}")


def stop_server(process) -> None:
    """Stop a server from start_server and remove its output file."""
    import os

    process.terminate()
    try:
        process.wait(timeout=15)
    except Exception:
        process.kill()
    if getattr(process, "log_path", None):
        try:
            os.unlink(process.log_path)
        except OSError:
            pass


class ServerThread:
    """An ASGI app served by uvicorn in a thread of the test process on 127.0.0.1 (for what a test
    must configure beyond the command line); `with ServerThread(app) as url: ...`."""

    def __init__(self, app) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server thread did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


# Python code that makes importing torch, torchvision or timm fail from then on, in the process that runs it
BLOCK_TORCH = (
    "import builtins, sys\n"
    "real = builtins.__import__\n"
    "def guard(name, *args, **kwargs):\n"
    "    if name.split('.')[0] in ('torch', 'torchvision', 'timm'):\n"
    "        raise ImportError('torch is not installed here')\n"
    "    return real(name, *args, **kwargs)\n"
    "builtins.__import__ = guard\n"
)


def without_torch(argv: list[str]) -> list[str]:
    """The command line of `foodvit ARGV` in a fresh Python where importing torch, torchvision or
    timm fails, checking at the end that none was loaded (for a server: start_server(without_torch(...)))."""
    import sys

    script = (
        BLOCK_TORCH + "from foodvit.cli.main import main\n"
        f"code = main({list(map(str, argv))!r})\n"
        "assert not any(m.split('.')[0] == 'torch' for m in sys.modules), 'torch was imported'\n"
        "sys.exit(code)\n"
    )
    return [sys.executable, "-c", script]


def run_without_torch(argv: list[str], timeout: float = 120.0):
    """`foodvit ARGV` without torch (see without_torch), run to its end: the proof that a path is
    torch-free (subprocess.CompletedProcess)."""
    import subprocess

    return subprocess.run(without_torch(argv), capture_output=True, text=True, timeout=timeout)


def library_messages_on_stderr() -> None:
    """The library's logging messages (logger "foodvit") as plain lines on standard error, at INFO, as the
    command line shows them: for a test that calls the library and reads what it says (capsys' err)."""
    from foodvit.cli.main import build_parser, configure_logging

    configure_logging(build_parser().parse_args(["models"]))


# class names that are markup: as HTML, a live element (the first) and a picture fetched from another site (the
# second); in Markdown, emphasis, a table's cell border and a heading (the third)
HOSTILE_CLASSES = ("<img src=x onerror=alert(1)>", "<img src=https:evil.example>", 'mac & "cheese": #1 | *best*')


def renamed_run(shared_run, folder, classes=HOSTILE_CLASSES, sub: str = ""):
    """(run, photos): a copy of shared_run's model whose classes are named `classes` (in its classes' order), and
    a copy of its photos in class folders of those names (in a subfolder `sub` of each, if given), which the
    copy's card names as its data."""
    import json
    import shutil

    run, photos = shared_run
    card = json.loads((run / "model.json").read_text())
    data = folder / "photos"
    for split in ("train", "test"):
        for before, after in zip(card["classes"], classes, strict=True):
            shutil.copytree(photos / split / before, data / split / after / sub)
    renamed = folder / "run"
    renamed.mkdir()
    shutil.copy(run / "model.safetensors", renamed / "model.safetensors")
    card["classes"], card["metrics"]["data"] = list(classes), str(data)
    (renamed / "model.json").write_text(json.dumps(card))
    return renamed, data


def rendered_markdown(text: str):
    """Markdown as a CommonMark renderer with HTML on (GitHub's, Hugging Face's, Gradio's) makes it: .tags (element
    names, in order), .pictures (each <img>'s src), .links (each <a>'s href) and .text (what a reader sees)."""
    from html.parser import HTMLParser

    markdown_it = pytest.importorskip("markdown_it", reason="the Markdown renderer: pip install markdown-it-py")

    class Rendered(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.tags: list[str] = []
            self.pictures: list[str | None] = []
            self.links: list[str | None] = []
            self.text = ""

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "img":
                self.pictures.append(dict(attrs).get("src"))
            if tag == "a":
                self.links.append(dict(attrs).get("href"))

        def handle_data(self, data):
            self.text += data

    page = Rendered()
    page.feed(markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text))
    return page
