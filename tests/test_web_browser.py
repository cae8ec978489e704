"""The page of `foodvit export-web` in a real browser: Debian's Chromium driven by Playwright, the
site served by a static file server on 127.0.0.1 and every other request refused.

It needs ONNX Runtime Web's real files, which no test downloads: `make ort-web` (`.ci/run` does it)
fetches the pinned package with npm into .cache/npm/, or FOODVIT_ORT_WEB names the package's .tgz or
its dist/ folder. Without them, or without Chromium, the tests skip and say why, or fail under CI=true.
"""

import functools
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from helpers import missing_tool

from foodvit.deploy.web.runtime import VERSION

ORT_WEB = Path(
    os.environ.get("FOODVIT_ORT_WEB") or Path(__file__).parents[1] / ".cache" / "npm" / f"onnxruntime-web-{VERSION}.tgz"
)
if find_spec("playwright") is None or find_spec("onnxruntime") is None:
    pytest.skip("web page test: pip install -e '.[test,export]' for Playwright and the export", allow_module_level=True)


@pytest.fixture(scope="module")
def ort_web() -> Path:
    """ONNX Runtime Web's package; missing, the tests skip, or fail under CI=true (helpers.missing_tool)."""
    if not ORT_WEB.exists():
        missing_tool(
            f"web page test: no onnxruntime-web {VERSION} at {ORT_WEB}; fetch it with `make ort-web` (needs npm), or "
            "set FOODVIT_ORT_WEB to its .tgz or dist/ folder"
        )
    return ORT_WEB


# the two programs first, before the export: without either each test skips, or fails under CI=true
pytestmark = pytest.mark.usefixtures("chromium", "ort_web")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(shared_run, ort_web, tmp_path_factory):
    """(url, folder): the exported site (fp32, as shipped) served on 127.0.0.1 by a plain static file server."""
    from foodvit.deploy.web.site import export_web

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FOODVIT_CACHE", str(cache))  # the tarball is unpacked into a cache of the test's own
        folder = Path(
            export_web(shared_run[0], tmp_path_factory.mktemp("web") / "site", ort_web=ort_web, quiet=True)["path"]
        )
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", folder
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, url: str, viewport: dict, elsewhere: list):
    """The page at `url`, every request to another origin refused (and noted in `elsewhere`), loaded."""
    page = browser.new_page(viewport=viewport)

    def only_the_site(route):
        if route.request.url.startswith(url):
            return route.continue_()
        elsewhere.append(route.request.url)
        return route.abort()

    page.route("**/*", only_the_site)
    page.goto(url)
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=60_000)
    assert page.evaluate("document.body.dataset.state") == "ready", page.locator("#error").inner_text()
    return page


def upload(page, path, answers: int) -> str:
    """Give the page a photo; 'done' (the answers-th answer shown) or 'error'."""
    page.locator("#photo").set_input_files(str(path))
    page.wait_for_function(
        f"() => document.body.dataset.state === 'error' || document.body.dataset.answers === '{answers}'",
        timeout=60_000,
    )
    return page.evaluate("document.body.dataset.state")


# a browser and an export: about 20 s; the page's computation is checked in Python in test_export_web
@pytest.mark.slow
@pytest.mark.parametrize(
    "viewport", [{"width": 1280, "height": 900}, {"width": 390, "height": 844}], ids=["desktop", "phone"]
)
def test_the_page_answers_as_predict_draws_the_overlay_and_needs_no_network(site, shared_run, browser, viewport):
    from foodvit.deploy.predictor import Predictor

    run, photos = shared_run
    predictor = Predictor.from_run(run)
    elsewhere: list[str] = []
    page = open_page(browser, site[0], viewport, elsewhere)
    try:
        tested = sorted((photos / "test").rglob("*.jpg"))
        for i, photo in enumerate(tested, 1):
            assert upload(page, photo, i) == "done", page.locator("#error").inner_text()
            shown = page.evaluate("window.foodvit.last")
            expected = predictor.classify(photo)["probabilities"]
            assert max(abs(shown["probabilities"][c] - p) for c, p in expected.items()) < 2e-3, (photo, shown, expected)
            ranked = sorted(expected.values(), reverse=True)
            if ranked[0] - ranked[1] > 2e-3:  # only an exact near-tie may swap under the browser's own rounding
                assert shown["label"] == max(expected, key=expected.get), (photo, shown, expected)
        labels = page.locator("#classes li")
        assert labels.count() == 3 and labels.first.get_attribute("data-label") == shown["label"]
        drawn = page.evaluate(
            "() => { const c = document.getElementById('overlay'); const d = c.getContext('2d')"
            ".getImageData(0, 0, c.width, c.height).data; let lo = 255, hi = 0;"
            " for (let i = 0; i < d.length; i += 4) { lo = Math.min(lo, d[i + 2]); hi = Math.max(hi, d[i + 2]); }"
            " return [c.width, !document.getElementById('attention').hidden, hi - lo]; }"
        )
        assert drawn[0] == 32 and drawn[1] and drawn[2] > 20  # the overlay is shown, with a map over it, not blank
        assert "Model card" in page.locator("#card").inner_text() and "fp32 ONNX" in page.locator("#card").inner_text()
        width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1] + 1, f"the page scrolls sideways at {viewport['width']} px: {width}"
        assert elsewhere == []
    finally:
        page.close()


