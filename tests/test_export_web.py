"""`foodvit export-web`: the page's ONNX graphs against the Python predictor's preprocessing and
overlay, ONNX Runtime Web's files (fetched from a local registry, checked, cached; or given), and the
site folder itself (written whole or not at all). The page in a browser: test_web_browser.py."""

import base64
import hashlib
import io
import json
import re
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from helpers import needs

from foodvit.deploy.web import runtime

pytestmark = needs(
    "onnx", "onnxruntime", why="the page's graphs and export need the export extra: pip install -e '.[export]'"
)


def _photo(size, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    smooth = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.3, 1, h)[:, None, None] * np.array([1.0, 0.6, 0.3])
    noise = rng.integers(0, 40, (h, w, 3))
    return Image.fromarray(np.clip(smooth + noise, 0, 255).astype(np.uint8))


def _session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "preprocess",
    [
        {"image_size": 224, "resize_size": 256},
        {"image_size": 32, "resize_size": 36},
        {
            "image_size": 64,
            "resize_size": 64,
            "mode": "square",
            "mean": (0.485, 0.456, 0.406),
            "std": (0.229, 0.224, 0.225),
        },
        {"image_size": 48, "resize_size": 55, "interpolation": "bicubic"},
    ],
    ids=["crop-224", "crop-32", "square-64", "bicubic-48"],
)
def test_the_preprocessing_graph_computes_what_the_predictor_does_within_one_pixel_level(preprocess):
    from foodvit.data.preprocess import Preprocess, crop_view, to_array
    from foodvit.deploy.web.graphs import preprocess_graph
    from foodvit.deploy.web.site import rgba

    p = Preprocess(**preprocess)
    session = _session(preprocess_graph(p))
    # landscape, portrait, odd margins, smaller than the model's size (enlarged), far larger (reduced 7x)
    for i, size in enumerate([(640, 480), (333, 500), (257, 301), (20, 27), (1600, 1200)]):
        photo = _photo(size, i)
        images, crop = session.run(["images", "crop"], {"pixels": rgba(photo)})
        expected = np.asarray(crop_view(p, photo))
        assert images.shape == (1, 3, p.image_size, p.image_size) and crop.shape == expected.shape, size
        off = np.abs(crop.astype(int) - expected)
        assert off.max() <= 1 and (off > 0).mean() < 0.05, (
            size,
            off.max(),
            (off > 0).mean(),
        )  # rounding, in a few pixels
        # the normalisation is the same float32 arithmetic: exact on the same crop
        assert np.abs(images[0] - to_array(p, photo)).max() <= 1.01 / 255 / min(p.std), size


def test_the_overlay_graph_draws_what_the_served_page_draws():
    from foodvit.deploy.web.graphs import overlay_graph
    from foodvit.viz.overlay import overlay_array

    rng = np.random.default_rng(0)
    crop = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    heat = rng.random((4, 4)).astype(np.float32)
    drawn = _session(overlay_graph(32, 4)).run(["overlay"], {"crop": crop, "heat": heat})[0]
    assert drawn.shape == (32, 32, 4) and (drawn[..., 3] == 255).all()
    assert np.abs(drawn[..., :3].astype(int) - overlay_array(crop, heat)).max() <= 1  # float32 here, float64 there


# ------------------------------------------------------------------------------ ONNX Runtime Web's files


