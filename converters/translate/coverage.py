"""What the translator takes, and for a graph with an op it does not: the first such node in graph
order, the PyTorch module it came from, and the nearest spelling that converts.

`SUPPORTED` lists the op types the translator has a handler for, and the binarization patterns
it reads whole (docs/LCE_NOTES.md "Coverage"). `first_unsupported` scans a folded, normalised
graph before anything is traced, so a model with several unsupported nodes is refused naming the
one that comes first (the translator walks back from the outputs and would meet the last one
first), and `HINTS` says what to write instead where an exact rewrite in supported ops exists.

Example:
    >>> HINTS["HardSigmoid"]
    'write it as torch.clamp(x / 6 + 0.5, 0, 1), which converts (Div, Add, Clip)'
"""

from __future__ import annotations

import numpy as np
from bnnexport.converters.errors import UnsupportedOpError
from bnnexport.converters.graph import OnnxGraph, attributes
from bnnexport.converters.layer_map import TOP, module_path, nearest_module
from bnnexport.converters.patterns import binarizations_in
from bnnexport.converters.translate import tf_elementwise, tf_layers, tf_quantized

HANDLERS = {**tf_elementwise.HANDLERS, **tf_layers.HANDLERS, **tf_quantized.HANDLERS}
# op types that are only supported as part of a binarization pattern
PATTERN_OPS = ("Sign -> Add -> Sign", "GreaterOrEqual -> Where")
SUPPORTED = sorted([*HANDLERS, *PATTERN_OPS])

_BINARIZE = (
    "if this is a binarization, write it as torch.sign(torch.sign(x) + 0.1) or "
    "torch.where(x >= 0, 1.0, -1.0), the forms the translator reads"
)
# op type -> the nearest spelling that converts: only rewrites into supported ops that compute
# the same function
HINTS = {
    "ScatterND": (
        "write the in-place update as a concat of slices, x = torch.cat([x[:, :a], x[:, a:b] + y, "
        "x[:, b:]], dim=1) (an update of one channel range, x[:, a:b] += y, converts as it is)"
    ),
    "ScatterElements": "write the update as torch.cat of slices (x[:, a:b]) instead of a scatter",
    "Gather": (
        "index with slices: x[:, i:i + 1] instead of x[:, i], x[:, a:b] instead of a list of "
        "indices"
    ),
    "GatherElements": "index with slices (x[:, a:b]) and torch.cat instead of torch.gather",
    "Split": "split a static shape by constant sizes along one axis: torch.split(x, [a, b], 1)",
    "HardSigmoid": "write it as torch.clamp(x / 6 + 0.5, 0, 1), which converts (Div, Add, Clip)",
    "HardSwish": "write it as x * torch.clamp(x / 6 + 0.5, 0, 1), which converts",
    "Abs": "write it as torch.relu(x) + torch.relu(-x), which converts (Relu, Neg, Add)",
    "Max": "where one side is a constant c, write torch.clamp(x, min=c), which converts (Clip)",
    "Min": "where one side is a constant c, write torch.clamp(x, max=c), which converts (Clip)",
    "Pow": "write x ** 2 as x * x, which converts (Mul)",
    "Expand": "let arithmetic broadcast (x * y with y of shape [1, C, 1, 1]) instead of expand()",
    "ReduceSum": "take x.mean(dim) when the sum is followed by a division by its count",
    "NonZero": "write a masked write x[mask] = c as torch.where(mask, c, x)",
    "Where": _BINARIZE,
    "GreaterOrEqual": _BINARIZE,
    "Equal": _BINARIZE,
    "Greater": _BINARIZE,
    "Less": _BINARIZE,
    "LessOrEqual": _BINARIZE,
    "Not": _BINARIZE,
}


def first_unsupported(graph: OnnxGraph) -> UnsupportedOpError | None:
    """The error for the first node, in graph order, whose op type the translator has no
    handler for and that no binarization pattern reads whole; None when there is none.
    `graph` is folded (`OnnxGraph.folded`), so constant subgraphs are gone from its nodes."""
    absorbed = _binarization_nodes(graph)
    for node in graph.nodes:
        if node.op_type not in HANDLERS and id(node) not in absorbed:
            return described(graph, UnsupportedOpError(node.name or node.output[0], node.op_type))
    return None