@pytest.mark.slow  # a browser (uses the site above)
def test_a_bad_photo_is_one_line_and_the_page_goes_on(site, shared_run, browser, tmp_path):
    from PIL import Image

    (tmp_path / "notes.jpg").write_text("not a photo at all")
    (tmp_path / "empty.jpg").write_bytes(b"")
    Image.new("1", (8000, 6250)).save(tmp_path / "huge.png")  # 50 megapixels, a small file
    elsewhere: list[str] = []
    page = open_page(browser, site[0], {"width": 1280, "height": 900}, elsewhere)
    try:
        expected = {
            "notes.jpg": "notes.jpg is not an image",
            "empty.jpg": "empty.jpg is empty (0 bytes)",
            "huge.png": "huge.png is 8000 x 6250 = 50 megapixels, over the page's limit of 40 megapixels",
        }
        for name, start in expected.items():
            assert upload(page, tmp_path / name, 1) == "error"
            line = page.locator("#error").inner_text()
            assert line.startswith(start) and "\n" not in line, line
        good = sorted((shared_run[1] / "test" / "pizza").iterdir())[0]
        assert upload(page, good, 1) == "done" and page.locator("#error").is_hidden()
        assert elsewhere == []
    finally:
        page.close()


@pytest.mark.slow  # a browser (uses the site above)
def test_opened_from_disk_the_page_says_how_to_serve_it(site, browser):
    page = browser.new_page()
    try:
        page.goto((site[1] / "index.html").as_uri())
        page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=30_000)
        assert "python -m http.server" in page.locator("#error").inner_text()
    finally:
        page.close()


@pytest.mark.slow  # a browser (uses the site above)
def test_the_browser_decodes_as_pillow_does_upright_and_over_white(site, shared_run, browser, tmp_path):
    from PIL import Image

    from foodvit.data.photos import load_rgb
    from foodvit.data.preprocess import crop_view
    from foodvit.deploy.predictor import Predictor

    preprocess = Predictor.from_run(shared_run[0]).preprocess
    source = load_rgb(sorted((shared_run[1] / "test" / "sushi").iterdir())[0]).resize((80, 56))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: shown turned 90 degrees clockwise
    source.save(tmp_path / "sideways.jpg", exif=exif, quality=95)
    rgba = source.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(source.size))  # transparent at the top, opaque at the bottom
    rgba.save(tmp_path / "transparent.png")
    page = open_page(browser, site[0], {"width": 1280, "height": 900}, [])
    try:
        for i, name in enumerate(["sideways.jpg", "transparent.png"], 1):
            assert upload(page, tmp_path / name, i) == "done", page.locator("#error").inner_text()
            seen = np.array(page.evaluate("Array.from(window.foodvit.crop)"), dtype=int).reshape(32, 32, 3)
            expected = np.asarray(crop_view(preprocess, load_rgb(tmp_path / name)), dtype=int)
            assert np.abs(seen - expected).max() <= 2, name  # the same pixels, to the resize's rounding
    finally:
        page.close()


@pytest.mark.slow  # a browser (uses the site above); the page's limits in foodvit.json: test_export_web
def test_the_page_refuses_what_predict_refuses_lists_what_it_decodes_and_clears_an_answer_after_an_error(
    site, shared_run, browser, tmp_path
):
    from PIL import Image

    from foodvit.data.photos import PhotoError, check_shape

    Image.new("RGB", (30000, 1), (200, 90, 40)).save(tmp_path / "strip.png")  # refused by predict from its header
    Image.new("RGB", (64, 48), (200, 90, 40)).save(tmp_path / "photo.tiff")  # Chromium decodes no TIFF
    with pytest.raises(PhotoError) as refused:
        check_shape("strip.png", (30000, 1), 50_000_000)
    page = open_page(browser, site[0], {"width": 1280, "height": 900}, [])
    try:
        good = sorted((shared_run[1] / "test" / "pizza").iterdir())[0]
        assert upload(page, good, 1) == "done" and page.locator("#classes li").count() == 3
        assert upload(page, tmp_path / "strip.png", 2) == "error"
        assert page.locator("#error").inner_text() == str(refused.value)  # predict's words, one rule in both
        # the previous photo's answer is no longer shown beside the error
        assert page.locator("#classes li").count() == 0 and page.locator("#attention").is_hidden()
        assert page.locator("#timing").inner_text() == "" and page.evaluate("window.foodvit.last") is None
        assert upload(page, tmp_path / "photo.tiff", 2) == "error"
        line = page.locator("#error").inner_text()
        assert line.startswith("photo.tiff is not an image this browser can read") and "TIFF" not in line, line
        assert "TIFF" not in page.locator("#photo").get_attribute("accept").upper()
    finally:
        page.close()
