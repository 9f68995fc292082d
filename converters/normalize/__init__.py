"""The normalising front end: rewrite what real BNN code exports into what the translator knows.

Every exporter writes binarizations, weights and shapes its own way (docs/ARCHITECTURE.md,
"Normalising front end", lists what each writes). `normalize` runs small named passes, registered
with `@rewrite(name)`, until none changes the graph; each pass is exact or leaves the graph as
it is (the translator then names the node it cannot convert):

- ``fix-batch``: a dynamic batch dimension becomes `batch` (1 by default), so shape chains fold;
- ``drop-noise``: `Identity`, `CastLike` to a known type and no-op `Cast` removed (dynamo);
- ``fold-constants``: every node whose inputs are all constant (weights binarized in forward,
  shape chains, Brevitas' clamp + sign) evaluated by ONNX Runtime (the reference evaluator for
  what it lacks), so a folded weight is what ONNX Runtime computes from the original;
- ``qonnx-bipolar``: QONNX `BipolarQuant(x, s)` -> the canonical binarization times `s`;
- ``index-put``: dynamo's `out[mask] = c` (ScatterND at NonZero(mask)) -> Where(mask, c, out);
- ``ste-detach``: the straight-through trick `Add(Sub(S, P), P)` -> `S` (P's subgraph dies);
- ``bitorch-sign``, ``cast-compare``, ``where-compare``: any elementwise function of one tensor
  `x` that reads `x` only through `Sign(x)` and comparisons with 0, and whose value is ±s with
  +s at 0, becomes the canonical `Where(GreaterOrEqual(x, 0), 1, -1)` (times s). Such a function
  depends only on whether x < 0, x == -0.0, x == +0.0 or x > 0, so evaluating it on one value of
  each class (ONNX's reference evaluator) proves the rewrite for every non-NaN input;
- ``plain-sign``: the same functions with another value at 0 (plain `Sign`, `x > 0`) that feed a
  Conv/MatMul/Gemm: rewritten to the canonical form and listed in `zero_sensitive`, so the gate
  can prove that no exact zero reaches them (`converters.lce.check_zero_free`);
- ``clamp-sign``: the canonical binarization of a clamp that keeps sign classes (Clip(x, lo,
  hi) with lo < 0 < hi, Brevitas' `Where(x > s, s, x)`) reads x itself;
- ``pad-transpose``: binarization -> constant `Pad` -> `Transpose` -> layer becomes
  binarization -> `Transpose` -> `Pad` (pads permuted): tf2onnx's one-padded binary convs;
- ``reshape-transpose``: a `Reshape` just before or after a layer's binarization that only
  moves axes of length 1 (tf2onnx's `[N, 1, 1, C] -> [N, C, 1, 1]` before larq-zoo
  BinaryAlexNet's dense layers, written as 1x1 convs) becomes the `Transpose` it equals, which
  the next two passes move and cancel and the translator reads as NHWC -> NCHW;
- ``transpose-binarized``: a `Transpose` or `Reshape` between a binarization and its layer (or
  the layer's Pad) is moved before the binarization (tf2onnx, NHWC), so the binarization feeds
  the layer directly;
- ``keras-prelu``: `Add(Relu(x), Mul(Relu(Neg(x)), c))`, Keras' PReLU as tf2onnx writes it,
  becomes `PRelu(x, -c)`, which the translator emits in the one form TFLite fuses into a single
  PRELU op (docs/LCE_NOTES.md §10);
- ``transpose-sink``: a Transpose moves below a Mul/Add by a constant, and two Transposes that
  undo each other vanish: tf2onnx's NHWC <-> NCHW pairs around each Conv cancel.

Example:
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    >>> nodes = [helper.make_node("Sign", ["x"], ["s"]),
    ...          helper.make_node("Constant", [], ["zero"], value_float=0.0),
    ...          helper.make_node("Equal", ["s", "zero"], ["eq"]),
    ...          helper.make_node("Constant", [], ["one"], value_float=1.0),
    ...          helper.make_node("Where", ["eq", "one", "s"], ["y"])]
    >>> model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    >>> normalized, report = normalize(model)
    >>> [n.op_type for n in normalized.graph.node], report.applied["bitorch-sign"]
    (['GreaterOrEqual', 'Where'], 1)
"""

from __future__ import annotations

from converters.normalize.editable_graph import EditableGraph, NormalizeReport
from converters.normalize.exporter_idioms import runnable_reference
from converters.normalize.pipeline import check_valid, normalize
from converters.normalize.registry import REWRITES, SIGN_IDIOMS, Pass, rewrite

__all__ = [
    "REWRITES",
    "SIGN_IDIOMS",
    "NormalizeReport",
    "Pass",
    "EditableGraph",
    "check_valid",
    "normalize",
    "rewrite",
    "runnable_reference",
]
