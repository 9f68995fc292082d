"""Passes that write channel slicing the way the translator takes it: static `Slice` and
`Concat`.

- ``split-slices``: `Split` (`torch.split`, `chunk` with the dynamo exporter) becomes one
  `Slice` per output;
- ``scatter-concat``: a `ScatterND` whose constant indices write one contiguous range of one
  axis (the in-place `x[:, -64:] += y`, or `x[:, a:b] = y`, of MeliusNet's improvement block)
  becomes `Concat(Slice(x, :a), update, Slice(x, b:))` along that axis; the dynamo exporter's
  Transposes around it (it scatters along axis 0) are looked through;
- ``concat-slices``: a `Concat` of slices of one tensor that follow each other along the
  concatenated axis (what `scatter-concat` leaves where a scatter writes a tensor's own slice
  back) becomes one `Slice`, or the tensor itself when they cover it.

Every rewrite moves values without arithmetic, so each is exact. When each runs:
`converters.normalize.fixpoint.PIPELINE`.

Example:
    >>> contiguous_range(np.array([3, 4, 5]))
    range(3, 6)
    >>> contiguous_range(np.array([3, 5])) is None
    True
"""

from __future__ import annotations

import numpy as np
import onnx
from bnnexport.converters.graph import ONNX_DOMAINS, OnnxGraph, attributes, is_static
from bnnexport.converters.normalize.registry import count_rewrites, rewrite
from onnx import helper

_END = np.iinfo(np.int64).max  # an ONNX Slice end past any dimension


def _named_like(graph: OnnxGraph, node: onnx.NodeProto, op_type: str, inputs: list[str],
                output: str, **attrs: object) -> onnx.NodeProto:  # fmt: skip
    """A new node standing for part of `node`: named after it (so the layer map still finds
    its PyTorch module in the name) and carrying its metadata (the dynamo exporter's scopes)."""
    made = helper.make_node(op_type, inputs, [output], name=graph.fresh(node.name or op_type),
                            **attrs)  # fmt: skip
    made.metadata_props.extend(node.metadata_props)
    return made


def _slice(graph: OnnxGraph, like: onnx.NodeProto, source: str, axis: int, start: int,
           end: int, output: str | None = None) -> onnx.NodeProto:  # fmt: skip
    """`source[start:end]` along `axis`, as a Slice with constant inputs."""
    consts = [graph.add_const(np.array([v], np.int64), "slice") for v in (start, end, axis)]
    out = output or graph.fresh(f"{source}__slice")
    return _named_like(graph, like, "Slice", [source, *consts], out)


@rewrite("split-slices")
def split_slices(graph: OnnxGraph) -> int:
    """Split(x) along an axis of static length, by constant sizes or into equal parts, becomes
    one Slice per output (the translator's nodes have one output each)."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "Split" or node.domain not in ONNX_DOMAINS:
            continue
        bounds = _split_bounds(graph, node)
        if bounds is None:
            continue
        axis = int(attributes(node).get("axis", 0))
        slices = [
            _slice(graph, node, node.input[0], axis, start, end, output)
            for (start, end), output in zip(bounds, node.output, strict=True)
            if output
        ]
        graph.replace(node, slices)
        changed += 1
    count_rewrites(graph, "split-slices", changed)
    return changed


def _split_bounds(graph: OnnxGraph, node: onnx.NodeProto) -> list[tuple[int, int]] | None:
    """[(start, end)] of each output of a Split, or None when they are not known statically."""
    shape = graph.shape(node.input[0])
    if not is_static(shape):
        return None
    attrs = attributes(node)
    length = shape[int(attrs.get("axis", 0)) % len(shape)]
    if len(node.input) > 1 and node.input[1]:
        sizes = graph.const(node.input[1])
        if sizes is None:
            return None
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    elif "split" in attrs:  # before opset 13
        sizes = [int(s) for s in attrs["split"]]
    else:  # equal parts, the last one smaller when they do not divide (opset 18)
        parts = len(node.output)
        step = -(-length // parts)
        sizes = [min(step, length - k * step) for k in range(parts)]
    if len(sizes) != len(node.output) or sum(sizes) != length or min(sizes) <= 0:
        return None
    ends = np.cumsum(sizes)
    return [(int(e - s), int(e)) for s, e in zip(sizes, ends, strict=True)]


def contiguous_range(values: np.ndarray) -> range | None:
    """The range `values` (1-D, in order) walks one by one, or None."""
    if values.size == 0 or np.any(np.diff(values) != 1):
        return None
    return range(int(values[0]), int(values[-1]) + 1)


@rewrite("scatter-concat")
def scatter_concat(graph: OnnxGraph) -> int:
    """ScatterND(data, indices, updates) writing a contiguous range of one axis of data with
    updates of that range's shape becomes Concat(data before it, updates, data after it)."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "ScatterND" or attributes(node).get("reduction", "none") != "none":
            continue
        found = _scattered_range(graph, node)
        if found is None:
            continue
        axis, written = found
        graph.replace(node, _concat_around(graph, node, axis, written))
        changed += 1
    count_rewrites(graph, "scatter-concat", changed)
    return changed


