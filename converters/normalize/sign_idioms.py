"""Sign functions to the canonical binarization, and clamps a binarization need not read.

- ``bitorch-sign``, ``cast-compare``, ``where-compare``: any elementwise function of one tensor
  `x` that reads `x` only through `Sign(x)` and comparisons with 0, and whose value is ±s with
  +s at 0, becomes the canonical `Where(GreaterOrEqual(x, 0), 1, -1)` (times s). Such a function
  depends only on whether x < 0, x == -0.0, x == +0.0 or x > 0, so evaluating it on one value of
  each class (`PROBES`, ONNX's reference evaluator) proves the rewrite for every non-NaN input;
- ``plain-sign``: the same functions with another value at 0 (plain `Sign`, `x > 0`) that feed a
  Conv/MatMul/Gemm: rewritten to the canonical form and listed in `zero_sensitive`, so the gate
  can prove that no exact zero reaches them (`converters.gate.checks.check_zero_free`);
- ``clamp-sign``: the canonical binarization of a clamp that keeps sign classes (Clip(x, lo,
  hi) with lo < 0 < hi, Brevitas' `Where(x > s, s, x)`) reads x itself.

The four labels are one classifier (`rewrite_sign_functions`), run as the pipeline step
``sign-idioms`` with the labels left enabled. When each runs:
`converters.normalize.fixpoint.PIPELINE`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import numpy as np
import onnx
from bnnexport.converters.graph import ONNX_DOMAINS, OnnxGraph
from bnnexport.converters.normalize.binarization import (
    binarization_at,
    canonical_binarization,
    feeds_layer,
    is_canonical,
)
from bnnexport.converters.normalize.registry import SIGN_IDIOMS, count_rewrites, rewrite, step
from onnx import helper, numpy_helper

# one value of each class a Sign/compare-with-0 function can tell apart (see module doc)
PROBES = np.array([-3.0, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 3.0], np.float32)
NEGATIVE, NEG_ZERO, POS_ZERO, POSITIVE = slice(0, 3), 3, 4, slice(5, 8)
# a sign function may read a non-uniform constant (uninitialised memory it overwrites): every
# distinct value is probed, up to these sizes
MAX_DISTINCT = 1 << 16
MAX_PROBE_VALUES = 1 << 20
COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
ELEMENTWISE = (
    *COMPARISONS, "Sign", "Not", "And", "Or", "Xor", "Where", "Cast", "CastLike", "Identity",
    "Mul", "Add", "Sub", "Div", "Neg",
)  # fmt: skip


def _sign_function(
    graph: OnnxGraph, root: str
) -> tuple[str, list[onnx.NodeProto], dict[str, np.ndarray]] | None:
    """(x, nodes, scalar constants) when `root` is an elementwise function of one tensor x that
    reads x only through Sign and comparisons with a constant 0 (see the module doc).

    The walk stops at the input of every Sign and of every comparison with 0 (unless that input
    is itself a Sign's output, as in bitorch's `Equal(Sign(x), 0)`): those inputs are x, and
    must all be the same tensor. Any other non-constant tensor reached means the function reads
    a value, not a sign class, and is not one of these."""
    nodes: dict[int, onnx.NodeProto] = {}
    consts: dict[str, np.ndarray] = {}
    leaves: set[str] = set()
    stack = [root]
    while stack:
        name = stack.pop()
        if name in graph.constants:
            values = _probe_values(graph.constants[name])
            if values is None:
                return None
            consts[name] = values
            continue
        node = graph.producer.get(name)
        if node is None or node.op_type not in ELEMENTWISE or node.domain not in ONNX_DOMAINS:
            return None  # a value read directly, not through a sign or a comparison
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        inputs = _walk_on(graph, node, consts, leaves)
        if inputs is None:
            return None
        stack.extend(inputs)
    if len(leaves) != 1 or root in leaves:
        return None
    (x,) = leaves
    if not _scalars_keep_shape(graph, x, consts):
        return None
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    return x, sorted(nodes.values(), key=lambda n: order[id(n)]), consts


def _probe_values(value: np.ndarray) -> np.ndarray | None:
    """A constant as the probe feeds it: its one value (0-D) when uniform, else its distinct
    values (1-D: `_probe` tries every one); None when empty or too many to try."""
    value = np.asarray(value)
    if value.size == 0:
        return None
    if np.all(value == value.reshape(-1)[0]):
        return value.reshape(-1)[0:1].reshape(())
    # e.g. `x.new(x.size())`'s uninitialised memory, overwritten by index-puts
    distinct = np.unique(value.reshape(-1))
    return distinct if distinct.size <= MAX_DISTINCT else None


def _walk_on(
    graph: OnnxGraph,
    node: onnx.NodeProto,
    consts: dict[str, np.ndarray],
    leaves: set[str],
) -> list[str] | None:
    """The tensors `_sign_function` walks on from `node`, recording a Sign's or a comparison's
    input as a leaf (x) and a comparison's zero in `consts`; None when `node` compares with
    something other than one constant 0."""
    if node.op_type == "Sign":
        leaves.add(node.input[0])
        return []
    if node.op_type not in COMPARISONS:
        return [n for n in node.input if n]
    zero = [n for n in node.input if n in graph.constants]
    other = [n for n in node.input if n not in graph.constants]
    if len(zero) != 1 or len(other) != 1 or np.any(graph.constants[zero[0]] != 0):
        return None
    consts[zero[0]] = np.asarray(graph.constants[zero[0]]).reshape(-1)[0:1].reshape(())
    inner = graph.producer.get(other[0])
    if inner is not None and inner.op_type == "Sign":
        return [other[0]]
    leaves.add(other[0])
    return []


def _scalars_keep_shape(graph: OnnxGraph, x: str, consts: dict[str, np.ndarray]) -> bool:
    """Scalarising the constants does not hide a broadcast that grows x."""
    shape_x = graph.shape(x)
    for name in consts:
        full = graph.constants[name].shape
        if shape_x is None or None in shape_x:
            if graph.constants[name].size != 1:
                return False
        elif tuple(np.broadcast_shapes(tuple(shape_x), full)) != tuple(shape_x):
            return False
    return True


def _probe(graph: OnnxGraph, x: str, nodes: list[onnx.NodeProto], consts: dict, root: str):
    """The function's values on PROBES (ONNX's reference evaluator), or None.

    A constant given as a 1-D array of its distinct values (`_sign_function`) gets an axis of
    its own, so every combination of their values is evaluated; the function is one of these
    only if its value does not depend on them (None otherwise)."""
    from onnx.reference import ReferenceEvaluator

    varying = [k for k, v in consts.items() if np.ndim(v) == 1]
    rank = 1 + len(varying)
    if np.prod([consts[k].size for k in varying] or [1]) * len(PROBES) > MAX_PROBE_VALUES:
        return None
    feeds = {}
    for k, v in consts.items():
        axis = 1 + varying.index(k) if k in varying else None
        shape = [1] * rank
        if axis is not None:
            shape[axis] = v.size
        feeds[k] = np.asarray(v).reshape(shape if axis is not None else ())
    probes = PROBES.reshape([len(PROBES)] + [1] * (rank - 1))
    probe_graph = helper.make_graph(
        nodes, "probe",
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, list(probes.shape))],
        [helper.make_empty_tensor_value_info(root)],
        [numpy_helper.from_array(v, k) for k, v in feeds.items()],
    )  # fmt: skip
    model = helper.make_model(probe_graph, opset_imports=list(graph.model.opset_import))
    try:
        (out,) = ReferenceEvaluator(model).run(None, {x: probes})
    except Exception:
        return None
    out = np.asarray(out, np.float64)
    if out.ndim != rank or out.shape[0] != len(PROBES):
        return None
    table = np.broadcast_to(out, out.shape).reshape(len(PROBES), -1)
    if not all(
        np.array_equal(table[:, 0], table[:, j], equal_nan=True) for j in range(1, table.shape[1])
    ):
        return None  # its value depends on a non-uniform constant
    return table[:, 0]


def _which_idiom(nodes: list[onnx.NodeProto], exact: bool) -> str:
    """The label (`SIGN_IDIOMS`) of a sign function made of `nodes`; `exact` when it is +s at 0."""
    ops = {n.op_type for n in nodes}
    if not exact:
        return "plain-sign"
    if "Sign" in ops and "Equal" in ops:
        return "bitorch-sign"
    if "Cast" in ops:
        return "cast-compare"
    return "where-compare"


@step("sign-idioms")
def sign_idioms(graph: OnnxGraph) -> int:
    """The classifier as a pipeline step: the labels `graph.sign_idioms` names are enabled."""
    return rewrite_sign_functions(graph, graph.sign_idioms) if graph.sign_idioms else 0


def rewrite_sign_functions(graph: OnnxGraph, enabled: Iterable[str]) -> int:
    """Rewrite sign functions (module doc) to the canonical form, outermost first."""
    enabled = set(enabled)
    changed = 0
    done: set[str] = set()
    while True:
        found = None
        for node in reversed(graph.nodes):
            out = node.output[0] if node.output else ""
            if (
                not out or out in done or node.op_type not in ELEMENTWISE
                or is_canonical(graph, node)
            ):  # fmt: skip
                continue
            match = _sign_function(graph, out)
            if match is None:
                continue
            x, nodes, consts = match
            values = _probe(graph, x, nodes, consts, out)
            done.add(out)
            if values is None:
                continue
            negative, positive = values[NEGATIVE], values[POSITIVE]
            s = positive[0]
            if not (np.all(positive == s) and np.all(negative == -s) and s > 0):
                continue
            zeros = values[[NEG_ZERO, POS_ZERO]]
            exact = bool(np.all(zeros == s))
            label = _which_idiom(nodes, exact)
            if label not in enabled or (not exact and not feeds_layer(graph, out)):
                continue
            found = (node, x, out, float(s), exact, label, zeros)
            break
        if found is None:
            return changed
        node, x, out, s, exact, label, zeros = found
        graph.replace(node, canonical_binarization(graph, x, out, s))
        if not exact:
            graph.report.zero_sensitive[x] = float(zeros[1])
        count_rewrites(graph, label)
        graph.dead_code()
        changed += 1


def _unclamped(graph: OnnxGraph, node: onnx.NodeProto | None) -> str | None:
    """x when `node` clamps x into a range around 0 that keeps every sign class (x < 0 stays
    < 0, zeros stay zeros, x > 0 stays > 0), else None."""
    if node is None:
        return None
    if node.op_type == "Clip" and len(node.input) >= 1:
        return _unclipped(graph, node)
    if node.op_type in ("Min", "Max") and len(node.input) == 2:
        return _unbounded(graph, node)
    if node.op_type == "Where":
        return _unclamped_where(graph, node)
    return None


def _unclipped(graph: OnnxGraph, node: onnx.NodeProto) -> str | None:
    """x of Clip(x, lo, hi) with lo < 0 < hi (bounds as inputs, or attributes before opset 11)."""
    lo = graph.scalar(node.input[1]) if len(node.input) > 1 and node.input[1] else -np.inf
    hi = graph.scalar(node.input[2]) if len(node.input) > 2 and node.input[2] else np.inf
    for a in node.attribute:  # opset < 11 keeps the bounds as attributes
        lo, hi = (a.f, hi) if a.name == "min" else (lo, a.f) if a.name == "max" else (lo, hi)
    ok = lo is not None and hi is not None and lo < 0 < hi
    return node.input[0] if ok else None


def _unbounded(graph: OnnxGraph, node: onnx.NodeProto) -> str | None:
    """x of Min(x, c) with c > 0 or Max(x, c) with c < 0 (either operand order)."""
    for k in (0, 1):
        c = graph.scalar(node.input[1 - k])
        if c is not None and node.input[k] not in graph.constants:
            ok = c > 0 if node.op_type == "Min" else c < 0
            return node.input[k] if ok else None
    return None


def _unclamped_where(graph: OnnxGraph, node: onnx.NodeProto) -> str | None:
    """x of Brevitas' Where(x > c, c, x) (min(x, c), c > 0) or Where(x < c, c, x) (max(x, c),
    c < 0)."""
    cond = graph.producer.get(node.input[0])
    if cond is None or cond.op_type not in ("Greater", "GreaterOrEqual", "Less", "LessOrEqual"):
        return None
    x, bound = cond.input
    c, branch = graph.scalar(bound), graph.scalar(node.input[1])
    if c is None or branch != c or node.input[2] != x or x in graph.constants:
        return None
    above = cond.op_type.startswith("Greater")
    return x if (c > 0 if above else c < 0) else None


@rewrite("clamp-sign")
def clamp_sign(graph: OnnxGraph) -> int:
    """A canonical binarization of clamp(x) (Clip, Min/Max, or Brevitas' Where(x > s, s, x))
    reads x instead: the clamps here keep every sign class, so the binarization is the same."""
    changed = 0
    for node in list(graph.nodes):
        found = binarization_at(graph, node) if node.op_type == "Where" else None
        if found is None:
            continue
        compare = graph.producer[node.input[0]]  # x >= 0, x < 0, ... or Not of one
        if compare.op_type == "Not":
            compare = graph.producer[compare.input[0]]
        at = list(compare.input).index(found.source)
        while True:
            inner = _unclamped(graph, graph.producer.get(compare.input[at]))
            if inner is None:
                break
            # a plain Sign's zeros are x's zeros: the zero-free check follows the source
            zero = graph.report.zero_sensitive.pop(compare.input[at], None)
            if zero is not None:
                graph.report.zero_sensitive.setdefault(inner, zero)
            graph.set_input(compare, at, inner)
            changed += 1
    count_rewrites(graph, "clamp-sign", changed)
    return changed


# the sign-function labels are passes too, so they can be listed and disabled by name
for _idiom in SIGN_IDIOMS:
    rewrite(_idiom)(partial(rewrite_sign_functions, enabled=(_idiom,)))
