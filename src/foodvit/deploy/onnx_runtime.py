"""An exported ONNX model as a Predictor backend, run by ONNX Runtime, without PyTorch.

A foodvit .onnx file carries what predicting needs in its metadata (export.py writes it):
foodvit.classes, foodvit.preprocess and foodvit.card (JSON). Decoding and preprocessing are Pillow
and NumPy (photos.py, preprocess.py), so `foodvit predict model.onnx photo.jpg`, `foodvit
evaluate model.onnx` and `foodvit serve model.onnx` import neither torch nor torchvision: install
`foodvit[onnx]`. A file exported --with-attention has a second output, "attention": the attention
rollout over the patch grid (B, grid, grid), which the demo page draws.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from foodvit.errors import RunError
from foodvit.files import parse_json
from foodvit.rundir.card import card_problem, is_class_list

META_PREFIX = "foodvit."
ATTENTION_OUTPUT = "attention"  # the second output of a file exported --with-attention
NO_ATTENTION = "this model file has no attention output: export it with --with-attention"


class OnnxBackend:
    """ONNX Runtime session: float32 batch (B, 3, S, S) -> logits (B, classes)."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise RunError("running an .onnx model needs ONNX Runtime: pip install 'foodvit[onnx]'") from None
        path = Path(path)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise RunError(f"{path} {what}; give an .onnx file written by foodvit export")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own Fail / InvalidProtobuf / InvalidGraph types
            raise RunError(
                f"{path} is not a readable ONNX model ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                "export it again with foodvit export"
            ) from None
        self.input = self.session.get_inputs()[0].name
        self.outputs = [output.name for output in self.session.get_outputs()]
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        self.path = path

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(self.outputs[:1], {self.input: batch})[0]

    @property
    def has_attention(self) -> bool:
        """Whether the file has the attention rollout output (foodvit export --with-attention)."""
        return ATTENTION_OUTPUT in self.outputs

    def attention(self, batch: np.ndarray) -> np.ndarray | None:
        """The graph's attention rollout maps (B, grid, grid), as `foodvit explain` draws them; None
        when the file was exported without them."""
        if not self.has_attention:
            return None
        return self.session.run([ATTENTION_OUTPUT], {self.input: batch})[0]

    def description(self) -> tuple[list[str], dict, dict]:
        """(classes, preprocessing dict, card) from the file's metadata, or a RunError when the
        file was not exported by foodvit."""
        try:
            classes = parse_json(self.metadata[META_PREFIX + "classes"])
            preprocess = parse_json(self.metadata[META_PREFIX + "preprocess"])
            card = parse_json(self.metadata.get(META_PREFIX + "card", "{}"))
        except (KeyError, ValueError):
            raise RunError(
                f"{self.path} is an ONNX model but not one exported by foodvit: its metadata has no class names "
                "and preprocessing; export a run with foodvit export RUN --format onnx"
            ) from None
        if not self._matches(classes, preprocess) or not isinstance(card, dict):
            raise RunError(
                f"{self.path}: its foodvit metadata does not match the model it holds (class names, preprocessing or "
                "input size); export the run again with foodvit export"
            )
        if problem := card_problem(card):
            raise RunError(f"{self.path}: its foodvit card is damaged: {problem}; export the run again")
        return classes, preprocess, card

    def _matches(self, classes, preprocess) -> bool:
        """Whether the metadata can describe this graph: names for its outputs' classes, and preprocessing (a
        complete one) to its input's size, where the graph fixes them."""
        if not (is_class_list(classes) and classes):
            return False
        if not isinstance(preprocess, dict) or not {"image_size", "resize_size", "mean", "std"} <= set(preprocess):
            return False
        size, width = self.session.get_inputs()[0].shape[-1], self.session.get_outputs()[0].shape[-1]
        return (
            isinstance(preprocess["image_size"], int)
            and preprocess["image_size"] > 0
            and (not isinstance(size, int) or size == preprocess["image_size"])
            and (not isinstance(width, int) or width == len(classes))
        )
