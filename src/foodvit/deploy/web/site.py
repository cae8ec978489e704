"""`foodvit export-web RUN --out site/`: the demo as a folder of static files; the photo is classified
in the visitor's browser by ONNX Runtime Web, and never leaves it.

    site/index.html, foodvit.js, style.css   the page (package data: deploy/web/assets/)
    site/foodvit.json      classes, preprocessing, the model card, the page's limits, the examples
    site/model.onnx        the run exported with its attention output (export.py), fp32 unless quantized
    site/preprocess.onnx   photo pixels -> the model's input and its crop (graphs.py): Pillow's
                           resize, crop and normalisation, run by the same runtime as the model
    site/overlay.onnx      the attention map over the crop, as viz.overlay draws it (graphs.py)
    site/ort/              ONNX Runtime Web's JavaScript and WebAssembly (runtime.py), copied in
    site/examples/         a few of the run's test photos
    site/README.md         how to open it locally and how to publish it

The folder is written under a temporary name beside --out and renamed when complete: a failure
leaves nothing. Before renaming, the page's path (preprocess.onnx, then model.onnx) is run in
Python's ONNX Runtime on the run's test photos and compared with `foodvit predict` on the run
(ONNX Runtime Web itself runs only in a browser: its files are checked against the published
package's hashes instead, runtime.py; the page in Chromium is tests/test_web_browser.py).
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import numpy as np

from foodvit.errors import RunError

ASSETS = ("index.html", "foodvit.js", "style.css")
# the page refuses photos over this many pixels before decoding them: a canvas of the whole photo
# costs 4 bytes a pixel in the tab (a 40-megapixel photo, 160 MB)
MAX_MEGAPIXELS = 40.0
MAX_FILE_MB = 50.0
# what a browser decodes (Chromium, Firefox and Safari alike), where foodvit's Python also reads TIFF (photos.ACCEPTED)
PAGE_ACCEPTED = "a JPEG, PNG, WebP, BMP or GIF photo"
PAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/gif")  # the file chooser's
AGREEMENT_PHOTOS = 8  # test photos a class on which the export compares the page's path with predict


def rgba(photo) -> np.ndarray:
    """A PIL RGB photo as the page hands it to preprocess.onnx: uint8 (H, W, 4), opaque."""
    pixels = np.asarray(photo, dtype=np.uint8)
    return np.concatenate([pixels, np.full(pixels.shape[:2] + (1,), 255, np.uint8)], axis=2)


class PagePath:
    """The page's computation, run in Python's ONNX Runtime: photo -> (probabilities, attention map, crop)."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime as ort

        def session(name: str):
            return ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])

        self.preprocess, self.model = session("preprocess.onnx"), session("model.onnx")

    def __call__(self, photo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from foodvit.deploy.predictor import softmax

        images, crop = self.preprocess.run(["images", "crop"], {"pixels": rgba(photo)})
        logits, attention = self.model.run(["logits", "attention"], {"images": images})
        return softmax(logits)[0], attention[0], crop


def agreement(folder: Path, predictor, photos) -> dict:
    """The page's path against the Predictor on `photos`: {"photos", "agreement" (same top class,
    0-1), "max_difference" (largest probability difference)}."""
    from foodvit.data.photos import load_or_explain

    page = PagePath(folder)
    same, worst = 0, 0.0
    for path in photos:
        photo = load_or_explain(path)
        mine = page(photo)[0]
        theirs = predictor.probabilities(predictor.prepare(photo, str(path))[None])[0]
        same += int(mine.argmax() == theirs.argmax())
        worst = max(worst, float(np.abs(mine - theirs).max()))
    return {"photos": len(photos), "agreement": same / max(len(photos), 1), "max_difference": worst}


def example_file(i: int, label: str, photo: Path) -> tuple[str, str]:
    """Where the site keeps its i-th example photo, of class `label` (in the name, as the page shows it), and the
    page's URL of it, percent-encoded so that a class named 'mac#cheese' or '50%' stays one file name."""
    name = f"examples/{i:02d}-{label}{photo.suffix.lower()}"
    return name, quote(name)


def check_out(out: Path) -> None:
    from foodvit.files import file_above

    blocker = file_above(out)
    if blocker is not None:
        raise RunError(f"{blocker} is a file, so --out {out} cannot be a folder: choose another --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunError(
            f"--out {out} exists and is not an empty folder; export-web writes only into a new or empty folder"
        )


def page_config(predictor, model_file: Path, grid: int, examples: list[str], quantize: str | None) -> dict:
    """foodvit.json: what the page needs to know besides the three graphs."""
    from foodvit.data.photos import MAX_ASPECT
    from foodvit.deploy.page import card_rows
    from foodvit.deploy.space import published_card
    from foodvit.deploy.web.runtime import VERSION

    published = SimpleNamespace(
        card={**published_card(predictor.card), "params": predictor.card.get("params")},
        classes=predictor.classes,
        preprocess=predictor.preprocess,
    )
    precision = "int8" if quantize else "fp32"
    size = (
        f"{precision} ONNX, {model_file.stat().st_size / 1e6:.1f} MB, run by ONNX Runtime Web {VERSION} in this browser"
    )
    rows = [*card_rows(published, code=str), ("model file", size)]
    return {
        "title": f"foodvit: {', '.join(predictor.classes)}",
        "classes": predictor.classes,
        "preprocess": json.loads(predictor.preprocess.to_json()),
        "grid": grid,
        "card": rows,
        "limits": {
            "max_megapixels": MAX_MEGAPIXELS,
            "max_file_mb": MAX_FILE_MB,
            "max_aspect": MAX_ASPECT,  # predict's rule (photos.check_shape), from the photo's header as there
            "accepted": PAGE_ACCEPTED,
            "types": list(PAGE_TYPES),
        },
        "examples": examples,
        "precision": precision,
        "runtime": f"onnxruntime-web {VERSION}",
    }


README = """# {title}

A static web page: a Vision Transformer trained with foodvit classifies photos in the browser, and
the photo never leaves the visitor's machine. ONNX Runtime Web ({runtime}, WebAssembly) runs the
model; every file the page needs is in this folder, and it makes no other request.

## Open it on this machine

Browsers do not load WebAssembly from `file://`, so serve the folder over HTTP:

    cd {folder} && python -m http.server 8000

then open http://localhost:8000/.

## Publish it

Copy the folder to any static web host: nothing runs on the server.

- GitHub Pages: push the folder's files to a repository (or its `docs/` folder, or a `gh-pages`
  branch) and turn Pages on under Settings > Pages.
- Any web server (nginx, Apache, S3, Netlify, an intranet share): upload the files as they are;
  `.wasm` should be served as `application/wasm` (most servers do).

## What is here

| file | what |
|---|---|
| index.html, foodvit.js, style.css | the page |
| model.onnx | the model ({precision}), with its attention rollout output |
| preprocess.onnx | the photo's resize, centre crop and normalisation, as foodvit's Python predictor does them |
| overlay.onnx | the attention map drawn over the part of the photo the model saw |
| foodvit.json | class names, preprocessing, the model card, the page's limits |
| ort/ | ONNX Runtime Web {runtime_version} (MIT licence, Microsoft), from the npm package `onnxruntime-web` |
| examples/ | a few test photos |

Measured at export: the page's three graphs, run by Python's ONNX Runtime, gave the same top class
as `foodvit predict` on {agreement}. ONNX Runtime Web itself runs only in a browser; its files in
ort/ are the published package's, checked against their hashes.
"""


def site_readme(config: dict, folder: str, agreement: str) -> str:
    """README.md of the site (README): its title from the class names and the folder's name as text, never as markup
    (markup.py); the folder's name quoted for the shell in the command that serves it."""
    import shlex

    from foodvit import markup
    from foodvit.deploy.web.runtime import VERSION

    return README.format(
        title=f"foodvit: {', '.join(markup.text(name) for name in config['classes'])}",
        runtime=config["runtime"],
        folder=shlex.quote(folder) if folder.isprintable() else "SITE",  # an indented code block: one line
        precision=config["precision"],
        runtime_version=VERSION,
        agreement=agreement,
    )


def export_web(
    run: str | Path,
    out: str | Path,
    *,
    quantize: str | None = None,
    ort_web: str | Path | None = None,
    examples_per_class: int = 1,
    quiet: bool = False,
) -> dict:
    """Write the site folder (new or empty, else refused untouched); returns {"path", "bytes", "model_bytes",
    "agreement" (see agreement()), "quantization"}. quantize: as export's (None: fp32). ort_web: where
    ONNX Runtime Web's files are (runtime.runtime_files; default the cache, else the npm registry)."""
    import onnx

    from foodvit.deploy.onnx_runtime import OnnxBackend
    from foodvit.deploy.predictor import Predictor
    from foodvit.deploy.space import publishable_onnx
    from foodvit.deploy.web.graphs import overlay_graph, preprocess_graph
    from foodvit.deploy.web.runtime import FILES as RUNTIME_FILES
    from foodvit.deploy.web.runtime import runtime_files
    from foodvit.files import atomic_folder

    run, out = Path(run), Path(out)
    check_out(out)
    runtime = runtime_files(ort_web, quiet=quiet)  # first: without it there is no page
    predictor = Predictor.from_run(run)
    per_class = max(examples_per_class, AGREEMENT_PHOTOS)
    by_class = predictor.photos_by_class(per_class)
    test_photos = [photo for photos in by_class.values() for photo in photos]
    result: dict = {}

    def fill(tmp: Path) -> None:
        exported = publishable_onnx(run, tmp / "model.onnx", quantize, predictor)  # checked against the run (export.py)
        size = predictor.preprocess.image_size
        maps = OnnxBackend(tmp / "model.onnx").attention(np.zeros((1, 3, size, size), np.float32))
        assert maps is not None, "publishable_onnx exports the attention output"
        grid = maps.shape[-1]
        onnx.save(preprocess_graph(predictor.preprocess), str(tmp / "preprocess.onnx"))
        onnx.save(overlay_graph(size, grid), str(tmp / "overlay.onnx"))
        (tmp / "ort").mkdir()
        for name in RUNTIME_FILES:  # only these: a package's dist/ holds a hundred more (WebGPU, WebGL, source maps)
            shutil.copy2(runtime / name, tmp / "ort" / name)
        (tmp / "examples").mkdir()
        examples = []
        chosen = [(label, p) for label, photos in by_class.items() for p in photos[:examples_per_class]]
        for i, (label, photo) in enumerate(chosen):
            name, url = example_file(i, label, photo)
            shutil.copy2(photo, tmp / name)
            examples.append(url)
        assets = resources.files("foodvit.deploy.web") / "assets"
        for name in ASSETS:
            (tmp / name).write_bytes((assets / name).read_bytes())
        config = page_config(predictor, tmp / "model.onnx", grid, examples, quantize)
        (tmp / "foodvit.json").write_text(json.dumps(config, indent=1))
        measured = agreement(tmp, predictor, test_photos)
        words = (
            (
                f"{measured['agreement']:.0%} of {measured['photos']} test photos (largest probability difference "
                f"{measured['max_difference']:.3f})"
            )
            if measured["photos"]
            else "no test photos (none at hand)"
        )
        (tmp / "README.md").write_text(site_readme(config, out.name, words))
        result.update(
            agreement=measured,
            quantization=exported.get("quantization"),
            model_bytes=(tmp / "model.onnx").stat().st_size,
        )

    atomic_folder(out, fill)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"path": str(out), "bytes": total, **result}
