"""The page's two small ONNX graphs, beside the model: what happens to a photo before the model
and to the attention map after it, computed by ONNX Runtime in the browser, as the Python side
computes them, so that JavaScript holds no arithmetic that could drift.

    preprocess.onnx   pixels uint8 (H, W, 4), the decoded photo as a canvas gives it (RGBA, alpha
                      already laid over white) -> images float32 (1, 3, S, S), the model's input,
                      and crop uint8 (S, S, 3), the part of the photo the model sees.
                      Preprocess 'crop': the shorter side resized to resize_size (the longer in
                      proportion, rounded down), the centre S x S cut out; 'square': both sides to
                      S. Resize: linear or cubic as the preprocessing's interpolation, antialiased,
                      on uint8 (Pillow's resampling, which ONNX Runtime's antialiased Resize
                      follows); then / 255, - mean, / std in
                      float32, the order of preprocess.to_array.
    overlay.onnx      crop uint8 (S, S, 3) and heat float32 (g, g) -> overlay uint8 (S, S, 4): the
                      map upsampled bilinearly (half-pixel centres, as F.interpolate), scaled to
                      [0, 1], coloured with 'jet' and mixed over the crop, as viz.overlay.overlay_array
                      draws it; RGBA, ready for a canvas.

Built node by node with onnx.helper (no PyTorch): each is a dozen operators.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OPSET = 18  # Resize's antialias attribute arrived in opset 18
IR_VERSION = 8  # what ONNX Runtime Web's parser and the Python one both read
# Pillow's filters as Resize's modes: bilinear is the triangle filter, bicubic Keys' cubic with a = -0.5
RESAMPLING: dict[str, dict[str, Any]] = {
    "bilinear": {"mode": "linear"},
    "bicubic": {"mode": "cubic", "cubic_coeff_a": -0.5},
}


def _model(nodes, inputs, outputs, initializers, name: str):
    import onnx
    from onnx import helper

    used = {tensor for node in nodes for tensor in node.input}  # a constant a mode does not need is left out
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=[t for t in initializers if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="foodvit")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _const(name: str, value) -> object:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value), name)


def preprocess_graph(preprocess):
    """The ONNX model of `preprocess` (a data.preprocess.Preprocess): see the module's docstring."""
    from onnx import TensorProto, helper

    S, R = preprocess.image_size, preprocess.resize_size
    mean = np.asarray(preprocess.mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(preprocess.std, dtype=np.float32).reshape(1, 3, 1, 1)
    consts = [
        _const("zero", np.array([0], np.int64)),
        _const("one", np.array([1], np.int64)),
        _const("two", np.array([2], np.int64)),
        _const("three", np.array([3], np.int64)),
        _const("axis0", np.array([0], np.int64)),
        _const("axes01", np.array([0, 1], np.int64)),
        _const("side", np.array([S], np.int64)),
        _const("resize", np.array([R], np.int64)),
        _const("halve", np.array([2.0], np.float32)),
        _const("scale", np.array(255, np.float32)),
        _const("mean", mean),
        _const("std", std),
    ]
    n = helper.make_node
    nodes = [
        n("Slice", ["pixels", "zero", "three", "two"], ["rgb"]),  # (H, W, 4) -> (H, W, 3): alpha is already over white
        n("Unsqueeze", ["rgb", "axis0"], ["nhwc"]),  # (H, W, 3) -> (1, H, W, 3)
        n("Shape", ["rgb"], ["hw3"]),
        n("Slice", ["hw3", "zero", "one"], ["H"]),
        n("Slice", ["hw3", "one", "two"], ["W"]),
    ]
    nodes += _resize_sizes(preprocess)
    nodes += [
        n(
            "Resize",
            ["nhwc", "", "", "sizes"],
            ["resized"],
            antialias=1,
            exclude_outside=1,  # Pillow weighs only the pixels inside the photo
            coordinate_transformation_mode="half_pixel",
            **RESAMPLING[preprocess.interpolation],
        )
    ]
    nodes += _centre_crop(preprocess)
    nodes += [
        n("Cast", ["crop"], ["crop_f"], to=TensorProto.FLOAT),
        n("Div", ["crop_f", "scale"], ["unit"]),  # [0, 1]
        n("Unsqueeze", ["unit", "axis0"], ["unit_nhwc"]),
        n("Transpose", ["unit_nhwc"], ["unit_nchw"], perm=[0, 3, 1, 2]),  # (1, S, S, 3) -> (1, 3, S, S)
        n("Sub", ["unit_nchw", "mean"], ["centred"]),
        n("Div", ["centred", "std"], ["images"]),
    ]
    inputs = [helper.make_tensor_value_info("pixels", TensorProto.UINT8, ["height", "width", 4])]
    outputs = [
        helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, S, S]),
        helper.make_tensor_value_info("crop", TensorProto.UINT8, [S, S, 3]),
    ]
    return _model(nodes, inputs, outputs, consts, "foodvit-preprocess")


