"""`foodvit export RUN --format onnx --out model.onnx [--quantize int8]`: a trained run as one file
that predicts without foodvit's PyTorch code.

    onnx              torch.onnx (the dynamo exporter), batch dimension dynamic; class names,
                      preprocessing and the model card in the file's metadata (foodvit.*), so the
                      file alone is enough to predict (onnx_runtime.py, no PyTorch needed)
    onnx + int8       ONNX Runtime's dynamic quantisation (int8 weights, activations quantised
                      on the fly) of the fp32 export
    torchscript       torch.jit.trace; the same metadata as extra files
    exported-program  torch.export; the same metadata as extra files

The destination is checked before anything is loaded: its name must end as its format's files do
(SUFFIXES), an existing file is overwritten only with force=True (--force), and its folder must
take a new file. Every export is checked right away against the PyTorch model on real photos (the run's test photos
when at hand, else the photos given): the largest logit difference relative to the largest logit
is printed; fp32 above 1e-4 fails the export and leaves no file behind. Needs `foodvit[export]`.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import tempfile
import warnings
from pathlib import Path

import numpy as np

from foodvit.errors import FoodVitError
from foodvit.files import atomic_write

FORMATS = ("onnx", "torchscript", "exported-program")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".pt", "exported-program": ".pt2"}  # what opens each file looks for these
QUANTIZE = ("int8",)
PARITY_LIMIT = 1e-4  # fp32: max |logit difference| / max |logit|
PARITY_PHOTOS = 8


class ExportError(FoodVitError, RuntimeError):
    """An export that could not be made or does not give the model's answers."""


def metadata(predictor) -> dict[str, str]:
    """What a file needs to predict on its own: class names, preprocessing, model card (JSON strings)."""
    card = {k: v for k, v in predictor.card.items() if k in ("model", "metrics", "params", "format")}
    return {"foodvit.classes": json.dumps(predictor.classes), "foodvit.preprocess": predictor.preprocess.to_json(),
            "foodvit.card": json.dumps(card), "foodvit.version": "1"}


def parity_inputs(predictor, photos=()) -> np.ndarray:
    """Prepared real photos for the parity check: those given, else the run's test photos."""
    from foodvit.data.photos import load_or_explain

    chosen = [Path(p) for p in photos][:PARITY_PHOTOS]
    if not chosen:
        chosen = predictor.photos_at_hand(max(1, PARITY_PHOTOS // len(predictor.classes)))
    if not chosen:
        raise ExportError("no photos for the parity check: the run's test photos are not at hand; "
                          "name a few with --photos (or set FOODVIT_DATA)")
    return np.stack([predictor.prepare(load_or_explain(p), str(p)) for p in chosen])


def check_destination(out: Path, fmt: str, force: bool = False) -> None:
    """An ExportError, before any work, unless `out` is named as a `fmt` file, is new (or force)
    and its folder takes a new file. Missing folders are created."""
    suffix = SUFFIXES[fmt]
    if out.is_dir():
        raise ExportError(f"--out {out} is a folder; give a file name, e.g. {out / ('model' + suffix)}")
    if out.suffix.lower() != suffix:
        other = next((f for f, s in SUFFIXES.items() if s == out.suffix.lower()), None)
        also = f", or --format {other} to write the file {out.name} is named for" if other else ""
        raise ExportError(f"--out {out}: --format {fmt} writes a {suffix} file, and what opens it looks for that name; "
                          f"use --out {out.with_suffix(suffix)}{also}")
    if out.exists() and not force:
        raise ExportError(f"--out {out} exists; add --force to overwrite it, or choose another name")
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".foodvit-export-check-"):
            pass  # the real test of a place (os.access says yes for root in /sys or on a read-only mount)
    except OSError as err:
        raise ExportError(f"cannot write {out.name} into {folder} ({err.strerror or type(err).__name__}); choose another --out") from None


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: the parity measure (b: the PyTorch model's logits)."""
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-12))


