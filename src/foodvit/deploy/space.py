"""`foodvit export-space RUN DIR [--onnx [--quantize int8]]`: a folder ready for a Hugging Face Space.

    DIR/app.py            serves the demo and the API (foodvit.deploy.serve) from model/: `python app.py`
    DIR/requirements.txt  what the Space installs (no torchvision, no timm; with --onnx, no torch either:
                          ONNX Runtime, NumPy, Pillow, Gradio and the server's libraries)
    DIR/model/            model.safetensors + model.json (architecture, classes, preprocessing, metrics;
                          the training data by its name only, not where it lay on the trainer's machine);
                          with --onnx, model.onnx instead: exported --with-attention (the page's overlay),
                          int8 with --quantize (export.py), its card published the same way
    DIR/examples/         a few of the run's test photos
    DIR/foodvit/          this foodvit package itself, so the Space needs nothing unpublished
    DIR/README.md         the Space's metadata (sdk: gradio, app_file: app.py) and a model card

The folder runs offline: app.py listens on 127.0.0.1:7860 unless GRADIO_SERVER_NAME /
GRADIO_SERVER_PORT say otherwise (a Space sets GRADIO_SERVER_NAME=0.0.0.0).
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

from foodvit import markup
from foodvit.errors import RunError
from foodvit.files import atomic_folder, file_above

# what app.py imports at run time, by distribution name
REQUIREMENTS = (
    "torch",
    "numpy",
    "pillow",
    "safetensors",
    "matplotlib",
    "tqdm",
    "filelock",
    "gradio",
    "fastapi",
    "uvicorn",
    "python-multipart",
)
# with --onnx: the model runs in ONNX Runtime, and the server's path imports no PyTorch (an import-linter contract)
ONNX_REQUIREMENTS = ("onnxruntime", "numpy", "pillow", "tqdm", "gradio", "fastapi", "uvicorn", "python-multipart")

APP = '''"""The foodvit demo of this Space: the page at /, POST /predict, GET /health. Run: python app.py"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the foodvit package shipped beside this file
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # nothing leaves the machine but the answers

from foodvit.data.photos import limit_pixels, quiet_exif_warnings  # noqa: E402
from foodvit.deploy.serve import serve  # noqa: E402

if __name__ == "__main__":
    limit_pixels()  # this process serves: Pillow refuses decompression bombs instead of warning
    quiet_exif_warnings()  # a photo whose EXIF block is damaged is answered, with no warning of Pillow's in the log
    examples = sorted(p for p in (HERE / "examples").glob("*") if p.is_file())
    serve({model}, host=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
          port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), example_photos=examples)
