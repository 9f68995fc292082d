"""int8 for the float layers: a normalised ONNX BNN -> its quantized model in QDQ form.

In: the normalised float graph (`converters.normalize`), possibly carrying its own activation
ranges as QuantizeLinear/DequantizeLinear pairs (quantization-aware training), and calibration
samples for the ranges it lacks. Out: `Quantized`, the QDQ model (ONNX Runtime's int8 reference
and the translator's input), the float graph it came from, and a `QuantizeReport` (which layers
are int8, which stay float and why, every activation's scale and zero point, and whether the
ranges were calibrated or trained). Binary layers are left as they are.

- `units`: which float layers become int8 ops (`find_units`) and where activations are
  quantized;
- `qdq`: the QDQ rewrite (`write_qdq`: BatchNorm folded, kernels per output channel with each
  spatial window's sum kept (`kernel_integers`), biases int32, activations per tensor) and its
  inverse for trained ranges (`read_qdq`), `QuantPoint`;
- `calibrate`: min-max ranges from samples in ONNX Runtime (`activation_ranges`).

May import: `converters.errors`, `converters.graph`, `converters.patterns`,
`converters.runtimes`, and onnx, numpy. Never the translator, the gate or `converters.lce`.

Example:
    >>> from bnnexport.converters.quantize import quantize
    >>> quantized = quantize(model, calibration=samples)                # doctest: +SKIP
    >>> quantized.report.int8_layers                                    # doctest: +SKIP
    ['/features/0/Conv', '/classifier/3/Gemm']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from bnnexport.converters.errors import ConverterError
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.quantize.calibrate import activation_ranges
from bnnexport.converters.quantize.qdq import QuantPoint, read_qdq, write_qdq
from bnnexport.converters.quantize.units import Unit, UnitPlan, find_units


@dataclass
class QuantizeReport:
    """How the float layers were quantized: `ranges` "calibrated" (post-training, on
    `calibration_samples` samples), "trained" (the model carried them: quantization-aware
    training) or "given" (another conversion's); the int8 layers and, in `kept_float`, the layers
    kept float with why, and every activation point (by the name of its dequantized tensor) with
    its scale and zero point.
    `calibrated_points` lists points a trained model had no range for (calibrated instead);
    `unused_points` trained ranges at tensors no int8 layer reads or writes."""

    ranges: str
    calibration_samples: int
    int8_layers: list[str] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)
    points: dict[str, dict[str, float | int]] = field(default_factory=dict)
    calibrated_points: list[str] = field(default_factory=list)
    unused_points: list[str] = field(default_factory=list)
    # the same points by the float tensor they quantize (what `quantize(given=...)` takes)
    tensor_points: dict[str, dict[str, float | int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Quantized:
    """The QDQ model, the float graph it was made from, and the report. `accuracy_reference`
    is what the int8 model's accuracy is measured against: the float graph when its ranges
    were calibrated; the model as trained, its own QuantizeLinear/DequantizeLinear pairs
    included, when it carried them (quantization-aware training: the float graph without
    them is no model anyone trained)."""

    model: onnx.ModelProto
    float_model: onnx.ModelProto
    report: QuantizeReport
    accuracy_reference: onnx.ModelProto | None = None

    @property
    def reference_name(self) -> str:
        """What `accuracy_reference` is, for the report."""
        return "trained model" if self.report.ranges == "trained" else "float model"


def quantize(
    model: onnx.ModelProto,
    calibration: np.ndarray | None,
    given: dict[str, QuantPoint] | None = None,
    int8_outputs: bool = False,
) -> Quantized:
    """The quantized model of a normalised graph (module doc). Ranges the graph carries are
    kept; `given` points (by float tensor name: another conversion's `tensor_points`, so a
    batch-N copy is the same model) come next; the others are calibrated on `calibration`
    (NCHW samples of the model's input). With `int8_outputs` (int8 input and output types), a
    graph output that no int8 layer writes (a model ending in a binary layer, or a BatchNorm
    after its head) gets an activation point of its own, calibrated like the others: its
    output can then be int8.

    Raises ConverterError (exit 2) when a range is missing and there are no samples, or the
    model's opset is older than 13; InputShapeError for samples of another shape."""
    float_model, carried = read_qdq(model)
    plan = find_units(OnnxGraph.folded(float_model), int8_outputs)
    carried = _carried_through_chains(plan, carried)
    points, missing = _activation_points(
        float_model, plan, {**(given or {}), **carried}, calibration
    )
    # a range the model carries was trained with plain rounding: its signs stay as trained;
    # a calibrated one (now, or given by the conversion that calibrated it) gets exact signs
    exact = {t for t in points if t not in carried}
    # a model that carries its ranges was trained on plainly rounded kernels (`bnnexport.nn.int8`
    # fake-quantizes them so): they stay so; the others keep their windows' sums
    sums = set() if carried else {unit.layer for unit in plan.units}
    qdq, written = write_qdq(float_model, plan, points, exact_signs=exact, window_sums=sums)
    if given:
        ranges = "given"
    else:
        ranges = "trained" if carried else "calibrated"
    report = QuantizeReport(
        ranges=ranges,
        calibration_samples=len(calibration) if missing and calibration is not None else 0,
        int8_layers=[u.layer for u in plan.units],
        kept_float=dict(plan.kept_float),
        points={name: point.to_json() for name, point in written.items()},
        calibrated_points=missing if carried else [],
        unused_points=sorted((set(given or {}) | set(carried)) - set(points)),
        tensor_points={t: p.to_json() for t, p in points.items()},
    )
    return Quantized(qdq, float_model, report, model if carried else float_model)


def _carried_through_chains(
    plan: UnitPlan, carried: dict[str, QuantPoint]
) -> dict[str, QuantPoint]:
    """The ranges the model carries, with a chain's start given its input's: a trained range
    after a pool or reshape holds before it too."""
    carried = dict(carried)
    for unit in plan.units:
        if unit.chain and unit.start not in carried and unit.input in carried:
            carried[unit.start] = carried[unit.input]
    return carried


def _activation_points(
    float_model: onnx.ModelProto,
    plan: UnitPlan,
    trained: dict[str, QuantPoint],
    calibration: np.ndarray | None,
) -> tuple[dict[str, QuantPoint], list[str]]:
    """Every activation point the plan needs (a chain takes its start's), from `trained`
    where it has one, else calibrated on `calibration`; and the calibrated ones' names."""
    shared = plan.shared()
    wanted = [t for t in plan.points() if t not in shared]
    missing = [t for t in wanted if t not in trained]
    if missing and calibration is None:
        raise ConverterError(f"no calibration samples for the int8 activation {missing[0]!r}")
    ranges = activation_ranges(float_model, missing, calibration) if missing else {}
    points = {t: trained[t] if t in trained else QuantPoint.of_range(*ranges[t]) for t in wanted}
    return points, missing


__all__ = [
    "QuantPoint",
    "QuantizeReport",
    "Quantized",
    "Unit",
    "UnitPlan",
    "activation_ranges",
    "find_units",
    "quantize",
    "read_qdq",
    "write_qdq",
]
