"""`foodvit export RUN --format onnx --out model.onnx [--quantize int8]`: a trained run as one file
that predicts without foodvit's PyTorch code.

    onnx              torch.onnx (the dynamo exporter), batch dimension dynamic; class names,
                      preprocessing and the model card in the file's metadata (foodvit.*), so the
                      file alone is enough to predict (onnx_runtime.py, no PyTorch needed)
    + with_attention  a second output, "attention": the attention rollout over the patch grid
                      (B, grid, grid) as `foodvit explain` draws it (viz.attention.pooled_rollout),
                      computed in the graph, so that the demo page draws its overlay without PyTorch;
                      checked against PyTorch's within 1e-4 (fp32), named in foodvit.outputs
    onnx + int8       ONNX Runtime's int8 quantisation of the fp32 export, dynamic or static (QDQ,
                      calibrated on the run's training photos), chosen by measurement (quantize.py);
                      what was chosen and the figures in foodvit.quantize
    torchscript       torch.jit.trace; the same metadata as extra files
    exported-program  torch.export; the same metadata as extra files

The destination is checked before anything is loaded: its name must end as its format's files do
(SUFFIXES), an existing file is overwritten only with force=True (--force), and its folder must
take a new file. Every export is checked right away against the PyTorch model on real photos (the photos
given, at most PARITY_PHOTOS, else a few of the run's test photos of each class): the largest logit
difference relative to the largest logit is printed; fp32 above 1e-4 fails the export and leaves no file
behind. Needs `foodvit[export]`.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from foodvit.errors import FoodVitError
from foodvit.files import atomic_write, temporary_name

FORMATS = ("onnx", "torchscript", "exported-program")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".pt", "exported-program": ".pt2"}  # what opens each file looks for these
QUANTIZE = ("int8", "int8-dynamic", "int8-static")  # int8: whichever of the two measures better (quantize.py)
PARITY_LIMIT = 1e-4  # fp32: max |logit difference| / max |logit|
ATTENTION_LIMIT = 1e-4  # fp32: max |rollout difference| (the maps sum to 1 over the patches)
PARITY_PHOTOS = 8


class ExportError(FoodVitError, RuntimeError):
    """An export that could not be made or does not give the model's answers."""


def metadata(predictor, with_attention: bool = False, quantization: dict | None = None) -> dict[str, str]:
    """What a file needs to predict on its own: class names, preprocessing, model card (JSON strings);
    its outputs (logits, and the attention rollout with_attention) and how it was quantised."""
    card = {k: v for k, v in predictor.card.items() if k in ("model", "metrics", "params", "format")}
    outputs = ["logits", "attention"] if with_attention else ["logits"]
    meta = {
        "foodvit.classes": json.dumps(predictor.classes),
        "foodvit.preprocess": predictor.preprocess.to_json(),
        "foodvit.card": json.dumps(card),
        "foodvit.version": "1",
        "foodvit.outputs": json.dumps(outputs),
    }
    if with_attention:
        meta["foodvit.attention"] = (
            "attention rollout (Abnar & Zuidema 2020) over the patch grid, (batch, grid, grid), "
            "read out as the model pools: the map foodvit explain draws"
        )
    if quantization:
        meta["foodvit.quantize"] = json.dumps(quantization)
    return meta


