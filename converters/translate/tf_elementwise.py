"""Elementwise, activation and shape handlers of the translator.

Per-channel constant arithmetic (Add/Sub/Mul/Div, BatchNorm) on a binary conv's output is
folded into the pending affine map of its `Value`, so LCE fuses it into the bconv; a spatial
constant is applied behind a reshape (LCE bug 2, docs/LCE_NOTES.md "Binary ops"). Flatten/Reshape of
an NHWC tensor yields a column-permuted flat tensor that the next dense layer absorbs.

Example:
    >>> HANDLERS["Relu"]   # (translator, node, inputs) -> Value   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from bnnexport.converters.graph import attributes
from bnnexport.converters.translate.tf_ops import TranslatorView, pad_constant, tf, unsupported
from bnnexport.converters.translate.values import (
    Layout,
    Value,
    channel_affine,
    onnx_const_to_layout,
    per_channel,
    stored_channels,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnx import NodeProto


def _same_layout(tr, node, a: Value, b: Value) -> tuple[object, object, str, np.ndarray | None]:
    if a.layout == b.layout and (
        a.layout != Layout.PERMUTED_COLUMNS or np.array_equal(a.perm, b.perm)
    ):
        return a.tensor, b.tensor, a.layout, a.perm
    return a.logical(), b.logical(), Layout.LOGICAL, None


_OPS = {
    "Add": lambda p, q: p + q,
    "Sub": lambda p, q: p - q,
    "Mul": lambda p, q: p * q,
    "Div": lambda p, q: p / q,
}


def arithmetic(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    a, b = inputs
    op = _OPS[node.op_type]
    if a is not None and b is not None:
        p, q, layout, perm = _same_layout(tr, node, a, b)
        return Value(op(p, q), layout, perm)
    x, const_first = (a, False) if a is not None else (b, True)
    c = tr.const(node.input[0 if const_first else 1]).astype(np.float32)
    stored = onnx_const_to_layout(c, x)
    channels = stored_channels(x)
    vec = per_channel(stored, channels) if channels is not None else None
    if vec is not None and x.is_affine:
        folded = _fold_into_affine(node.op_type, x, vec, const_first)
        if folded is not None:
            return folded
    return _with_constant(op, x, stored, vec, const_first)


def _fold_into_affine(op_type: str, x: Value, vec: np.ndarray, const_first: bool) -> Value | None:
    """`x op vec` (or `vec op x`) as the per-channel affine `x` carries, where it is one (a
    constant divided by `x` is not)."""
    ones, zeros = np.ones_like(vec), np.zeros_like(vec)
    if op_type == "Add":
        return channel_affine(x, ones, vec)
    if op_type == "Sub":
        return channel_affine(x, -ones if const_first else ones, vec if const_first else -vec)
    if op_type == "Mul":
        return channel_affine(x, vec, zeros)
    return None if const_first else channel_affine(x, 1.0 / vec, zeros)


def _with_constant(
    op: Callable, x: Value, stored: np.ndarray, vec: np.ndarray | None, const_first: bool
) -> Value:
    """`x op stored` (or `stored op x`) as a TF op with the constant in the form LCE and
    TFLite treat best."""
    t = x.tensor
    if stored.size == 1 and x.fan_in is None:
        # a scalar stays a scalar: TFLite folds a scalar Mul before a conv or dense layer into
        # its weights, as it does for a Keras quantizer's (DoReFa-Net's k-bit x / 3), where a
        # per-channel vector stays an op of its own (docs/BENCHMARKS.md "Op parity")
        stored = stored.reshape(())
    elif vec is not None:
        stored = vec  # 1-D, see channel_affine
    elif x.layout == Layout.NHWC:
        # a spatial constant, possibly right after a bconv: keep LCE from fusing it (bug 2)
        shape = [int(d) for d in t.shape]
        flat = tf().reshape(t, [shape[0], -1])
        full = np.broadcast_to(stored, shape).reshape(1, -1)
        flat = op(tf().constant(full), flat) if const_first else op(flat, tf().constant(full))
        return Value(tf().reshape(flat, shape), x.layout, x.perm)
    k = tf().constant(stored)
    return Value(op(k, t) if const_first else op(t, k), x.layout, x.perm)


def unary(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    attrs = attributes(node)
    fns = {
        "Relu": tf().nn.relu,
        "Sigmoid": tf().sigmoid,
        "Tanh": tf().tanh,
        "Neg": lambda t: -t,
        "Sign": tf().sign,
        # half to even, as ONNX's Round (and torch.round): DoReFa-Net's k-bit activations
        "Round": tf().round,
        "LeakyRelu": lambda t: tf().nn.leaky_relu(t, alpha=attrs.get("alpha", 0.01)),
        "Identity": lambda t: t,
        "Dropout": lambda t: t,
        "Cast": lambda t: t,
    }
    if node.op_type == "Cast" and attrs["to"] != 1:
        raise unsupported(node, "only casts to float32")
    if node.op_type in ("Identity", "Dropout", "Cast"):
        return x
    raw = x.is_affine and np.all(x.scale == 1.0) and not np.any(x.shift)
    # LCE fuses a ReLU of a bconv's accumulator, and a per-channel affine after it, into the
    # bconv: keep the fan-in, which decides whether that affine may be folded (channel_affine)
    fan_in = x.fan_in if node.op_type == "Relu" and raw else None
    return Value(fns[node.op_type](x.tensor), x.layout, x.perm, fan_in=fan_in)


def prelu(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """PReLU written as relu(x) + relu(-x) * (-slope), with the slope one axis shorter than x.

    That is the one form TFLite's converter fuses into a single PRELU op (docs/LCE_NOTES.md "PReLU
    fusion"); each element equals max(x, 0) + slope * min(x, 0) exactly, since negating is exact.
    """
    x = inputs[0]
    slope = tr.const(node.input[1])
    if slope is None:
        raise unsupported(node, "the slope must be a constant")
    t = x.tensor
    negated = -prelu_alpha(onnx_const_to_layout(slope.astype(np.float32), x), len(x.shape()))
    return Value(tf().nn.relu(t) + tf().nn.relu(-t) * tf().constant(negated), x.layout, x.perm)


def prelu_alpha(slope: np.ndarray, rank: int) -> np.ndarray:
    """`slope`, broadcastable to a rank-`rank` tensor, reshaped to rank - 1 axes.

    >>> prelu_alpha(np.ones((1, 1, 1, 16), np.float32), 4).shape
    (1, 1, 16)
    >>> prelu_alpha(np.float32(0.25), 4).shape
    (1, 1, 1)
    """
    if slope.ndim == rank and slope.shape[0] == 1:
        return slope.reshape(slope.shape[1:])
    if slope.ndim < rank - 1:
        return slope.reshape((1,) * (rank - 1 - slope.ndim) + slope.shape)
    return slope


def clip(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    attrs = attributes(node)
    low = tr.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    high = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    t = x.tensor
    if low is not None:
        t = tf().maximum(t, np.float32(low))
    if high is not None:
        t = tf().minimum(t, np.float32(high))
    return Value(t, x.layout, x.perm)


def softmax(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    rank = len(x.shape())
    axis = attributes(node).get("axis", -1 if tr.graph.model.opset_import[0].version >= 13 else 1)
    axis = axis % rank
    fn = tf().nn.softmax if node.op_type == "Softmax" else tf().nn.log_softmax
    if axis == rank - 1 and x.layout in (Layout.LOGICAL, Layout.FLAT_IN_NHWC):
        return Value(fn(x.tensor, axis=-1), x.layout)
    if x.layout == Layout.NHWC and axis == 1:
        return Value(fn(x.tensor, axis=-1), Layout.NHWC)
    return Value(fn(x.logical(), axis=axis), Layout.LOGICAL)


def flatten(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    shape = x.shape()
    axis = attributes(node).get("axis", 1) % max(len(shape), 1)
    if axis != 1:
        target = [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]
        return Value(tf().reshape(x.logical(), target), Layout.LOGICAL)
    return _to_flat(x)


def _to_flat(x: Value) -> Value:
    shape = x.shape()
    if len(shape) == 2:
        return x
    if x.layout == Layout.NHWC:
        n, c, h, w = shape
        t = tf().reshape(x.tensor, [n, h * w * c])
        if h * w == 1:
            return Value(t, Layout.LOGICAL)
        # stored column (i, j, k) of NHWC is logical column k*h*w + i*w + j of NCHW
        perm = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
        return Value(t, Layout.PERMUTED_COLUMNS, perm)
    return Value(tf().reshape(x.tensor, [shape[0], -1]), Layout.LOGICAL)


def reshape(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    shape = x.shape()
    target = tr.const(node.input[1])
    if target is None:
        raise unsupported(node, "the target shape must be a constant")
    target = [int(d) if d != 0 else shape[k] for k, d in enumerate(target)]
    return _reshaped(x, list(np.empty(shape, dtype=np.int8).reshape(target).shape))


def unsqueeze(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Unit axes inserted (`gate[:, :, None, None]` of a squeeze-and-excitation gate): the
    reshape it equals."""
    x = inputs[0]
    axes = _axes(tr, node)
    if axes is None:
        raise unsupported(node, "the axes must be a constant")
    axes = np.asarray(axes).reshape(-1)
    target = x.shape()
    rank = len(target) + len(axes)
    for axis in sorted(int(a) % rank for a in axes):
        target.insert(axis, 1)
    return _reshaped(x, target)


