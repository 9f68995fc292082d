"""The normalising front end: rewrite what real BNN code exports into what the translator knows.

Every exporter writes binarizations, weights and shapes its own way (docs/ARCHITECTURE.md,
"Normalising front end", lists what each writes). `normalize` runs small named passes, registered
with `@rewrite(name)`, in the order `PIPELINE` gives, round after round until a round changes
nothing; each pass is exact or leaves the graph as it is (the translator then names the node it
cannot convert). The passes, by family:

- `folding`: fix-batch, drop-noise, fold-constants (static shapes, no-ops gone, constants
  evaluated by ONNX Runtime);
- `exporter_idioms`: qonnx-bipolar, index-put, ste-detach, keras-prelu (one exporter's idiom
  each);
- `sign_idioms`: bitorch-sign, cast-compare, where-compare, plain-sign (any function of x that
  reads x only through its sign, proven on one value of each sign class), and clamp-sign;
- `slicing`: scatter-concat, split-slices, concat-slices (channel slicing as static `Slice`
  and `Concat`: `torch.split`, MeliusNet's in-place `x[:, -64:] += y`);
- `layout`: pad-transpose, reshape-transpose, transpose-binarized, transpose-sink (layout ops
  moved out of the way between a binarization and its layer, NHWC <-> NCHW pairs cancelled).

The passes rewrite `converters.graph.OnnxGraph`, the graph model the translator, the pattern
finder and the gate read too: they edit it through its methods (its producer and consumer maps
are dropped by every edit) and match parents with `OnnxGraph.match_parent_path`. `registry`
holds the pass names (`REWRITES`, `rewrite`); `binarization` the canonical binarization every
family writes and recognises; `fixpoint` the order (`PIPELINE`), `normalize` and
`check_valid`.

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

from bnnexport.converters.graph import NormalizeReport, OnnxGraph
from bnnexport.converters.normalize.exporter_idioms import runnable_reference
from bnnexport.converters.normalize.fixpoint import (
    PIPELINE,
    check_valid,
    normalize,
    normalized_or_as_is,
)
from bnnexport.converters.normalize.registry import REWRITES, SIGN_IDIOMS, STEPS, Pass, rewrite

__all__ = [
    "PIPELINE",
    "STEPS",
    "REWRITES",
    "SIGN_IDIOMS",
    "NormalizeReport",
    "Pass",
    "OnnxGraph",
    "check_valid",
    "normalize",
    "normalized_or_as_is",
    "rewrite",
    "runnable_reference",
]