def described(graph: OnnxGraph, error: UnsupportedOpError) -> UnsupportedOpError:
    """`error` with its node's PyTorch module, the hint for its op type (when it has none of
    its own) and the supported op types filled in."""
    node = next((n for n in graph.nodes if (n.name or n.output[0]) == error.node_name), None)
    if node is not None and not error.module:
        error.module = _module_of(graph, node) or ""
    if not error.hint and node is not None and node.op_type == "Gather":
        error.hint = permutation_hint(graph, node)
    if not error.hint:
        error.hint = HINTS.get(error.op_type, "")
    return error.listing(SUPPORTED)


def permutation_hint(graph: OnnxGraph, node) -> str:  # noqa: ANN001 - an onnx.NodeProto
    """For a Gather that permutes the channels of an NCHW tensor (`x[:, perm]`,
    `index_select(x, 1, perm)`), the same permutation in ops that convert: a channel shuffle
    (`perm` the transpose of a g x C/g grid) as reshape -> transpose -> reshape, any other as
    a concat of channel slices; "" for any other Gather.

    >>> shuffle = np.arange(6).reshape(2, 3).T.reshape(-1)
    >>> _permutation_spelling(shuffle)
    'x.reshape(n, 2, 3, h, w).transpose(1, 2).reshape(n, 6, h, w)'
    >>> _permutation_spelling(np.array([3, 4, 5, 0, 1, 2]))
    'torch.cat([x[:, 3:6], x[:, 0:3]], 1)'
    """
    indices = graph.const(node.input[1]) if len(node.input) > 1 else None
    shape = graph.shape(node.input[0])
    axis = int(attributes(node).get("axis", 0))
    if indices is None or shape is None or len(shape) != 4 or axis % 4 != 1:
        return ""
    perm = np.asarray(indices).reshape(-1)
    if perm.size < 2 or sorted(perm.tolist()) != list(range(shape[1] or -1)):
        return ""
    spelling = _permutation_spelling(perm)
    ops = "Reshape, Transpose" if spelling.startswith("x.reshape") else "Slice, Concat"
    return f"its indices permute the channels: x[:, perm] is {spelling}, which converts ({ops})"


def _permutation_spelling(perm: np.ndarray) -> str:
    """PyTorch code for `x[:, perm]` in ops the translator takes."""
    channels = len(perm)
    for groups in (g for g in range(2, channels) if channels % g == 0):
        shuffle = np.arange(channels).reshape(groups, channels // groups).T.reshape(-1)
        if np.array_equal(perm, shuffle):
            return (
                f"x.reshape(n, {groups}, {channels // groups}, h, w).transpose(1, 2)"
                f".reshape(n, {channels}, h, w)"
            )
    starts = [0, *[k for k in range(1, channels) if perm[k] != perm[k - 1] + 1]]
    ends = [*starts[1:], channels]
    runs = [(int(perm[a]), int(perm[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]
    if len(runs) <= 8:
        return f"torch.cat([{', '.join(f'x[:, {a}:{b}]' for a, b in runs)}], 1)"
    return f"torch.cat([x[:, i:i + 1] for i in {perm.tolist()}], 1)"


def _binarization_nodes(graph: OnnxGraph) -> set[int]:
    """ids of the nodes inside a binarization pattern (between its source and its output)."""
    inside: set[int] = set()
    for found in binarizations_in(graph):
        pending = [found.output]
        while pending:
            node = graph.producer.get(pending.pop())
            if node is None or id(node) in inside:
                continue
            inside.add(id(node))
            pending += [n for n in node.input if n and n != found.source]
    return inside


def _module_of(graph: OnnxGraph, node) -> str | None:  # noqa: ANN001 - an onnx.NodeProto
    """How to name the PyTorch module `node` came from ("PyTorch module 'blocks.1'", "the
    PyTorch model's own forward()"); None for a graph no torch exporter named (tf2onnx, a
    hand-built graph)."""
    if module_path(node) is None and not any(module_path(n) is not None for n in graph.nodes):
        return None
    module = nearest_module(graph, node)
    return "the PyTorch model's own forward()" if module == TOP else f"PyTorch module {module!r}"