def parity_inputs(predictor, photos=()) -> np.ndarray:
    """Prepared real photos for the parity check: the first PARITY_PHOTOS of those given, else a few of the run's
    test photos of each class (PARITY_PHOTOS // classes, at least one)."""
    from foodvit.data.photos import load_or_explain

    chosen = [Path(p) for p in photos][:PARITY_PHOTOS]
    if not chosen:
        chosen = predictor.photos_at_hand(max(1, PARITY_PHOTOS // len(predictor.classes)))
    if not chosen:
        raise ExportError(
            "no photos for the parity check: the run's test photos are not at hand; "
            "name a few with --photos (or set FOODVIT_DATA)"
        )
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
        raise ExportError(
            f"--out {out}: --format {fmt} writes a {suffix} file, and what opens it looks for that name; "
            f"use --out {out.with_suffix(suffix)}{also}"
        )
    if out.exists() and not force:
        raise ExportError(f"--out {out} exists; add --force to overwrite it, or choose another name")
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".foodvit-export-check-"):
            pass  # the real test of a place (os.access says yes for root in /sys or on a read-only mount)
    except OSError as err:
        raise ExportError(
            f"cannot write {out.name} into {folder} ({err.strerror or type(err).__name__}); choose another --out"
        ) from None


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: the parity measure (b: the PyTorch model's logits)."""
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-12))


def export(
    run: str | Path,
    out: str | Path,
    fmt: str = "onnx",
    quantize: str | None = None,
    opset: int | None = None,
    photos=(),
    quiet: bool = False,
    force: bool = False,
    with_attention: bool = False,
) -> dict:
    """Export a run; returns {"path", "format", "quantize", "bytes", "parity", "agreement", "photos",
    "attention" (the largest rollout difference, with_attention), "quantization" (quantize.py's
    figures and choice)}. An existing `out` is overwritten only with force=True."""
    from foodvit.deploy.predictor import Predictor

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if quantize is not None and (quantize not in QUANTIZE or fmt != "onnx"):
        raise ExportError(f"--quantize {quantize} is not available for {fmt}; int8 quantisation is for --format onnx")
    if with_attention and fmt != "onnx":
        raise ExportError(f"--with-attention is for --format onnx; {fmt} files give the logits only")
    out = Path(out)
    check_destination(out, fmt, force)
    predictor = Predictor.from_run(run)
    inputs = parity_inputs(predictor, photos)
    reference = predictor.logits(inputs).astype(np.float64)
    # written beside --out under a temporary name and checked there: only a file that passed takes the name
    # (with --force, a previous good export survives a failed one)
    staging = temporary_name(out, f".partial{out.suffix}")
    attention, quantization = None, None
    try:
        if fmt == "onnx":
            quantization = _export_onnx(predictor, staging, quantize, opset, inputs, with_attention)
            backend = _loaded(staging, out, opset)
            got = backend(inputs)
            if with_attention:
                exported, reference_maps = backend.attention(inputs), predictor.attention_maps(inputs)
                assert exported is not None and reference_maps is not None  # a ViT exported --with-attention
                attention = float(np.abs(exported.astype(np.float64) - reference_maps).max())
        else:
            got = _export_torch(predictor, staging, fmt, inputs)
        parity = relative_difference(got, reference)
        agreement = float((got.argmax(1) == reference.argmax(1)).mean())
        if quantize is None and parity > PARITY_LIMIT:
            raise ExportError(
                f"the exported model's logits differ from the PyTorch model's by {parity:.2e} (relative), over "
                f"{PARITY_LIMIT:g}; nothing was written. Report it with the run's model.json"
            )
        if quantize is None and attention is not None and attention > ATTENTION_LIMIT:
            raise ExportError(
                f"the exported attention rollout differs from the PyTorch model's by {attention:.2e}, over "
                f"{ATTENTION_LIMIT:g}; nothing was written. Report it with the run's model.json"
            )
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return {
        "path": str(out),
        "format": fmt,
        "quantize": quantize,
        "bytes": out.stat().st_size,
        "parity": parity,
        "agreement": agreement,
        "photos": len(inputs),
        "attention": attention,
        "quantization": quantization,
    }


