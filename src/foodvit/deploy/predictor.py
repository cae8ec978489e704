"""The Predictor: a trained model, its preprocessing and its class names, behind one interface.

Everything that uses a trained model goes through it: `foodvit predict` and `evaluate`, `explain`,
the server (serve.py) and the exports. A photo (a PIL image, the bytes of an image file, or a
path) is decoded and checked by photos.py, preprocessed by preprocess.py (Pillow and NumPy), and
classified by a backend: a function from a float32 batch (B, 3, S, S) to logits (B, classes).

    predictor = Predictor.from_run("runs/demo")
    predictor.classify("pizza.jpg")       # {"label", "probability", "probabilities", "top_k", "seconds"}
    predictor.classify_many([b1, b2])     # one forward pass for the batch

This module imports no PyTorch itself: the PyTorch backend loads it when a run is opened, so that
a backend without PyTorch (ONNX Runtime) can use the same Predictor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from foodvit.data.photos import PHOTO_LIMIT, PhotoError, decode
from foodvit.data.preprocess import Preprocess, to_array
from foodvit.errors import ConfigError, InputError

Logits = Callable[[np.ndarray], np.ndarray]


@runtime_checkable
class AttentionBackend(Protocol):
    """A backend that can also give attention rollout maps: TorchBackend, OnnxBackend."""

    @property
    def has_attention(self) -> bool: ...

    def __call__(self, batch: np.ndarray) -> np.ndarray: ...

    def attention(self, batch: np.ndarray) -> np.ndarray | None: ...


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (stable: the row maximum subtracted first)."""
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def exported_kind(path: str | Path) -> str | None:
    """'ONNX', 'TorchScript' or 'torch.export' for a file `foodvit export` writes, else None."""
    import zipfile

    path = Path(path)
    if path.suffix.lower() == ".onnx":
        return "ONNX"
    if not path.is_file() or not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    # TorchScript keeps the model's code
    if any("/code/__torch__/" in n or n.endswith("/constants.pkl") for n in names):
        return "TorchScript"
    if any(n.endswith("/archive_format") for n in names):  # torch.export's archive (.pt2)
        return "torch.export"
    return None


def check_not_exported(path: str | Path) -> None:
    """A RunError that says what reads an exported file, where a run directory (PyTorch) is needed."""
    from foodvit.errors import RunError

    kind = exported_kind(path)
    if kind == "ONNX":
        raise RunError(
            f"{path} is an ONNX export: foodvit predict, evaluate and serve take it; this command needs the "
            "trained run directory (or its model.safetensors) it was exported from"
        )
    if kind is not None:
        load = "torch.jit.load(path)" if kind == "TorchScript" else "torch.export.load(path).module()"
        fmt = "torchscript" if kind == "TorchScript" else "exported-program"
        raise RunError(
            f"{path} is a {kind} export (foodvit export --format {fmt}), "
            f"which foodvit does not read back: use the run directory it was exported from, or an .onnx export "
            f"(foodvit export RUN --out model.onnx), or load it in PyTorch with {load}"
        )


