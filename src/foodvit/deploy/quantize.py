"""int8 quantisation of an exported .onnx file (`foodvit export --quantize ...`), with ONNX Runtime's
tools, chosen per model by measurement.

    int8-dynamic   int8 weights, activations quantised on the fly (quantize_dynamic)
    int8-static    weights and activations int8, the activations' ranges calibrated on the run's
                   TRAINING photos (never its test photos), QDQ format (quantize_static)
    int8           both made and measured: single-photo latency (median) and top-1 agreement with
                   the fp32 file; the faster of those that lose at most AGREEMENT_LOSS of it (choose)

Without the run's training photos at hand, int8 says so in one line and makes the dynamic one;
int8-static is refused. The nodes that only compute the attention rollout output (--with-attention)
stay in float: they are a handful of small matrix products, and the map is read as a picture.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import numpy as np

from foodvit.errors import FoodVitError

logger = logging.getLogger(__name__)

CALIBRATION_PHOTOS = 96  # training photos the static ranges are calibrated on (spread over the classes)
AGREEMENT_LOSS = 0.01  # int8 keeps a candidate whose top-1 agreement with fp32 is at most 1 point lower
LATENCY_RUNS = 15  # single-photo runs timed per candidate (median)


class QuantizeError(FoodVitError, RuntimeError):
    """A quantisation that cannot be made as asked."""


def calibration_inputs(predictor, count: int = CALIBRATION_PHOTOS) -> np.ndarray | None:
    """Up to `count` of the run's training photos (the first of each class, in turn), prepared as the
    Predictor prepares a photo: (n, 3, S, S); None when the run's training photos are not at hand."""
    per_class = max(1, count // max(1, len(predictor.classes)))
    for source in predictor.data_sources():
        photos = source.first_photos(per_class, "train", classes=predictor.classes)
        if photos:
            from foodvit.data.photos import load_or_explain

            return np.stack([predictor.prepare(load_or_explain(p), str(p)) for p in photos[:count]])
    return None


def agrees(figure: dict, bound: float = AGREEMENT_LOSS) -> bool:
    """Whether a candidate's top-1 agreement with fp32 is within `bound` of full agreement."""
    return figure["agreement"] >= 1.0 - bound - 1e-12


def choose(figures: dict[str, dict], bound: float = AGREEMENT_LOSS) -> str:
    """The candidate to keep: figures {name: {"latency_ms", "agreement"}} (agreement: top-1 agreement
    with fp32, 0-1). The fastest of those within `bound` of full agreement (1.0); when none is, the
    most agreeing (the faster of equals)."""
    if not figures:
        raise ValueError("no candidates to choose from")
    within = [n for n, f in figures.items() if agrees(f, bound)]
    if within:
        return min(within, key=lambda n: figures[n]["latency_ms"])
    return min(figures, key=lambda n: (-figures[n]["agreement"], figures[n]["latency_ms"]))


def _float_only_nodes(model_path: Path) -> list[str]:
    """The nodes that feed the "attention" output and not the logits: kept in float."""
    import onnx

    graph = onnx.load(str(model_path)).graph
    outputs = [o.name for o in graph.output]
    if "attention" not in outputs:
        return []
    producer = {name: node for node in graph.node for name in node.output}

    def ancestors(name: str) -> set[str]:
        seen, todo = set(), [name]
        while todo:
            node = producer.get(todo.pop())
            if node is not None and node.name not in seen:
                seen.add(node.name)
                todo += list(node.input)
        return seen

    return sorted(ancestors("attention") - ancestors(outputs[0]))


def _dynamic(fp32: Path, out: Path, exclude: list[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, nodes_to_exclude=exclude)


def _static(fp32: Path, out: Path, exclude: list[str], calibration: np.ndarray) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Photos(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"images": calibration[i : i + 1]} for i in range(len(calibration))])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(
        str(fp32),
        str(out),
        Photos(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
    )


def measure(path: Path, inputs: np.ndarray, reference_top1: np.ndarray, runs: int = LATENCY_RUNS) -> dict:
    """{"latency_ms": median single-photo latency, "agreement": top-1 agreement with reference_top1}."""
    from foodvit.deploy.onnx_runtime import OnnxBackend

    backend = OnnxBackend(path)
    agreement = float((backend(inputs).argmax(1) == reference_top1).mean())
    one = inputs[:1]
    backend(one)  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        backend(one)
        times.append((time.perf_counter() - started) * 1000)
    return {"latency_ms": round(statistics.median(times), 4), "agreement": agreement}


def quantize_int8(fp32: Path, out: Path, how: str, predictor, inputs: np.ndarray) -> dict:
    """Write the int8 model of `fp32` to `out` as `how` asks (int8, int8-dynamic, int8-static);
    returns what was done: {"method": "dynamic" | "static", "asked", "calibration_photos",
    "figures": {method: {"latency_ms", "agreement"}} (measured for int8; fp32's latency beside them)}.
    inputs: the parity photos, prepared, on which agreement is measured with the calibration photos."""
    exclude = _float_only_nodes(fp32)
    calibration = None if how == "int8-dynamic" else calibration_inputs(predictor)
    if how == "int8-static" and calibration is None:
        raise QuantizeError(
            "--quantize int8-static calibrates on the run's training photos, which are not at hand; "
            "set FOODVIT_DATA to them, or use --quantize int8-dynamic"
        )
    if how == "int8" and calibration is None:
        logger.warning("the run's training photos are not at hand to calibrate static int8: dynamic int8 it is")
    info = {"asked": how, "calibration_photos": 0 if calibration is None else len(calibration)}
    if how == "int8-dynamic" or calibration is None:
        _dynamic(fp32, out, exclude)
        return {**info, "method": "dynamic", "figures": {}}
    if how == "int8-static":
        _static(fp32, out, exclude, calibration)
        return {**info, "method": "static", "figures": {}}
    candidates = {"dynamic": out.with_name("dynamic.onnx"), "static": out.with_name("static.onnx")}
    _dynamic(fp32, candidates["dynamic"], exclude)
    _static(fp32, candidates["static"], exclude, calibration)
    probe = np.concatenate([inputs, calibration])
    from foodvit.deploy.onnx_runtime import OnnxBackend

    top1 = OnnxBackend(fp32)(probe).argmax(1)
    figures = {"fp32": measure(fp32, probe, top1)}
    figures.update({name: measure(path, probe, top1) for name, path in candidates.items()})
    method = choose({name: figures[name] for name in candidates})
    Path(candidates[method]).replace(out)
    return {**info, "method": method, "figures": figures, "probe_photos": len(probe)}


def describe(quantization: dict | None) -> str:
    """The quantisation in words for the export's line, e.g. 'static int8, chosen by measurement on 24
    photos: single-photo latency 0.09 ms vs dynamic 0.12 ms (fp32 0.12 ms), top-1 agreement with fp32 100% vs 100%;
    static calibrated on 18 training photos'."""
    if not quantization:
        return ""
    method = quantization["method"]
    figures = quantization.get("figures") or {}
    if not figures:
        how = "as asked" if quantization["asked"] != "int8" else "training photos not at hand"
        calibrated = (
            f", calibrated on {quantization['calibration_photos']} training photos" if method == "static" else ""
        )
        return f"{method} int8 ({how}{calibrated})"
    other = "dynamic" if method == "static" else "static"
    f = figures
    within = agrees(f[method]) or agrees(f[other])
    rule = "" if within else f" (neither within {AGREEMENT_LOSS:.0%} of fp32's answers: the more agreeing kept)"
    slower = (
        "; both int8 kinds are slower than fp32 on this machine: int8 buys a smaller file here, not speed"
        if min(f[method]["latency_ms"], f[other]["latency_ms"]) > f["fp32"]["latency_ms"]
        else ""
    )
    return (
        f"{method} int8, chosen by measurement on {quantization.get('probe_photos', '?')} photos{rule}: "
        f"single-photo latency {f[method]['latency_ms']:.2f} ms vs {other} {f[other]['latency_ms']:.2f} ms "
        f"(fp32 {f['fp32']['latency_ms']:.2f} ms), "
        f"top-1 agreement with fp32 {f[method]['agreement']:.0%} vs {f[other]['agreement']:.0%}; "
        f"static calibrated on {quantization['calibration_photos']} training photos{slower}"
    )