def _loaded(staging: Path, out: Path, opset: int | None):
    """The exported file opened in ONNX Runtime, or an ExportError that says why it cannot be (an opset newer than
    the installed ONNX Runtime runs, most often), naming the file as `out`, not as the temporary file, which is
    removed."""
    import onnxruntime

    from foodvit.deploy.onnx_runtime import OnnxBackend
    from foodvit.errors import RunError

    try:
        return OnnxBackend(staging)
    except RunError as err:
        cause = err.__context__ or err  # ONNX Runtime's own error, behind OnnxBackend's words for a user's file
        said = str(cause).replace(str(staging), str(out))  # ONNX Runtime's own text names the file it loaded
        why = f"{type(cause).__name__}: {said.splitlines()[0][:200]}" if said else type(cause).__name__
        what = (
            f"give a lower --opset (ONNX Runtime {onnxruntime.__version__} may not run opset {opset} yet), or none "
            "for the exporter's own"
            if opset
            else "report it with the run's model.json"
        )
        raise ExportError(
            f"the exported model does not load in ONNX Runtime ({why}); nothing was written: {what}"
        ) from None


def _export_onnx(
    predictor, out: Path, quantize: str | None, opset: int | None, inputs: np.ndarray, with_attention: bool = False
) -> dict | None:
    """Write the .onnx file (with its metadata) to `out`; returns the quantisation's figures (quantize.py) or None."""
    import onnx
    import torch

    model = predictor.model.eval()
    size = inputs.shape[-1]
    example = torch.zeros(2, 3, size, size)
    if with_attention:
        model = _with_attention(model)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        try:
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                verbose=False,
                input_names=["images"],
                output_names=["logits", "attention"] if with_attention else ["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
                opset_version=opset,
                external_data=False,
                optimize=True,
            )
            assert program is not None  # dynamo=True always returns the ONNXProgram
            program.save(str(fp32), external_data=False)
        except Exception as err:
            raise ExportError(
                f"torch.onnx could not export this model ({type(err).__name__}: {str(err).splitlines()[0][:300]})"
            ) from err
        target, quantization = fp32, None
        if quantize is not None:
            from foodvit.deploy.quantize import quantize_int8

            target = Path(tmp) / "int8.onnx"
            # it logs generic advice to pre-process the model on the root logger: the command line quiets that
            quantization = quantize_int8(fp32, target, quantize, predictor, inputs)
        proto = onnx.load(str(target))
        del proto.metadata_props[:]
        for key, value in metadata(predictor, with_attention, quantization).items():
            proto.metadata_props.add(key=key, value=value)
        proto.doc_string = f"foodvit: {', '.join(predictor.classes)}"
        atomic_write(out, lambda path: onnx.save(proto, str(path)))
    return quantization


def _with_attention(model):
    """The model with a second output: its attention rollout maps (B, grid, grid), computed in the
    graph as `foodvit explain` computes them (viz.attention.pooled_rollout)."""
    import torch

    from foodvit.viz.attention import pooled_rollout

    class WithAttention(torch.nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, images):
            tokens, attentions = self.model.forward_intermediates(images, attention=True)  # every block's
            return self.model.forward_head(tokens), pooled_rollout(self.model, tokens, attentions)

    return WithAttention(model).eval()


def _export_torch(predictor, out: Path, fmt: str, inputs: np.ndarray) -> np.ndarray:
    import torch

    model = predictor.model.eval()
    x = torch.from_numpy(inputs)
    extra = metadata(predictor)
    buffer = io.BytesIO()
    if fmt == "torchscript":
        # TorchScript is deprecated upstream (torch.export is its successor); it still runs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.inference_mode():
                traced = torch.jit.trace(model, x[:1], check_trace=False)
            torch.jit.save(traced, buffer, _extra_files=extra)
            atomic_write(out, lambda path: path.write_bytes(buffer.getvalue()))
            loaded = torch.jit.load(str(out))
    else:
        program = torch.export.export(
            model, (x[:2],), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},)
        )
        torch.export.save(program, buffer, extra_files=extra)
        atomic_write(out, lambda path: path.write_bytes(buffer.getvalue()))
        loaded = torch.export.load(str(out)).module()
    with torch.inference_mode():
        return loaded(x).float().numpy()
