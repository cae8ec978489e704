"""The demo page in a real browser: Debian's Chromium driven by Playwright for Python, headless.

Enable on a machine without it: `apt-get install -y chromium` (.ci/run does this) and the test
extra (`pip install -e '.[test,serve]'`, which make test installs). Playwright's own browser
download is never used: the test points Playwright at /usr/bin/chromium. Without Chromium the tests
skip, saying so, or fail under CI=true. The page of an .onnx file in the browser is test_serve_onnx's, on the
servers it starts.
"""

import os
import re
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest

if find_spec("playwright") is None or find_spec("gradio") is None:  # found, not imported: collecting stays light
    pytest.skip("browser test: pip install -e '.[test,serve]' for Playwright and the server", allow_module_level=True)

import httpx  # noqa: E402

# Chromium first, before any server starts: without it each test skips, or fails under CI=true (conftest's chromium)
pytestmark = pytest.mark.usefixtures("chromium")


@pytest.fixture(scope="module")
def served(shared_run, shared_server):
    return shared_server, shared_run[1]  # the server test_serve uses too, and the run's photos


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def _shown_probabilities(page) -> dict[str, float]:
    rows = page.locator("#foodvit-probabilities table tbody tr")
    return {
        rows.nth(i).locator("td").nth(0).inner_text().strip(): float(rows.nth(i).locator("td").nth(1).inner_text())
        for i in range(rows.count())
    }


@pytest.mark.slow  # a browser: Chromium's start and Gradio's page; the HTTP tests cover the answers
@pytest.mark.parametrize(
    "viewport", [{"width": 1280, "height": 900}, {"width": 390, "height": 844}], ids=["desktop", "phone"]
)
def test_upload_shows_the_same_answer_as_the_api(served, browser, viewport, tmp_path):
    url, photos = served
    photo = sorted((photos / "test" / "steak").iterdir())[0]
    answer = httpx.post(url + "/predict", files={"file": (photo.name, photo.read_bytes())}, timeout=60).json()
    page = browser.new_page(viewport=viewport)
    try:
        page.goto(url + "/", wait_until="networkidle")
        page.locator("#foodvit-photo input[type=file]").set_input_files(str(photo))
        page.locator("#foodvit-probabilities", has_text="answered in").wait_for(timeout=60_000)
        shown = _shown_probabilities(page)
        assert set(shown) == set(answer["probabilities"])
        for name, p in answer["probabilities"].items():
            assert shown[name] == pytest.approx(p, abs=0.0005 + 1e-9)  # shown to three decimals
        assert max(shown, key=shown.get) == answer["label"]
        assert re.search(rf"\b{answer['label']}\b", page.locator("#foodvit-label").inner_text())
        page.wait_for_function(
            "() => { const img = document.querySelector('#foodvit-attention img');"
            " return img && img.complete && img.naturalWidth >= 224; }",
            timeout=30_000,
        )  # the overlay is drawn
        assert "Model card" in page.locator("#foodvit-card").inner_text()
        width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1] + 1, f"the page scrolls sideways at {viewport['width']} px: {width}"
        shot = tmp_path / f"page-{viewport['width']}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        if os.environ.get("FOODVIT_SCREENSHOTS"):
            target = Path(os.environ["FOODVIT_SCREENSHOTS"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, target / shot.name)
    finally:
        page.close()


@pytest.mark.slow  # a browser; the HTTP test (test_serve) checks the Markdown the page is sent
def test_class_names_that_are_html_stay_text_in_the_browser_and_fetch_nothing(shared_run, browser, tmp_path):
    from helpers import HOSTILE_CLASSES, ServerThread, renamed_run

    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.serve import create_app, run_examples

    run, photos = renamed_run(shared_run, tmp_path)
    predictor = Predictor.from_run(run)
    app, _ = create_app(predictor, examples=run_examples(predictor))
    (tmp_path / "x&lt;b&gt;y.jpg").write_text("not a photo")  # Gradio shows an error's message as HTML
    with ServerThread(app) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        elsewhere, dialogs = [], []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

        def only_the_server(route):
            if route.request.url.startswith(url):
                return route.continue_()
            elsewhere.append(route.request.url)  # <img src=https:evil.example> asks https://evil.example/
            return route.abort()

        page.route("**/*", only_the_server)
        try:
            page.goto(url + "/", wait_until="networkidle")
            photo = sorted((photos / "test" / HOSTILE_CLASSES[2]).iterdir())[0]
            page.locator("#foodvit-photo input[type=file]").set_input_files(str(photo))
            page.locator("#foodvit-probabilities", has_text="answered in").wait_for(timeout=60_000)
            pictures = page.evaluate("Array.from(document.querySelectorAll('img'), img => img.getAttribute('src'))")
            assert not [src for src in pictures if src == "x" or "evil" in src], pictures
            names = ", ".join(HOSTILE_CLASSES)
            assert page.locator("h1").first.inner_text().startswith(f"foodvit: {names}")
            assert f"classes: {names}" in page.locator("#foodvit-card").inner_text()
            cells = page.locator("#foodvit-probabilities td").all_inner_texts()
            assert sorted(cells[0::2]) == sorted(HOSTILE_CLASSES) and len(cells) == 6
            assert sorted(HOSTILE_CLASSES) == sorted(page.locator("#foodvit-label").inner_text().split("\n")[2::2])
            page.locator("#foodvit-photo input[type=file]").set_input_files(str(tmp_path / "x&lt;b&gt;y.jpg"))
            toast = page.locator("[data-testid='toast-body']").first
            toast.wait_for(timeout=30_000)
            assert "x&lt;b&gt;y.jpg is not an image" in toast.inner_text()  # the file's name as it is
            assert elsewhere == [] and dialogs == []
        finally:
            page.close()