def export(run: str | Path, out: str | Path, fmt: str = "onnx", quantize: str | None = None, opset: int | None = None,
           photos=(), quiet: bool = False, force: bool = False) -> dict:
    """Export a run; returns {"path", "format", "quantize", "bytes", "parity", "agreement"}. An
    existing `out` is overwritten only with force=True."""
    from foodvit.deploy.predictor import Predictor

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if quantize is not None and (quantize not in QUANTIZE or fmt != "onnx"):
        raise ExportError(f"--quantize {quantize} is not available for {fmt}; int8 quantisation is for --format onnx")
    out = Path(out)
    check_destination(out, fmt, force)
    predictor = Predictor.from_run(run)
    inputs = parity_inputs(predictor, photos)
    reference = predictor.logits(inputs).astype(np.float64)
    # written beside --out under a temporary name and checked there: only a file that passed takes the name
    # (with --force, a previous good export survives a failed one)
    staging = out.with_name(f".{out.name}.{secrets.token_hex(4)}.partial{out.suffix}")
    try:
        if fmt == "onnx":
            _export_onnx(predictor, staging, quantize, opset, inputs.shape[-1])
            from foodvit.deploy.onnx_runtime import OnnxBackend

            got = OnnxBackend(staging)(inputs)
        else:
            got = _export_torch(predictor, staging, fmt, inputs)
        parity = relative_difference(got, reference)
        agreement = float((got.argmax(1) == reference.argmax(1)).mean())
        if quantize is None and parity > PARITY_LIMIT:
            raise ExportError(f"the exported model's logits differ from the PyTorch model's by {parity:.2e} (relative), over "
                              f"{PARITY_LIMIT:g}; nothing was written. Report it with the run's model.json")
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return {"path": str(out), "format": fmt, "quantize": quantize, "bytes": out.stat().st_size, "parity": parity,
            "agreement": agreement, "photos": len(inputs)}


def _export_onnx(predictor, out: Path, quantize: str | None, opset: int | None, size: int) -> None:
    import onnx
    import torch

    model = predictor.model.eval()
    example = torch.zeros(2, 3, size, size)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        try:
            program = torch.onnx.export(model, (example,), dynamo=True, verbose=False, input_names=["images"], output_names=["logits"],
                                        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},), opset_version=opset,
                                        external_data=False, optimize=True)
            program.save(str(fp32), external_data=False)
        except Exception as err:
            raise ExportError(f"torch.onnx could not export this model ({type(err).__name__}: {str(err).splitlines()[0][:300]})") from err
        target = fp32
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            target = Path(tmp) / "int8.onnx"
            # it logs generic advice to pre-process the model on the root logger: the command line quiets that
            quantize_dynamic(str(fp32), str(target), weight_type=QuantType.QInt8)
        proto = onnx.load(str(target))
        del proto.metadata_props[:]
        for key, value in metadata(predictor).items():
            proto.metadata_props.add(key=key, value=value)
        proto.doc_string = f"foodvit: {', '.join(predictor.classes)}"
        atomic_write(out, lambda path: onnx.save(proto, str(path)))


def _export_torch(predictor, out: Path, fmt: str, inputs: np.ndarray) -> np.ndarray:
    import torch

    model = predictor.model.eval()
    x = torch.from_numpy(inputs)
    extra = metadata(predictor)
    buffer = io.BytesIO()
    if fmt == "torchscript":
        with warnings.catch_warnings():  # TorchScript is deprecated upstream (torch.export is its successor); it still runs
            warnings.simplefilter("ignore")
            with torch.inference_mode():
                traced = torch.jit.trace(model, x[:1], check_trace=False)
            torch.jit.save(traced, buffer, _extra_files=extra)
            atomic_write(out, lambda path: path.write_bytes(buffer.getvalue()))
            loaded = torch.jit.load(str(out))
    else:
        program = torch.export.export(model, (x[:2],), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
        torch.export.save(program, buffer, extra_files=extra)
        atomic_write(out, lambda path: path.write_bytes(buffer.getvalue()))
        loaded = torch.export.load(str(out)).module()
    with torch.inference_mode():
        return loaded(x).float().numpy()