class Predictor:
    """Photos in, class probabilities out, for one trained model.

    backend: a function from a float32 array (B, 3, S, S) to logits (B, len(classes)), or a
    PyTorch module (wrapped in TorchBackend). `model` is the PyTorch module when there is one
    (explain and the pictures need it), else None. `card`: what is known about the model (its
    model.json: architecture, classes, preprocessing, final metrics).
    """

    def __init__(self, backend, classes: Sequence[str], preprocess: Preprocess, card: dict | None = None) -> None:
        if not callable(backend) or hasattr(backend, "parameters"):  # a PyTorch module
            # only for a PyTorch model: the ONNX path never loads torch
            from foodvit.deploy.torch_backend import TorchBackend

            backend = TorchBackend(backend)
        self.model = getattr(backend, "model", None)  # the PyTorch module when there is one (explain, pictures)
        self.backend: Logits = backend
        self.classes = list(classes)
        self.preprocess = preprocess
        self.card = dict(card or {})

    @classmethod
    def from_run(cls, run: str | Path, device=None) -> Predictor:
        """The trained model of a run directory (or a foodvit .safetensors file with its model.json).
        An exported file (ONNX, TorchScript, torch.export) is refused with what reads it."""
        from foodvit.deploy.torch_backend import open_run  # only for a run directory: the ONNX path never loads torch

        check_not_exported(run)
        return cls(*open_run(run, device))

    @classmethod
    def from_onnx(cls, path: str | Path, threads: int | None = None) -> Predictor:
        """An .onnx file written by `foodvit export`, run by ONNX Runtime (no PyTorch)."""
        from foodvit.deploy.onnx_runtime import OnnxBackend

        backend = OnnxBackend(path, threads)
        classes, preprocess, card = backend.description()
        try:
            saved = Preprocess.from_dict(preprocess)
        except ConfigError as err:
            raise InputError(f"{path} is damaged: {err}; export the run again (foodvit export)") from None
        return cls(backend, classes, saved, card)

    @classmethod
    def open(cls, where: str | Path, device=None, threads: int | None = None) -> Predictor:
        """A run directory or foodvit .safetensors file (PyTorch), or an exported .onnx file (then
        no PyTorch is imported; threads: ONNX Runtime's, the entry point sets PyTorch's)."""
        if str(where).lower().endswith(".onnx"):
            return cls.from_onnx(where, threads)
        return cls.from_run(where, device)

    # ------------------------------------------------------------------------------ the steps

    @property
    def name(self) -> str:
        """A short name for people: the variant or recipe and the size, e.g. 'default recipe (6 blocks, D=192, 2.9M
        parameters)'."""
        metrics = self.card.get("metrics", {})
        model = self.card.get("model", {})
        what = f"{metrics['recipe']} recipe" if metrics.get("recipe") else "ViT"
        size = f"{model.get('depth')} blocks, D={model.get('embed_dim')}" if model else ""
        params = f", {self.card['params'] / 1e6:.1f}M parameters" if self.card.get("params") else ""
        return f"{what} ({size}{params})" if size else what

    def data_sources(self) -> list:
        """Where photos of the model's classes may be found: the source it was trained on (its card),
        then $FOODVIT_DATA; each a DataSource."""
        import os

        from foodvit.data.datasource import DataSource

        texts = [self.card.get("metrics", {}).get("data"), os.environ.get("FOODVIT_DATA")]
        return [DataSource.parse(text) for text in dict.fromkeys(t for t in texts if t)]

    def photos_at_hand(self, per_class: int, split: str = "test") -> list[Path]:
        """The first photos of each of the model's classes from the first of data_sources() that is
        at hand and holds them all; [] if none (nothing is downloaded). For examples and parity checks."""
        return [photo for photos in self.photos_by_class(per_class, split).values() for photo in photos]

    def photos_by_class(self, per_class: int, split: str = "test") -> dict[str, list[Path]]:
        """photos_at_hand by class name, {class: its first photos} in the classes' order; {} if none at hand."""
        for source in self.data_sources():
            photos = source.photos_by_class(per_class, split, classes=self.classes)
            if any(photos.values()):
                return photos
        return {}

    def decode(self, photo, name: str = "the photo", *, max_pixels: int = PHOTO_LIMIT, budget=None):
        """One photo as an RGB PIL image, a photo file far larger than the model needs decoded
        reduced (photos.decode's reduce_to: the preprocessing's resize size); max_pixels and
        budget (a DecodeBudget): the server's limits. A PhotoError if it cannot be used."""
        p = self.preprocess
        return decode(
            photo,
            name,
            max_pixels=max_pixels,
            reduce_to=p.resize_size if p.mode == "crop" else p.image_size,
            budget=budget,
        )

    def prepare(self, photo, name: str = "the photo", *, max_pixels: int = PHOTO_LIMIT, budget=None) -> np.ndarray:
        """One photo -> the model's input (3, S, S), float32; a PhotoError if it cannot be used (see decode)."""
        return to_array(self.preprocess, self.decode(photo, name, max_pixels=max_pixels, budget=budget))

    def logits(self, batch: np.ndarray) -> np.ndarray:
        """Logits (B, classes) of a prepared batch (B, 3, S, S)."""
        return np.asarray(self.backend(np.ascontiguousarray(batch, dtype=np.float32)))

    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        return softmax(self.logits(batch))

    def result(self, probabilities: np.ndarray, seconds: float, top_k: int = 3) -> dict:
        """The answer for one photo from its probabilities: label, probability, probabilities
        {class: p} in the classes' order, top_k [[label, p], ...] best first, seconds."""
        order = np.argsort(-probabilities, kind="stable")[: max(1, min(top_k, len(self.classes)))]
        ranked = [[self.classes[i], float(probabilities[i])] for i in order]
        return {
            "label": ranked[0][0],
            "probability": ranked[0][1],
            "probabilities": {c: float(p) for c, p in zip(self.classes, probabilities, strict=True)},
            "top_k": ranked,
            "seconds": seconds,
        }

    @property
    def has_attention(self) -> bool:
        """Whether attention() gives maps: a PyTorch ViT, or an .onnx exported --with-attention."""
        return isinstance(self.backend, AttentionBackend) and self.backend.has_attention

    def attention(self, photo, name: str = "the photo") -> np.ndarray | None:
        """Where the prediction looks: the attention rollout over the patch grid (grid, grid), summing
        to 1, read out as the model pools, the map `foodvit explain` draws. From the PyTorch model
        (viz.attention) or from an .onnx file's "attention" output; None when the backend has none
        (an .onnx exported without --with-attention). A PhotoError if the photo cannot be used."""
        if not self.has_attention:
            return None
        maps = self.attention_maps(self.prepare(photo, name)[None])
        return None if maps is None else maps[0]

    def attention_maps(self, batch: np.ndarray) -> np.ndarray | None:
        """attention() of a prepared batch (B, 3, S, S): (B, grid, grid), or None without maps."""
        if not isinstance(self.backend, AttentionBackend) or not self.backend.has_attention:
            return None
        maps = self.backend.attention(batch)
        return None if maps is None else np.asarray(maps)

    # ------------------------------------------------------------------------------ the uses

    def classify(self, photo, top_k: int = 3, name: str = "the photo") -> dict:
        """One photo's answer (see result); seconds covers decoding, preprocessing and the forward
        pass: what a user waits for. A PhotoError if the photo cannot be used."""
        started = time.perf_counter()
        x = self.prepare(photo, name)[None]
        probabilities = self.probabilities(x)[0]
        return self.result(probabilities, time.perf_counter() - started, top_k)

    def classify_many(self, photos: Sequence, top_k: int = 3, names: Sequence[str] | None = None) -> list[dict]:
        """Many photos in one forward pass. One answer per photo, in order; a photo that cannot be
        used gets {"error": why} and the others are still classified. seconds: the whole batch."""
        started = time.perf_counter()
        if isinstance(photos, (str, bytes, os.PathLike)):  # a path is a sequence too: of its characters
            raise InputError(f"classify_many takes a list of photos, got one ({photos!r}); use classify for one photo")
        photos = list(photos)  # a generator too
        names = list(names) if names is not None else [f"photo {i + 1}" for i in range(len(photos))]
        if len(names) != len(photos):
            raise InputError(f"classify_many got {len(photos)} photos and {len(names)} names; give a name a photo")
        inputs, errors = [], {}
        for i, (photo, name) in enumerate(zip(photos, names, strict=True)):
            try:
                inputs.append(self.prepare(photo, name))
            except PhotoError as err:
                errors[i] = str(err)
        probabilities = self.probabilities(np.stack(inputs)) if inputs else np.empty((0, len(self.classes)))
        seconds = time.perf_counter() - started
        good = iter(probabilities)
        return [
            {"error": errors[i]} if i in errors else self.result(next(good), seconds, top_k) for i in range(len(photos))
        ]