def _resize_sizes(preprocess) -> list:
    """The nodes that give "sizes", the (1, h, w, 3) the photo (H, W) is resized to."""
    from onnx import helper

    n = helper.make_node
    if preprocess.mode == "square":
        return [n("Concat", ["one", "side", "side", "three"], ["sizes"], axis=0)]
    # Pillow's (w, h) with the shorter side at R: if w <= h then (R, R*h // w) else (R*w // h, R)
    return [
        n("Mul", ["resize", "H"], ["RH"]),
        n("Div", ["RH", "W"], ["tall_h"]),  # integer division: rounded down
        n("Mul", ["resize", "W"], ["RW"]),
        n("Div", ["RW", "H"], ["wide_w"]),
        n("LessOrEqual", ["W", "H"], ["portrait"]),
        n("Where", ["portrait", "resize", "wide_w"], ["new_w"]),
        n("Where", ["portrait", "tall_h", "resize"], ["new_h"]),
        n("Concat", ["one", "new_h", "new_w", "three"], ["sizes"], axis=0),
    ]


def _centre_crop(preprocess) -> list:
    """The nodes that give "crop", the (S, S, 3) centre of "resized"."""
    from onnx import TensorProto, helper

    n = helper.make_node
    if preprocess.mode == "square":
        return [n("Squeeze", ["resized", "axis0"], ["crop"])]
    # the centre S x S, its corner at round((size - S) / 2), halves to even as Python's round
    return [
        n("Concat", ["new_h", "new_w"], ["new_hw"], axis=0),
        n("Concat", ["side", "side"], ["SS"], axis=0),
        n("Sub", ["new_hw", "SS"], ["margin"]),
        n("Cast", ["margin"], ["margin_f"], to=TensorProto.FLOAT),
        n("Div", ["margin_f", "halve"], ["half_margin"]),
        n("Round", ["half_margin"], ["corner_f"]),
        n("Cast", ["corner_f"], ["corner"], to=TensorProto.INT64),
        n("Add", ["corner", "SS"], ["end"]),
        n("Squeeze", ["resized", "axis0"], ["resized_hw3"]),
        n("Slice", ["resized_hw3", "corner", "end", "axes01"], ["crop"]),
    ]


def overlay_graph(image_size: int, grid: int, alpha: float = 0.45):
    """The ONNX model that draws the attention map (grid, grid) over the crop (S, S, 3): see the
    module's docstring. alpha: the map's share, as viz.overlay.overlay_array."""
    from onnx import TensorProto, helper

    from foodvit.viz.overlay import _LEVELS, jet

    S = image_size
    table = jet(np.arange(_LEVELS) / _LEVELS).astype(
        np.float32
    )  # (256, 3): entry i is jet's colour i (i / 256 is exact)
    consts = [
        _const("sizes", np.array([1, 1, S, S], np.int64)),
        _const("jet", table),
        _const("levels", np.array(_LEVELS, np.float32)),
        _const("top", np.array(_LEVELS - 1, np.int64)),
        _const("bottom", np.array(0, np.int64)),
        _const("tiny", np.array(1e-12, np.float32)),
        _const("alpha", np.array(alpha, np.float32)),
        _const("keep", np.array(1 - alpha, np.float32)),
        _const("scale", np.array(255, np.float32)),
        _const("lo", np.array(0, np.float32)),
        _const("hi", np.array(1, np.float32)),
        _const("opaque", np.full((S, S, 1), 255, np.uint8)),
        _const("axes01", np.array([0, 1], np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["heat", "axes01"], ["heat4"]),  # (g, g) -> (1, 1, g, g)
        n("Resize", ["heat4", "", "", "sizes"], ["up4"], mode="linear", coordinate_transformation_mode="half_pixel"),
        n("Squeeze", ["up4", "axes01"], ["up"]),  # (S, S)
        n("ReduceMin", ["up"], ["low"], keepdims=0),
        n("ReduceMax", ["up"], ["high"], keepdims=0),
        n("Sub", ["up", "low"], ["shifted"]),
        n("Sub", ["high", "low"], ["span"]),
        n("Add", ["span", "tiny"], ["span1"]),
        n("Div", ["shifted", "span1"], ["level"]),  # [0, 1]
        n("Mul", ["level", "levels"], ["index_f"]),
        n("Floor", ["index_f"], ["index_floor"]),
        n("Cast", ["index_floor"], ["index_raw"], to=TensorProto.INT64),
        n("Clip", ["index_raw", "bottom", "top"], ["index"]),
        n("Gather", ["jet", "index"], ["colours"], axis=0),  # (S, S, 3) in [0, 1]
        n("Cast", ["crop"], ["crop_f"], to=TensorProto.FLOAT),
        n("Div", ["crop_f", "scale"], ["photo"]),
        n("Mul", ["photo", "keep"], ["under"]),
        n("Mul", ["colours", "alpha"], ["over"]),
        n("Add", ["under", "over"], ["mixed"]),
        n("Clip", ["mixed", "lo", "hi"], ["clipped"]),
        n("Mul", ["clipped", "scale"], ["bytes_f"]),
        n("Round", ["bytes_f"], ["rounded"]),
        n("Cast", ["rounded"], ["rgb"], to=TensorProto.UINT8),
        n("Concat", ["rgb", "opaque"], ["overlay"], axis=2),  # (S, S, 4): a canvas's ImageData
    ]
    inputs = [
        helper.make_tensor_value_info("crop", TensorProto.UINT8, [S, S, 3]),
        helper.make_tensor_value_info("heat", TensorProto.FLOAT, [grid, grid]),
    ]
    outputs = [helper.make_tensor_value_info("overlay", TensorProto.UINT8, [S, S, 4])]
    return _model(nodes, inputs, outputs, consts, "foodvit-overlay")