def _reshaped(x: Value, target: list[int]) -> Value:
    """`x` reshaped to the logical shape `target`, kept NHWC where the data order allows."""
    shape = x.shape()
    if target == shape:
        return x
    if len(target) == 2 and target[0] == shape[0]:
        return _to_flat(x)
    if len(target) == 4 and target[2:] == [1, 1]:  # [N, C, 1, 1] is stored as NHWC already
        return Value(tf().reshape(x.logical(), [target[0], 1, 1, target[1]]), Layout.NHWC)
    return Value(tf().reshape(x.logical(), target), Layout.LOGICAL)


def squeeze(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    axes = _axes(tr, node)
    shape = x.shape()
    axes = [a % len(shape) for a in (axes if axes is not None else range(len(shape)))]
    target = [d for k, d in enumerate(shape) if not (k in axes and d == 1)]
    if x.layout == Layout.NHWC and target == shape[:2]:
        return Value(x.tensor, Layout.FLAT_IN_NHWC)
    return Value(tf().reshape(x.logical(), target), Layout.LOGICAL)


def _axes(tr: TranslatorView, node: NodeProto):  # noqa: ANN202 - array, list or None
    """A (Un)Squeeze's axes: its second input from opset 13, its attribute before."""
    return tr.const(node.input[1]) if len(node.input) > 1 else attributes(node).get("axes")


def transpose(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """NHWC <-> NCHW transposes (tf2onnx writes one around every Conv) only relabel the
    layout, so a binary conv still finds its input stored NHWC."""
    x = inputs[0]
    perm = attributes(node).get("perm")
    perm = list(perm) if perm is not None else None
    if perm == [0, 3, 1, 2] and len(x.shape()) == 4:  # logical NHWC -> NCHW: stored NHWC
        return Value(x.logical(), Layout.NHWC)
    if perm == [0, 2, 3, 1] and x.layout == Layout.NHWC:  # NCHW -> NHWC: the storage itself
        return Value(x.tensor, Layout.LOGICAL)
    return Value(tf().transpose(x.logical(), perm), Layout.LOGICAL)


def concat(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    folded = _concat_as_padded_add(tr, node)
    if folded is not None:
        return folded
    values = [
        v if v is not None else Value(tf().constant(tr.const(n)), Layout.LOGICAL)
        for v, n in zip(inputs, node.input, strict=True)
    ]
    axis = attributes(node)["axis"] % len(values[0].shape())
    layouts = {v.layout for v in values}
    if layouts == {Layout.NHWC}:
        return Value(
            tf().concat([v.tensor for v in values], axis={1: 3, 2: 1, 3: 2, 0: 0}[axis]),
            Layout.NHWC,
        )
    if layouts == {Layout.FLAT_IN_NHWC} and axis == 1:
        return Value(tf().concat([v.tensor for v in values], axis=3), Layout.FLAT_IN_NHWC)
    return Value(tf().concat([v.logical() for v in values], axis=axis), Layout.LOGICAL)


def _concat_as_padded_add(tr: TranslatorView, node: NodeProto) -> Value | None:
    """Concat(x, Add(a, b)) on channels, where Concat(x, a) is in the graph too (MeliusNet's
    improvement block after its dense block: `x[:, -64:] += conv(...)` once the normaliser has
    read the slices through the dense block's concat), as Concat(x, a) + b zero-padded to its
    channels: one PAD and one ADD reusing the concat already there, the form larq-zoo writes
    and LCE's own converter keeps (docs/BENCHMARKS.md "Op parity"), where a second concat of
    the same x would copy it again. Exact: x + 0 is x (a -0.0 in x becomes +0.0, which every
    binarization maps to +1 as torch does); None when the graph has no such pair."""
    if attributes(node).get("axis") not in (1, -3) or any(
        tr.const(n) is not None for n in node.input
    ):
        return None
    for k, name in enumerate(node.input):
        add = tr.graph.producer.get(name)
        if add is None or add.op_type != "Add" or any(tr.const(n) is not None for n in add.input):
            continue
        for kept, addend in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
            parts = [*node.input[:k], kept, *node.input[k + 1 :]]
            twin = next(
                (c for c in tr.graph.consumers.get(kept, ()) if c.op_type == "Concat"
                 and c is not node and list(c.input) == parts
                 and attributes(c).get("axis") == attributes(node).get("axis")),
                None,
            )  # fmt: skip
            if twin is not None:
                return _padded_add(tr, twin, k, addend)
    return None


def _padded_add(tr: TranslatorView, concat: NodeProto, k: int, addend: str) -> Value | None:
    """The value of `concat` plus `addend` zero-padded to its channels, at part `k`'s place."""
    base, b = tr.value(concat.output[0]), tr.value(addend)
    if base.layout != Layout.NHWC or b.layout != Layout.NHWC:
        return None
    channels = [tr.value(n).shape()[1] for n in concat.input]
    before, after = sum(channels[:k]), sum(channels[k + 1 :])
    padded = tf().pad(b.tensor, [[0, 0], [0, 0], [0, 0], [before, after]])
    return Value(base.tensor + padded, Layout.NHWC)


# logical axis -> stored axis of a 4-D NHWC value (and of a [N, C] one stored [N, 1, 1, C])
_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}
_FLAT_AXIS = {0: 0, 1: 3}


def slice_(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Slice with constant starts, ends, axes and steps (`x[:, a:b]`, `x[:, :-64]`,
    `x.narrow`, and `torch.split` / `chunk` once the normaliser wrote them as Slices), taken
    in the stored layout, so an NHWC tensor stays NHWC (the channel axis is stored last)."""
    x = inputs[0]
    shape = x.shape()
    ranges = _slice_ranges(tr, node, shape)
    if any(len(r) == 0 for r in ranges.values()):
        raise unsupported(node, "an empty slice")
    stored, layout = _slice_axes(x, len(shape))
    keys = [slice(None)] * len(x.tensor.shape)
    for axis, r in ranges.items():
        keys[stored[axis]] = slice(r.start, r.stop if r.stop >= 0 else None, r.step)
    if x.is_affine and layout is x.layout:
        # a binary conv's accumulator under a pending per-channel map: slice both, so a
        # BatchNorm after the slice still folds into the map and a binarization of it still
        # breaks exact ties as torch does (`Value.nudged`)
        channels = keys[-1]
        return Value(None, layout, accumulator=x.accumulator[tuple(keys)],
                     scale=x.scale[channels], shift=x.shift[channels], origin=x.origin,
                     fan_in=x.fan_in)  # fmt: skip
    t = x.logical() if layout is Layout.LOGICAL else x.tensor
    return Value(t[tuple(keys)], layout, None)


def _slice_ranges(tr: TranslatorView, node: NodeProto, shape: list[int]) -> dict[int, range]:
    """{logical axis: the indices it keeps} of an ONNX Slice (opset 10+: inputs; before:
    attributes), out-of-range starts and ends clamped as ONNX (and Python) clamp them."""
    if len(node.input) > 1:  # opset 10 and later
        names = list(node.input[1:5])
        values = [tr.const(n) if n else None for n in names]
        if any(n and v is None for n, v in zip(names, values, strict=True)):
            raise unsupported(node, "starts, ends, axes and steps must be constants")
        starts, ends, axes, steps = values + [None] * (4 - len(values))
    else:
        attrs = attributes(node)
        starts, ends, axes, steps = attrs.get("starts"), attrs.get("ends"), attrs.get("axes"), None
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    axes = range(len(starts)) if axes is None else np.asarray(axes).reshape(-1)
    steps = [1] * len(starts) if steps is None else np.asarray(steps).reshape(-1)
    rank = len(shape)
    return {
        int(a) % rank: range(*slice(int(b), int(e), int(s)).indices(shape[int(a) % rank]))
        for a, b, e, s in zip(axes, starts, ends, steps, strict=True)
    }


def _slice_axes(x: Value, rank: int) -> tuple[dict[int, int], Layout]:
    """Logical axis -> stored axis, and the layout the slice keeps."""
    if x.layout == Layout.NHWC and rank == 4:
        return _NHWC_AXIS, Layout.NHWC
    if x.layout == Layout.FLAT_IN_NHWC:
        return _FLAT_AXIS, Layout.FLAT_IN_NHWC
    return {k: k for k in range(rank)}, Layout.LOGICAL


def pad(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    attrs = attributes(node)
    pads = tr.const(node.input[1]) if len(node.input) > 1 else attrs.get("pads")
    value = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    value = (
        float(np.asarray(value).reshape(-1)[0]) if value is not None else attrs.get("value", 0.0)
    )
    mode = attrs.get("mode", "constant")
    if pads is None:
        raise unsupported(node, "pads must be constant")
    pads = [int(p) for p in pads]
    rank = len(pads) // 2
    if x.layout == Layout.NHWC and rank == 4 and not any(pads[k] for k in (0, 1, 4, 5)):
        hw = [(pads[2], pads[6]), (pads[3], pads[7])]
        if mode == "constant":
            return Value(pad_constant(x.tensor, hw, value), Layout.NHWC)
        if mode == "reflect":
            return Value(tf().pad(x.tensor, [[0, 0], *hw, [0, 0]], mode="REFLECT"), Layout.NHWC)
    if mode != "constant":
        raise unsupported(node, f"mode={mode}")
    pairs = [[pads[k], pads[k + rank]] for k in range(rank)]
    return Value(tf().pad(x.logical(), pairs, constant_values=value), Layout.LOGICAL)


def reduce_mean(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    attrs = attributes(node)
    axes = tr.const(node.input[1]) if len(node.input) > 1 else attrs.get("axes")
    keep = attrs.get("keepdims", 1)
    rank = len(x.shape())
    axes = sorted(int(a) % rank for a in axes) if axes is not None else list(range(rank))
    if x.layout == Layout.NHWC and axes == [2, 3]:
        t = tf().reduce_mean(x.tensor, axis=[1, 2], keepdims=True)
        return Value(t, Layout.NHWC if keep else Layout.FLAT_IN_NHWC)
    return Value(tf().reduce_mean(x.logical(), axis=axes, keepdims=bool(keep)), Layout.LOGICAL)


HANDLERS = {
    **{op: arithmetic for op in _OPS},
    **{
        op: unary
        for op in (
            "Relu",
            "Sigmoid",
            "Tanh",
            "Neg",
            "Sign",
            "Round",
            "LeakyRelu",
            "Identity",
            "Dropout",
            "Cast",
        )
    },
    "PRelu": prelu,
    "Clip": clip,
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "Flatten": flatten,
    "Reshape": reshape,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Transpose": transpose,
    "Concat": concat,
    "Pad": pad,
    "Slice": slice_,
    "ReduceMean": reduce_mean,
}