def _scattered_range(graph: OnnxGraph, node: onnx.NodeProto) -> tuple[int, range] | None:
    """(axis, range) when the ScatterND's indices address, in row-major order, every element of
    data's first k axes whose index on `axis` lies in `range` (k = the indices' last dimension),
    and its updates have exactly the shape of that block."""
    data, indices, updates = node.input[:3]
    shape, index = graph.shape(data), graph.const(indices)
    if not is_static(shape) or index is None or index.ndim < 2 or graph.shape(updates) is None:
        return None
    k = index.shape[-1]
    if k > len(shape):
        return None
    tuples = index.reshape(-1, k).astype(np.int64) % np.array(shape[:k])
    block = [np.unique(tuples[:, axis]) for axis in range(k)]
    ranges = [contiguous_range(b) for b in block]
    partial = [a for a, r in enumerate(ranges) if r is not None and len(r) != shape[a]]
    if any(r is None for r in ranges) or len(partial) > 1:
        return None
    axis = partial[0] if partial else 0
    grid = np.stack(np.meshgrid(*[np.asarray(r) for r in ranges], indexing="ij"), -1)
    block_shape = [len(r) for r in ranges] + list(shape[k:])
    if not np.array_equal(grid.reshape(-1, k), tuples) or graph.shape(updates) != block_shape:
        return None
    return axis, ranges[axis]


def _concat_around(graph: OnnxGraph, node: onnx.NodeProto, axis: int,
                   written: range) -> list[onnx.NodeProto]:  # fmt: skip
    """The nodes computing what the ScatterND `node` computed: the untouched parts of data
    sliced, the update between them, concatenated along `axis`. When data and updates are both
    Transpose(perm) of tensors (the dynamo exporter scatters along axis 0), the concat is
    written on those tensors along axis perm[axis], and transposed once at the end."""
    data, _, updates = node.input[:3]
    perm = _common_transpose(graph, data, updates)
    out = node.output[0]
    if perm is not None:
        data = graph.producer[data].input[0]
        updates = graph.producer[updates].input[0]
        axis = perm[axis]
        out = graph.fresh(f"{out}__untransposed")
    length = graph.shape(data)[axis]
    made = []
    if written.start > 0:
        made.append(_slice(graph, node, data, axis, 0, written.start))
    parts = [*(n.output[0] for n in made), updates]
    if written.stop < length:
        made.append(_slice(graph, node, data, axis, written.stop, _END))
        parts.append(made[-1].output[0])
    if len(parts) == 1:  # the whole of data written: the update is the result
        made.append(_named_like(graph, node, "Identity", parts, out))
    else:
        made.append(_named_like(graph, node, "Concat", parts, out, axis=axis))
    if perm is not None:
        made.append(_named_like(graph, node, "Transpose", [out], node.output[0], perm=perm))
    return made


def _common_transpose(graph: OnnxGraph, *names: str) -> list[int] | None:
    """The perm when every tensor of `names` is a Transpose by that same perm, else None."""
    perms = []
    for name in names:
        producer = graph.producer.get(name)
        if producer is None or producer.op_type != "Transpose":
            return None
        perms.append(list(attributes(producer).get("perm", [])))
    return perms[0] if perms[0] and all(p == perms[0] for p in perms) else None