'''


def _version(name: str) -> str:
    try:
        return f">={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return ""


def _readme(predictor, classes: list[str], onnx: bool = False) -> str:
    """README.md: the Space's settings (YAML) and its page, every class name quoted in YAML and shown as text in
    Markdown (markup.py): a name is never read as a setting, markup, a link or a picture."""
    from foodvit.deploy.page import model_card

    mini = set(classes) == {"pizza", "steak", "sushi"}
    title = "FoodVision Mini" if mini else f"foodvit: {', '.join(classes[:4])}"
    heading = "FoodVision Mini" if mini else f"foodvit: {', '.join(markup.text(c) for c in classes[:4])}"
    gradio = metadata.version("gradio") if _version("gradio") else "5.0.0"
    return "\n".join(
        [
            "---",
            f"title: {markup.yaml_string(title)}",  # quoted: `title: foodvit: cats, dogs` is no YAML
            "emoji: 🍕",
            "colorFrom: red",
            "colorTo: yellow",
            "sdk: gradio",
            f"sdk_version: {gradio}",
            "app_file: app.py",
            "pinned: false",
            "license: mit",
            "---",
            "",
            f"# {heading}",
            "",
            f"A Vision Transformer trained with foodvit to tell {', '.join(map(markup.text, classes))} apart. The page "
            "takes a photo and shows the probability of each class, the time taken and the attention rollout over the "
            "part of the photo the model saw.",
            "",
            *(["The model runs in ONNX Runtime: the Space installs no PyTorch.", ""] if onnx else []),
            "Run it here: `pip install -r requirements.txt && python app.py`, then open http://127.0.0.1:7860/. "
            "The JSON API: `curl -F file=@photo.jpg http://127.0.0.1:7860/predict`.",
            "",
            model_card(predictor),
            "",
        ]
    )


def published_card(card: dict) -> dict:
    """A model card fit to publish: the training data named (page.data_name), not its local path."""
    from foodvit.deploy.page import data_name

    metrics = dict(card.get("metrics", {}))
    if metrics.get("data"):
        metrics["data"] = data_name(metrics["data"])
    return {**{k: v for k, v in card.items() if k != "params"}, "metrics": metrics}


def export_space(
    run: str | Path, folder: str | Path, examples_per_class: int = 2, onnx: bool = False, quantize: str | None = None
) -> Path:
    """Write the Space folder (new or empty: anything else is refused and left untouched). onnx=True:
    the model as model.onnx with its attention output, quantised as `quantize` asks (export.py)."""
    import foodvit
    from foodvit.deploy.predictor import Predictor

    run, folder = Path(run), Path(folder)
    if quantize and not onnx:
        raise RunError(f"--quantize {quantize} is for an ONNX Space: add --onnx")
    if not (run / "model.safetensors").is_file():
        raise RunError(f"{run} holds no trained model (model.safetensors); export a finished run directory")
    blocker = file_above(folder)
    if blocker is not None:
        raise RunError(f"{blocker} is a file, so {folder} cannot be a folder: choose another --out")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise RunError(
            f"{folder} exists and is not an empty folder; export-space writes only into a new or empty folder"
        )
    predictor = Predictor.from_run(run)
    # named after its class, which is not the photo's folder where a class keeps its photos in subfolders
    examples = [(name, p) for name, photos in predictor.photos_by_class(examples_per_class).items() for p in photos]
    package = Path(foodvit.__file__).parent

    def fill(tmp: Path) -> None:
        (tmp / "model").mkdir()
        if onnx:
            publishable_onnx(run, tmp / "model" / "model.onnx", quantize, predictor)
        else:
            shutil.copy2(run / "model.safetensors", tmp / "model" / "model.safetensors")
            if (run / "model.json").is_file():
                (tmp / "model" / "model.json").write_text(json.dumps(published_card(predictor.card), indent=2))
        (tmp / "examples").mkdir()
        for i, (name, photo) in enumerate(examples):
            shutil.copy2(photo, tmp / "examples" / f"{i:02d}-{name}{photo.suffix.lower()}")
        shutil.copytree(package, tmp / "foodvit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (tmp / "app.py").write_text(APP.format(model='HERE / "model" / "model.onnx"' if onnx else 'HERE / "model"'))
        requirements = ONNX_REQUIREMENTS if onnx else REQUIREMENTS
        (tmp / "requirements.txt").write_text("\n".join(f"{name}{_version(name)}" for name in requirements) + "\n")
        (tmp / "README.md").write_text(_readme(predictor, predictor.classes, onnx))

    return atomic_folder(folder, fill)


def publishable_onnx(run: Path, out: Path, quantize: str | None, predictor) -> dict:
    """The run exported to `out` with its attention output (export.py, checked against the PyTorch
    model as every export is), its card published as model.json's is (published_card)."""
    import onnx

    from foodvit.deploy.export import export

    if not predictor.photos_at_hand(1):
        raise RunError(
            "the .onnx file is checked against the run on the run's test photos, which are not at hand here; "
            "set FOODVIT_DATA to the run's photos"
        )
    result = export(run, out, "onnx", quantize, with_attention=True)  # its parity check on the run's test photos
    proto = onnx.load(str(out))
    card = {**published_card(predictor.card), "params": predictor.card.get("params")}
    for prop in proto.metadata_props:
        if prop.key == "foodvit.card":
            prop.value = json.dumps({k: v for k, v in card.items() if k in ("model", "metrics", "params", "format")})
    onnx.save(proto, str(out))
    return result
