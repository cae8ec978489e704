"""The documentation: the site builds with --strict (every page in the navigation, every link and reference found),
its command-line reference holds every option of every subcommand, the generated pages are current, README's quick
start runs, and nothing dates itself by rounds of work."""

import csv
import functools
import http.server
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import make_photo_folder

from foodvit.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs", reason="the documentation site: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings", reason="the documentation site: pip install -e '.[docs]'")


def load_generate():
    spec = importlib.util.spec_from_file_location("foodvit_docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site built once with `mkdocs build --strict`, which writes nothing but the site: its generated pages are
    made in memory (docs/hooks.py), the committed ones left as they are."""
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    sources = [ROOT / "README.md", *(ROOT / "docs").rglob("*")]
    before = {path: path.stat().st_mtime_ns for path in sources if path.is_file() and "__pycache__" not in path.parts}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    after = [ROOT / "README.md", *(ROOT / "docs").rglob("*")]
    after_times = {
        path: path.stat().st_mtime_ns for path in after if path.is_file() and "__pycache__" not in path.parts
    }
    assert after_times == before, "the build wrote into the working tree"
    return out


def test_the_strict_build_makes_every_page_of_the_navigation(site):
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(config["nav"]))
    sources = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert sources <= listed, f"pages left out of the navigation: {sources - listed}"
    for page in listed:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.is_file(), page


def test_the_command_line_reference_holds_every_option_of_every_subcommand(site):
    import argparse

    html = (site / "reference" / "cli" / "index.html").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices, "the parser has no subcommands"
    for name, command in sub.choices.items():
        assert f"foodvit {name}</h2>" in html or f">foodvit {name}<" in html, name
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):  # -h, --help: every subcommand has it
                continue
            for flag in action.option_strings:
                assert f"<code>{flag}</code>" in html, f"foodvit {name} {flag}"


def test_the_recipes_reference_is_every_built_in_recipe(site):
    from foodvit.recipes import list_recipes

    html = (site / "reference" / "recipes" / "index.html").read_text()
    for name in list_recipes():
        assert f'id="{name}"' in html


def test_the_generated_pages_are_current_and_the_check_fails_when_a_result_changes(tmp_path, monkeypatch, capsys):
    generate = load_generate()
    assert generate.main(["--check"]) == 0, capsys.readouterr().err
    # a changed result makes both committed pages stale
    results, docs = tmp_path / "results", tmp_path / "docs"
    shutil.copytree(ROOT / "results", results)
    docs.mkdir()
    shutil.copy(ROOT / "docs" / "results.md", docs / "results.md")
    shutil.copy(ROOT / "docs" / "index.md", docs / "index.md")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    headline = results / "headline.csv"
    rows = list(csv.DictReader(headline.open(newline="")))
    cv = next(row for row in rows if row["key"] == "vit-cv")
    assert cv["value"] != "0.871"
    cv["value"] = "0.871"
    with headline.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(generate, "RESULTS", results)
    monkeypatch.setattr(generate, "DOCS", docs)
    monkeypatch.setattr(generate, "README", tmp_path / "README.md")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md is not current" in err and "README.md is not current" in err
    assert "docs/index.md is not current" in err
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0
    assert f"0.871 +- {cv['standard_error']}" in (tmp_path / "README.md").read_text()
    assert "0.87 under 5-fold cross-validation" in " ".join((docs / "index.md").read_text().split())


def test_a_results_row_with_an_unquoted_comma_is_refused_not_shifted(tmp_path, monkeypatch):
    generate = load_generate()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results", results)
    studies = results / "studies.csv"
    lines = studies.read_text().splitlines(keepends=True)
    header = next(csv.reader([lines[0]]))
    fields = next(csv.reader([lines[-1]]))
    assert len(fields) == len(header)
    fields[header.index("command")] = "foodvit cv --out x"
    shown = ",".join(f if "," not in f else f'"{f}"' for f in fields)
    studies.write_text(
        "".join(lines[:-1]) + shown.replace("foodvit cv --out x", "foodvit cv --out x (core 0, core 1)") + "\n"
    )
    monkeypatch.setattr(generate, "RESULTS", results)
    with pytest.raises(SystemExit, match=f"results/studies.csv line {len(lines)} has {len(header) + 1} fields where "):
        generate.read("studies")


def test_the_site_asks_no_font_server_so_it_works_offline_and_tells_nobody_of_a_visit(site):
    # Material's default fetches Roboto from fonts.googleapis.com on every page: theme.font: false uses the system's
    pages = [page for page in site.rglob("*.html") if "fonts.googleapis.com" in page.read_text(errors="replace")]
    assert not pages, f"{len(pages)} pages ask Google's font server for fonts, e.g. {pages[0].relative_to(site)}"


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    table = text.split("<!-- results table")[1].split("<!-- end of results table -->")[0]
    assert 1 <= sum(1 for line in table.splitlines() if line.startswith("| ")) - 1 <= 6


def test_no_text_dates_itself_by_rounds_sessions_or_issue_numbers():
    pattern = re.compile(r"([a-z]+(st|nd|rd|th)|[0-9]+(st|nd|rd|th)) session|issue [0-9]+", re.IGNORECASE)
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "bench").rglob("*.py"),
        *(ROOT / "bench").rglob("*.sh"),
        *(ROOT / "results").glob("*"),
    ]
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in files
        if path.is_file()
        for m in pattern.finditer(path.read_text(errors="replace"))
    ]
    assert not found, found


def quick_start() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- quick start")[1].split("<!-- end of quick start -->")[0]
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.startswith("foodvit ")]


@pytest.mark.slow  # a training, a 2-fold CV and an ONNX export: about 20 s; the strict build covers the pages
def test_the_quick_start_runs_on_the_tiny_recipe(tmp_path, monkeypatch, capsys):
    """Each quick-start command of README, in order, on generated photos and the tiny recipe: a training and a
    cross-validation of one epoch at 32 px, two folds. `foodvit serve` is left out (it serves until stopped; the
    server's tests start it)."""
    photos = make_photo_folder(tmp_path / "photos", n_train=6, n_test=3)
    photo = next((photos / "test" / "pizza").iterdir())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FOODVIT_DATA", str(photos))
    tiny = ["--recipe", "tiny", "--epochs", "1", "--image-size", "32", "--depth", "1", "--quiet"]
    commands = quick_start()
    assert [c[1] for c in commands] == [
        "data",
        "train",
        "evaluate",
        "predict",
        "explain",
        "cv",
        "export",
        "predict",
        "serve",
    ]
    for argv in commands[:-1]:
        argv = [str(photo) if a == "photo.jpg" else a for a in argv[1:]]
        if argv[0] in ("train", "cv"):
            argv += tiny
        if argv[0] == "cv":
            argv[argv.index("--folds") + 1] = "2"
        if argv[0] == "export" and importlib.util.find_spec("onnxscript") is None:
            pytest.skip("foodvit export needs the export extra")
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert (tmp_path / "runs/first/report.md").is_file() and (tmp_path / "explain.png").is_file()
    assert (tmp_path / "studies/default/cv.json").is_file() and (tmp_path / "model.onnx").is_file()
    answers = re.findall(re.escape(str(photo)) + r": (pizza|steak|sushi) \(", out)
    assert len(answers) == 2 and answers[0] == answers[1], out  # the run's answer, and the .onnx's the same


@pytest.fixture(scope="module")
def browser(chromium):
    """Chromium, started once for the widths below."""
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("browser test: Playwright, in the test extra (pip install -e '.[test]')")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.mark.slow  # a browser: Chromium's start; the strict build above covers the pages' content
@pytest.mark.parametrize("width", [1280, 390])
def test_the_home_page_and_a_guide_fit_the_screen_in_chromium(browser, site, width):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        for path, heading in [("/", "Getting started"), ("/guides/deploy/", "Export, serve and publish a Space")]:
            response = page.goto(url + path, wait_until="load")
            assert response.status == 200
            assert page.locator("h1").first.inner_text().strip().rstrip("¶").strip() == heading
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"{path} at {width} px is {overflow} px wider than the screen"
    finally:
        page.close()
        server.shutdown()