@rewrite("concat-slices")
def concat_slices(graph: OnnxGraph) -> int:
    """Concat(x[a:b], x[b:c], ...) along the sliced axis, of one tensor x, becomes x[a:c] (x
    itself when that is all of it); a Slice that takes exactly one input of a Concat along its
    axis becomes that input; and of two Slices or Concats with the same inputs and attributes
    the second reads the first (the legacy exporter writes `x[:, a:] += y` as two scatters of
    the same update)."""
    outputs = {o.name for o in graph.outputs}
    changed = 0
    for node in list(graph.nodes):
        if node.output[0] in outputs:
            continue
        if node.op_type == "Concat":
            changed += _merge_adjacent(graph, node)
        elif node.op_type == "Slice":
            changed += _slice_of_concat(graph, node)
    changed += _drop_repeats(graph, outputs)
    count_rewrites(graph, "concat-slices", changed)
    return changed


def _merge_adjacent(graph: OnnxGraph, node: onnx.NodeProto) -> int:
    found = _adjacent_slices(graph, node)
    if found is None:
        return 0
    source, start, stop, length = found
    if (start, stop) == (0, length):
        graph.remove(node)
        graph.rename_uses(node.output[0], source)
    else:
        axis = int(attributes(node)["axis"]) % len(graph.shape(source))
        graph.replace(node, [_slice(graph, node, source, axis, start, stop, node.output[0])])
    return 1


def _slice_of_concat(graph: OnnxGraph, node: onnx.NodeProto) -> int:
    found = _axis_slice(graph, node.output[0])
    concat = graph.producer.get(node.input[0])
    if found is None or concat is None or concat.op_type != "Concat":
        return 0
    _, axis, start, stop = found
    rank = len(graph.shape(node.input[0]))
    if int(attributes(concat)["axis"]) % rank != axis:
        return 0
    offset = 0
    for part in concat.input:
        shape = graph.shape(part)
        if not is_static(shape):
            return 0
        if (start, stop) == (offset, offset + shape[axis]):
            graph.remove(node)
            graph.rename_uses(node.output[0], part)
            return 1
        offset += shape[axis]
    return 0


def _drop_repeats(graph: OnnxGraph, outputs: set[str]) -> int:
    """Of Slice/Concat nodes equal in op, inputs and attributes, readers of the later ones
    read the first."""
    first: dict[bytes, str] = {}
    changed = 0
    for node in list(graph.nodes):
        if node.op_type not in ("Slice", "Concat") or node.output[0] in outputs:
            continue
        key = node.op_type.encode() + b"|" + "|".join(node.input).encode()
        key += b"".join(a.SerializeToString() for a in node.attribute)
        if key in first:
            graph.remove(node)
            graph.rename_uses(node.output[0], first[key])
            changed += 1
        else:
            first[key] = node.output[0]
    return changed


def _adjacent_slices(graph: OnnxGraph, concat: onnx.NodeProto) -> tuple[str, int, int, int] | None:
    """(source, start, stop, length of the axis) when every input of `concat` is a step-1
    Slice of one tensor along the concat's axis, each starting where the one before ended."""
    source, start, stop = None, None, None
    for name in concat.input:
        found = _axis_slice(graph, name)
        if found is None:
            return None
        tensor, axis, begin, end = found
        if axis != int(attributes(concat)["axis"]) % len(graph.shape(tensor) or [0]):
            return None
        if source is None:
            source, start = tensor, begin
        elif tensor != source or begin != stop:
            return None
        stop = end
    if source is None or len(concat.input) < 2:
        return None
    return source, start, stop, graph.shape(source)[int(attributes(concat)["axis"])]


def _axis_slice(graph: OnnxGraph, name: str) -> tuple[str, int, int, int] | None:
    """(source, axis, start, end) of a step-1 Slice of one axis of a static tensor, its start
    and end clamped to the axis, or None."""
    node = graph.producer.get(name)
    if node is None or node.op_type != "Slice" or len(node.input) < 4:
        return None
    shape = graph.shape(node.input[0])
    values = [graph.const(n) if n else None for n in node.input[1:5]]
    if not is_static(shape) or any(v is None for v in values[:3]):
        return None
    starts, ends, axes = (np.asarray(v).reshape(-1) for v in values[:3])
    steps = np.asarray(values[3]).reshape(-1) if len(values) > 3 and values[3] is not None else [1]
    if len(axes) != 1 or list(steps) != [1]:
        return None
    axis = int(axes[0]) % len(shape)
    kept = range(*slice(int(starts[0]), int(ends[0])).indices(shape[axis]))
    return node.input[0], axis, kept.start, kept.stop