def _tarball(contents: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in contents.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


FAKE = {f"dist/{name}": f"// {name}\n".encode() for name in runtime.FILES}
FAKE_SHA256 = {name.removeprefix("dist/"): hashlib.sha256(data).hexdigest() for name, data in FAKE.items()}


@pytest.fixture
def registry(tmp_path):
    """A local npm registry (127.0.0.1) serving onnxruntime-web-0.0.0-test.tgz: (url, tarball bytes, requests seen)."""
    data = _tarball({**FAKE, "package.json": b'{"name": "onnxruntime-web"}'})
    folder = tmp_path / "registry" / "onnxruntime-web" / "-"
    folder.mkdir(parents=True)
    (folder / "onnxruntime-web-0.0.0-test.tgz").write_bytes(data)
    seen = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            seen.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(tmp_path / "registry")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", data, seen
    server.shutdown()
    server.server_close()


def test_the_files_come_from_the_registry_once_checked_then_from_the_cache(registry, tmp_path, monkeypatch):
    url, data, seen = registry
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    fake = {"version": "0.0.0-test", "integrity": _integrity(data), "hashes": FAKE_SHA256, "quiet": True}
    folder = runtime.runtime_files(registry=url, **fake)
    assert sorted(p.name for p in folder.iterdir()) == sorted(runtime.FILES)
    assert all((folder / n).read_bytes() == FAKE[f"dist/{n}"] for n in runtime.FILES)
    assert seen == ["/onnxruntime-web/-/onnxruntime-web-0.0.0-test.tgz"]
    again = runtime.runtime_files(registry="http://127.0.0.1:9", **fake)
    assert again == folder and len(seen) == 1  # the cache answered: no second request (port 9 would refuse)
    (folder / runtime.FILES[-1]).write_bytes(b"changed since")
    assert runtime.runtime_files(registry=url, **fake) == folder and len(seen) == 2  # fetched again, not used
    assert (folder / runtime.FILES[-1]).read_bytes() == FAKE[f"dist/{runtime.FILES[-1]}"]


def test_a_tarball_that_is_not_the_published_one_is_refused_and_nothing_is_cached(registry, tmp_path, monkeypatch):
    url, data, _ = registry
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(runtime.RuntimeFilesError, match="not onnxruntime-web .* as published"):
        runtime.runtime_files(version="0.0.0-test", integrity=_integrity(data + b"x"), registry=url, quiet=True)
    assert not (tmp_path / "cache" / "onnxruntime-web").exists() or not any(
        (tmp_path / "cache" / "onnxruntime-web").rglob("*")
    )


def test_a_cache_that_cannot_be_written_is_one_line(registry, tmp_path, monkeypatch):
    url, data, _ = registry
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(runtime.RuntimeFilesError, match="set FOODVIT_CACHE to a folder you can write"):
        runtime.runtime_files(version="0.0.0-test", integrity=_integrity(data), registry=url, quiet=True)


def test_an_unreachable_registry_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    from helpers import free_port

    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(runtime.REGISTRY_ENV, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(runtime.RuntimeFilesError) as caught:
        runtime.runtime_files(version="0.0.0-test", quiet=True)
    message = str(caught.value)
    assert "\n" not in message and "cannot download onnxruntime-web" in message and "--ort-web" in message


def test_local_files_are_found_in_a_folder_or_a_checked_tarball(tmp_path, monkeypatch):
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "node_modules" / "onnxruntime-web" / "dist"
    package.mkdir(parents=True)
    for name in runtime.FILES:
        (package / name).write_bytes(FAKE[f"dist/{name}"])
    assert runtime.runtime_files(tmp_path, hashes=FAKE_SHA256) == package
    assert runtime.runtime_files(package.parent, hashes=FAKE_SHA256) == package
    with pytest.raises(runtime.RuntimeFilesError, match="is not onnxruntime-web .*'s as published"):
        runtime.runtime_files(package, hashes={name: "0" * 64 for name in runtime.FILES})  # another package's
    (package / runtime.FILES[-1]).unlink()
    with pytest.raises(runtime.RuntimeFilesError, match="does not hold onnxruntime-web's"):
        runtime.runtime_files(tmp_path, hashes=FAKE_SHA256)
    with pytest.raises(runtime.RuntimeFilesError, match="does not exist"):
        runtime.runtime_files(tmp_path / "nowhere")
    data = _tarball(FAKE)
    (tmp_path / "ort.tgz").write_bytes(data)
    folder = runtime.runtime_files(tmp_path / "ort.tgz", version="0.0.0-test", integrity=_integrity(data))
    assert sorted(p.name for p in folder.iterdir()) == sorted(runtime.FILES)
    with pytest.raises(runtime.RuntimeFilesError, match="as published"):
        runtime.runtime_files(tmp_path / "ort.tgz")  # the pinned version's hash: this one is not it


# ------------------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def fake_runtime(tmp_path_factory):
    """A dist/ folder as npm's package has it: the page's three files among others it does not need. While it is
    in use, its files' hashes stand for the pinned package's (runtime.SHA256)."""
    folder = tmp_path_factory.mktemp("ort-web")
    for name in runtime.FILES:
        (folder / name).write_bytes(FAKE[f"dist/{name}"])
    (folder / "ort.webgpu.min.js").write_text("// not for the page")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "SHA256", FAKE_SHA256)
        yield folder


def test_export_web_refuses_before_writing_anything(shared_run, tmp_path, monkeypatch, capsys):
    from helpers import free_port

    from foodvit.cli.main import main

    run, _ = shared_run
    monkeypatch.setenv("FOODVIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(runtime.REGISTRY_ENV, f"http://127.0.0.1:{free_port()}")
    for options in ([], ["--ort-web", str(tmp_path / "nowhere")]):
        assert main(["export-web", str(run), "--out", str(tmp_path / "site"), *options]) == 2
        err = capsys.readouterr().err.strip()
        errors = [line for line in err.splitlines() if "error:" in line]  # beside it, at most the download's note
        assert len(errors) == 1 and "onnxruntime-web" in errors[0] and "Traceback" not in err, err
        assert {p.name for p in tmp_path.iterdir()} <= {"cache"}  # no site, no half-written one under another name
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    assert main(["export-web", str(run), "--out", str(tmp_path / "taken")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]


def test_a_failure_while_writing_leaves_nothing(shared_run, fake_runtime, tmp_path, monkeypatch):
    from foodvit.deploy import space
    from foodvit.deploy.web.site import export_web

    def broken(*args, **kwargs):
        (args[1]).write_bytes(b"half a model")
        raise space.RunError("the export failed")

    monkeypatch.setattr(space, "publishable_onnx", broken)
    with pytest.raises(space.RunError, match="the export failed"):
        export_web(shared_run[0], tmp_path / "site", ort_web=fake_runtime, quiet=True)
    assert list(tmp_path.iterdir()) == []  # neither the site nor its folder under a temporary name


@pytest.fixture(scope="module")
def site(shared_run, fake_runtime, tmp_path_factory):
    """The site exported through the command line, its model int8: {"path", "agreement", "output"}."""
    import contextlib

    from foodvit.cli.main import main

    out = tmp_path_factory.mktemp("web") / "site"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert (
            main(
                [
                    "export-web",
                    str(shared_run[0]),
                    "--out",
                    str(out),
                    "--ort-web",
                    str(fake_runtime),
                    "--quantize",
                    "int8",
                ]
            )
            == 0
        )
    output = printed.getvalue()
    found = re.search(r"same top class as foodvit predict on (\d+)% of (\d+) test photos", output)
    assert found, output
    return {
        "path": str(out),
        "agreement": {"agreement": int(found.group(1)) / 100, "photos": int(found.group(2))},
        "output": output,
    }


@pytest.mark.slow  # an ONNX export and its int8 quantisation (seconds); the graphs and the files are covered above
def test_the_site_holds_the_page_the_model_its_graphs_and_the_runtime(site, shared_run):
    from pathlib import Path

    folder = Path(site["path"])
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert [n for n in names if not n.startswith("examples/")] == sorted(
        [
            "README.md",
            "foodvit.js",
            "foodvit.json",
            "index.html",
            "model.onnx",
            "overlay.onnx",
            "preprocess.onnx",
            "style.css",
            *(f"ort/{n}" for n in runtime.FILES),
        ]
    )
    config = json.loads((folder / "foodvit.json").read_text())
    assert config["classes"] == ["pizza", "steak", "sushi"] and config["precision"] == "int8"
    assert (
        sorted(config["examples"]) == [n for n in names if n.startswith("examples/")] and len(config["examples"]) == 3
    )
    card = dict(config["card"])
    assert str(shared_run[1]) not in json.dumps(config)  # the data set by its name, not where it lies here
    assert card["training data"].startswith("photos") and "int8 ONNX" in card["model file"]
    html = (folder / "index.html").read_text() + (folder / "foodvit.js").read_text()
    assert (
        "http://" not in html.replace("http://localhost:8000/", "") and "https://" not in html
    )  # nothing fetched from elsewhere
    readme = (folder / "README.md").read_text()
    assert "python -m http.server" in readme and "GitHub Pages" in readme
    assert site["agreement"]["photos"] == 9 and site["agreement"]["agreement"] == 1.0
    assert "python -m http.server" in site["output"]


@pytest.mark.slow  # uses the exported site (above)
def test_the_pages_path_gives_predicts_probabilities(site, shared_run):
    from pathlib import Path

    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.web.site import PagePath

    page, predictor = PagePath(Path(site["path"])), Predictor.from_run(shared_run[0])
    for photo in sorted((shared_run[1] / "test").rglob("*.jpg"))[:4]:
        probabilities, attention, crop = page(load_or_explain(photo))
        expected = predictor.classify(photo)["probabilities"]
        assert (
            np.abs(probabilities - np.array([expected[c] for c in predictor.classes])).max() < 0.05
        )  # int8 against fp32
        assert attention.shape == (4, 4) and abs(float(attention.sum()) - 1) < 1e-3
        assert crop.shape == (32, 32, 3)


@pytest.mark.parametrize("label", ["mac#cheese", "what?", "50%", "plain"])
def test_an_example_photos_url_names_its_file_whatever_its_class(label):
    from urllib.parse import unquote, urlsplit

    from foodvit.deploy.web.site import example_file

    name, url = example_file(3, label, Path("test") / label / "phone" / "1.JPG")
    assert name == f"examples/03-{label}.jpg"
    assert unquote(urlsplit(url).path) == name  # what a browser asks the server for is the file itself


def test_the_command_ships_fp32_unless_asked_for_int8(shared_run, tmp_path, monkeypatch, capsys):
    from foodvit.cli.main import main
    from foodvit.deploy.web import site as web_site

    asked = []

    def recorded(run, out, **options):
        asked.append(options["quantize"])
        return {"path": str(out), "bytes": 0, "model_bytes": 0, "agreement": {"photos": 0}}

    monkeypatch.setattr(web_site, "export_web", recorded)
    assert main(["export-web", str(shared_run[0]), "--out", str(tmp_path / "a")]) == 0
    assert main(["export-web", str(shared_run[0]), "--out", str(tmp_path / "b"), "--quantize", "int8"]) == 0
    assert asked == [None, "int8"]
    capsys.readouterr()
    assert main(["export-web", str(shared_run[0]), "--out", str(tmp_path / "my site")]) == 0
    assert f"cd '{tmp_path / 'my site'}' && python -m http.server" in capsys.readouterr().out  # pasted as one path


def test_the_sites_readme_shows_class_and_folder_names_as_text():
    from helpers import HOSTILE_CLASSES, rendered_markdown

    from foodvit.deploy.web.site import site_readme

    config = {"classes": list(HOSTILE_CLASSES), "runtime": "onnxruntime-web 0.0.0-test", "precision": "fp32"}
    readme = rendered_markdown(site_readme(config, "my <img src=x> site", "9 test photos"))
    assert readme.pictures == [] and readme.links == [] and "em" not in readme.tags
    assert readme.text.startswith(f"foodvit: {', '.join(HOSTILE_CLASSES)}\n")
    assert "cd 'my <img src=x> site' && python -m http.server 8000" in readme.text  # quoted for the shell


@pytest.mark.slow  # an ONNX export (seconds); the README's words are checked above, the page sets names as text
def test_a_site_for_classes_named_as_html_keeps_them_text_in_its_readme_and_page(shared_run, fake_runtime, tmp_path):
    from helpers import HOSTILE_CLASSES, renamed_run, rendered_markdown

    from foodvit.cli.main import main

    run, _ = renamed_run(shared_run, tmp_path)
    assert main(["export-web", str(run), "--out", str(tmp_path / "site"), "--ort-web", str(fake_runtime)]) == 0
    readme = rendered_markdown((tmp_path / "site" / "README.md").read_text())
    assert readme.pictures == [] and readme.links == []
    assert readme.text.startswith(f"foodvit: {', '.join(HOSTILE_CLASSES)}\n")
    config = json.loads((tmp_path / "site" / "foodvit.json").read_text())
    assert config["classes"] == list(HOSTILE_CLASSES)  # the page sets them with textContent: as they are
    assert dict(config["card"])["classes"] == ", ".join(HOSTILE_CLASSES)
    script = (tmp_path / "site" / "foodvit.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script


@pytest.mark.slow  # an ONNX export (seconds); export-space's examples from subfolders are checked in test_serve
def test_a_sites_examples_come_from_class_folders_with_subfolders_named_after_the_class(
    shared_run, fake_runtime, tmp_path
):
    from helpers import CLASSES, renamed_run

    from foodvit.deploy.web.site import export_web

    run, _ = renamed_run(shared_run, tmp_path, CLASSES, sub="phone")  # test/pizza/phone/000.jpg, ...
    export_web(run, tmp_path / "site", ort_web=fake_runtime, quiet=True)
    config = json.loads((tmp_path / "site" / "foodvit.json").read_text())
    names = ["00-pizza.jpg", "01-steak.jpg", "02-sushi.jpg"]
    assert config["examples"] == [f"examples/{name}" for name in names]  # there had been none
    assert sorted(p.name for p in (tmp_path / "site" / "examples").iterdir()) == names


def test_a_folder_whose_runtime_was_changed_by_one_byte_is_refused_before_anything_is_written(
    shared_run, tmp_path, monkeypatch, capsys
):
    from foodvit.cli.main import main

    monkeypatch.setattr(runtime, "SHA256", FAKE_SHA256, raising=False)  # the fake package's files stand for the real
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in runtime.FILES:
        (dist / name).write_bytes(FAKE[f"dist/{name}"] + (b"\0" if name.endswith(".wasm") else b""))
    # the WebAssembly one byte longer: it had been copied, and export had said the page agreed with predict
    assert main(["export-web", str(shared_run[0]), "--out", str(tmp_path / "site"), "--ort-web", str(dist)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "ort-wasm-simd-threaded.wasm is not onnxruntime-web" in err and "as published" in err
    assert not (tmp_path / "site").exists()


def test_the_command_says_the_agreement_was_measured_in_pythons_onnx_runtime_not_the_browsers(
    shared_run, tmp_path, monkeypatch, capsys
):
    from foodvit.cli.main import main
    from foodvit.deploy.web import site as web_site

    measured = {"photos": 9, "agreement": 1.0, "max_difference": 0.001}
    monkeypatch.setattr(
        web_site,
        "export_web",
        lambda run, out, **options: {"path": str(out), "bytes": 0, "model_bytes": 0, "agreement": measured},
    )
    assert main(["export-web", str(shared_run[0]), "--out", str(tmp_path / "site")]) == 0
    said = capsys.readouterr().out
    assert "in Python's ONNX Runtime" in said and "same top class as foodvit predict on 100% of 9 test photos" in said
    readme = web_site.site_readme(
        {"classes": ["a", "b"], "runtime": "onnxruntime-web 1", "precision": "fp32"}, "site", "100% of 9 test photos"
    )
    assert "by Python's ONNX Runtime" in readme  # ONNX Runtime Web itself runs only in a browser


def test_the_pages_limits_are_predicts_and_it_lists_only_what_a_browser_decodes(shared_run, tmp_path):
    from foodvit.data.photos import MAX_ASPECT
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.web.site import page_config

    (tmp_path / "model.onnx").write_bytes(b"a model")
    limits = page_config(Predictor.from_run(shared_run[0]), tmp_path / "model.onnx", 4, [], None)["limits"]
    assert limits["max_aspect"] == MAX_ASPECT  # predict refuses a photo over 20 times as long as wide: so does the page
    assert "TIFF" not in limits["accepted"] and not any("tif" in kind for kind in limits["types"])
    assert {"image/jpeg", "image/png", "image/webp"} <= set(limits["types"])
