"""Layer handlers of the translator: convolutions, dense layers, pooling, BatchNorm.

Binary layers are written in the forms LCE 0.16 turns into `LceBconv2d` (docs/LCE_NOTES.md "Binary
ops"); a conv's form is chosen by `converters.translate.padding.plan_binary_padding`:

- no padding: binarize -> VALID conv;
- one-padding equal to TF's SAME: binarize -> `tf.pad(..., 1)` -> VALID conv (pad_values=1);
- zero-padding equal to TF's SAME: binarize -> SAME conv (LCE's exact border correction);
- any other padding (stride 2 on an even size, asymmetric, mixed): the float tensor is padded
  with +1 (-1 where torch pads with -1) BEFORE binarizing, then a VALID binary conv, then a
  constant correction map for the zero-padded positions, subtracted behind a reshape. This
  sidesteps LCE bug 1 (Pad + strided VALID conv rewritten to SAME) and bug 2 (spatial constant
  fused into the bias);
- dense (MatMul/Gemm): reshape to [N, 1, 1, C], lce_binarize, 1x1 conv.

The kernel is emitted as exact ±1; a per-channel scale, the bias and a following BatchNorm stay
a pending affine map on the `Value` (LCE fuses them into the bconv's post-multiplier and bias).

Example:
    >>> HANDLERS["Conv"]   # (translator, node, inputs) -> Value   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from bnnexport.converters.graph import attributes
from bnnexport.converters.translate.groups import plan_binary_groups
from bnnexport.converters.translate.padding import (
    PaddingPlan,
    correction_map,
    effective_pads,
    padding_mode,
    plan_binary_padding,
)
from bnnexport.converters.translate.tf_ops import (
    TranslatorView,
    lce_binarize,
    pad_constant,
    pool_pads,
    sign_kernel,
    subtract_spatial,
    tf,
    unsupported,
    weight,
)
from bnnexport.converters.translate.values import Layout, Value, channel_affine

if TYPE_CHECKING:
    from bnnexport.converters.patterns import BinaryLayerMatch
    from onnx import NodeProto


def _nhwc(tr, node, x: Value) -> Value:
    """`x` as an NHWC 4-D value."""
    if x.layout == Layout.NHWC:
        return x
    if len(x.shape()) == 4:
        return Value(tf().transpose(x.logical(), [0, 2, 3, 1]), Layout.NHWC)
    raise unsupported(node, f"expects a 4-D NCHW input, got shape {x.shape()}")


def _conv_attrs(tr, node, kernel: np.ndarray, x: Value):
    attrs = attributes(node)
    if kernel.ndim != 4:
        raise unsupported(node, "only 2-D convolutions")
    kh, kw = kernel.shape[2:]
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    h, w = x.shape()[2:]
    if auto_pad == "SAME_UPPER":
        from bnnexport.converters.translate.padding import same_pads

        (t, b), (left, r) = (
            same_pads(h, kh, strides[0], dilations[0]),
            same_pads(w, kw, strides[1], dilations[1]),
        )
        pads = [t, left, b, r]
    elif auto_pad not in ("NOTSET", "VALID"):
        raise unsupported(node, f"auto_pad={auto_pad}")
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    return (kh, kw), strides, dilations, pads, int(attrs.get("group", 1))


def _hw(t: Any) -> tuple[int, int]:
    """(height, width) of an NHWC tensor."""
    return int(t.shape[1]), int(t.shape[2])


def _read_pads(x, ksize, strides, dilations, pads) -> list[tuple[int, int]]:
    """The [(top, bottom), (left, right)] zero padding the strided conv actually reads.

    LCE 0.16 turns Pad + VALID conv into SAME whenever the output is ceil(size / stride) and the
    pads split like SAME's (before = total // 2, after = total - before), without checking the total
    (docs/LCE_NOTES.md "Binary ops", bug 1): torch's (1, 1) for a 3x3/2 conv on an even size became
    SAME's (0, 1). Trailing rows/columns no window reaches are dropped (the leading ones are always
    read by the first window): what is left has SAME's total whenever the output size is SAME's, so
    LCE's rewrite then only fires when the pads are exactly SAME's (`padding_mode` already emits
    those as SAME), and the VALID conv's output size is unchanged.
    """
    out = []
    for axis, (before, after) in enumerate(((pads[0], pads[2]), (pads[1], pads[3]))):
        size = int(x.shape[1 + axis])
        b, a, _ = effective_pads(size, ksize[axis], strides[axis], dilations[axis], before, after)
        out.append((b, a))
    return out


def conv(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Float Conv: groups == 1, depthwise, or grouped as one conv per group on its slice of
    the input, concatenated (LCE 0.16's interpreter runs a grouped CONV_2D ~20x slower than
    the split, docs/LCE_NOTES.md "Grouped convolutions")."""
    kernel = tr.const(node.input[1])
    if kernel is None:
        raise unsupported(node, "the kernel must be a constant")
    x = _nhwc(tr, node, inputs[0])
    ksize, strides, dilations, pads, group = _conv_attrs(tr, node, kernel, x)
    t = x.tensor
    mode = padding_mode(_hw(t), ksize, strides, dilations, pads)
    if mode is None:
        t = pad_constant(t, _read_pads(t, ksize, strides, dilations, pads), 0.0)
        mode = "VALID"
    cin = int(t.shape[3])
    if cin % group or kernel.shape[1] * group != cin or kernel.shape[0] % group:
        raise unsupported(node, f"group={group} does not divide the channels evenly")
    if group > 1 and group == cin and kernel.shape[1] == 1:
        mult = kernel.shape[0] // cin
        k = kernel.reshape(cin, mult, *ksize).transpose(2, 3, 0, 1).astype(np.float32)
        y = tf().nn.depthwise_conv2d(t, weight(k), [1, *strides, 1], mode, dilations=dilations)
    else:
        k_hwio = np.transpose(kernel, (2, 3, 1, 0)).astype(np.float32)
        per_out = k_hwio.shape[3] // group
        parts = tf().split(t, group, axis=3) if group > 1 else [t]
        outputs = [
            tf().nn.conv2d(
                part,
                weight(k_hwio[..., g * per_out : (g + 1) * per_out]),
                [1, *strides, 1],
                mode,
                dilations=[1, *dilations, 1],
            )
            for g, part in enumerate(parts)
        ]
        y = outputs[0] if group == 1 else tf().concat(outputs, axis=3)
    bias = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if bias is not None:
        y = y + tf().constant(bias.astype(np.float32))
    return Value(y, Layout.NHWC)


def conv_transpose(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Float ConvTranspose (2-D, groups 1, no dilation or output padding): TensorFlow's
    transposed conv at VALID, its output cropped by the pads. LCE has no binary form of it: a
    binary one stays float only when allowed (`converters.gate.fallbacks.transposed_refusals`)."""
    kernel = tr.const(node.input[1])
    attrs = attributes(node)
    if kernel is None or kernel.ndim != 4:
        raise unsupported(node, "only 2-D transposed convolutions with a constant kernel")
    strides = list(attrs.get("strides", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise unsupported(node, "only groups=1 without dilation")
    if any(attrs.get("output_padding", [0, 0])) or attrs.get("auto_pad", "NOTSET") != "NOTSET":
        raise unsupported(node, "only explicit pads, without output_padding")
    x = _nhwc(tr, node, inputs[0]).tensor
    (h, w), (kh, kw) = _hw(x), kernel.shape[2:]
    full = [(h - 1) * strides[0] + kh, (w - 1) * strides[1] + kw]
    k_hwoi = np.transpose(kernel, (2, 3, 1, 0)).astype(np.float32)  # [in, out] -> [kh, kw, out, in]
    shape = [int(x.shape[0]), *full, kernel.shape[1]]
    y = tf().nn.conv2d_transpose(x, tf().constant(k_hwoi), shape, [1, *strides, 1], "VALID")
    y = y[:, pads[0] : full[0] - pads[2], pads[1] : full[1] - pads[3], :]
    bias = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if bias is not None:
        y = y + tf().constant(bias.astype(np.float32))
    return Value(y, Layout.NHWC)


def binary_layer(tr: TranslatorView, node: NodeProto, match: BinaryLayerMatch) -> Value | None:
    """Emit a binary Conv/MatMul/Gemm as LceBconv2d patterns; None to fall back to float."""
    chain = tr.chain(match)
    src = tr.binarized_source(_binarization(tr, match))
    if node.op_type == "Conv":
        return _binary_conv(tr, node, match, chain, src)
    return _binary_dense(tr, node, match, chain, src)


def _binarization(tr, match):
    from bnnexport.converters.patterns import match_binarization

    return match_binarization(tr.graph, match.binarized)


def _sign_and_scale(match, kernel: np.ndarray, out_axis: int):
    signs = np.where(kernel >= 0, 1.0, -1.0).astype(np.float32)
    scale = match.scale if match.scale is not None else np.ones(kernel.shape[out_axis])
    return signs, scale.astype(np.float32)


def _binary_conv(tr, node, match, chain, src: Value) -> Value | None:
    walked = _inner_padding(tr, chain, src)
    if walked is None:
        return None
    inner, inner_value, src = walked
    if src.layout == Layout.LOGICAL and len(src.shape()) == 4:
        src = _nhwc(tr, node, src)  # e.g. after a channel shuffle written on NCHW
    if src.layout != Layout.NHWC:
        return None
    ksize, strides, dilations, outer, group = _conv_attrs(tr, node, match.kernel, src)
    groups = plan_binary_groups(src.shape()[1], group)
    if groups.kind == "refuse":
        return None
    signs, scale = _sign_and_scale(match, match.kernel, 0)
    k_hwio = np.transpose(signs, (2, 3, 1, 0))
    x = src.tensor
    plan = plan_binary_padding(_hw(x), ksize, strides, dilations, inner, inner_value, outer)
    if groups.kind == "single":
        y, correction = _EMITTERS[plan.strategy](x, plan, _BinaryConv(k_hwio, strides, dilations))
    else:
        y, correction = _emit_split(x, plan, k_hwio, strides, dilations, group)
    y, bias = _apply_correction(y, _conv_bias(tr, node, len(scale)), correction, scale)
    fan_in = int(np.prod(match.kernel.shape[1:]))
    return Value(None, Layout.NHWC, accumulator=y, scale=scale, shift=bias, fan_in=fan_in)


def _emit_split(x, plan: PaddingPlan, k_hwio: np.ndarray, strides, dilations, groups: int):
    """One binary conv per group on its slice of the float input (binarized on its own, so
    LCE makes each an ordinary LceBconv2d), accumulators and correction maps concatenated."""
    per_out = k_hwio.shape[3] // groups
    outputs, corrections = [], []
    for g, part in enumerate(tf().split(x, groups, axis=3)):
        kernel = k_hwio[..., g * per_out : (g + 1) * per_out]
        y, correction = _EMITTERS[plan.strategy](
            part, plan, _BinaryConv(kernel, strides, dilations)
        )
        outputs.append(y)
        corrections.append(correction)
    if all(c is None for c in corrections):
        correction = None
    else:
        out_hw = [int(d) for d in outputs[0].shape[1:3]]
        zeros = np.zeros((*out_hw, per_out))
        correction = np.concatenate([zeros if c is None else c for c in corrections], axis=2)
    return tf().concat(outputs, axis=3), correction


def _inner_padding(tr, chain, src: Value) -> tuple[list[int], float, Value] | None:
    """(pads, value, source) of the one Pad between a binarization and its conv, with the
    max-pools and slices before it replayed on the float source (a slice of the binarized
    tensor is the binarization of the slice, and LCE wants the binarization right before the
    conv); None for any other chain."""
    inner = [0, 0, 0, 0]
    inner_value = 0.0
    for step in chain:
        if step.op_type == "Pad":
            found = None if any(inner) else _constant_pad(tr, step)
            if found is None:
                return None
            inner, inner_value = found
        elif step.op_type in ("MaxPool", "Identity", "Slice") and not any(inner):
            src = tr.replay(step, src)
        else:
            return None
    return inner, inner_value, src


def _constant_pad(tr, step) -> tuple[list[int], float] | None:
    """The spatial (top, left, bottom, right) pads and the value of a 4-D constant Pad node."""
    pads = tr.const(step.input[1]) if len(step.input) > 1 else attributes(step)["pads"]
    if pads is None or len(pads) != 8 or any(pads[k] for k in (0, 1, 4, 5)):
        return None
    inner = [int(pads[2]), int(pads[3]), int(pads[6]), int(pads[7])]
    value = tr.const(step.input[2]) if len(step.input) > 2 and step.input[2] else None
    return inner, 0.0 if value is None else float(np.asarray(value).reshape(-1)[0])


@dataclass(frozen=True)
class _BinaryConv:
    """A ±1 HWIO kernel with its strides and dilations; called as `conv(t, padding)`."""

    k_hwio: np.ndarray
    strides: list[int]
    dilations: list[int]

    def __call__(self, t: Any, padding: str) -> Any:
        k = sign_kernel(self.k_hwio)
        return tf().nn.conv2d(
            t, k, [1, *self.strides, 1], padding, dilations=[1, *self.dilations, 1]
        )


# Each emitter returns the conv and the [H, W, O] correction map to subtract (or None); the
# forms are the ones LCE turns into LceBconv2d (docs/LCE_NOTES.md "Binary ops").


def _emit_valid(x, plan: PaddingPlan, conv: _BinaryConv):
    return conv(lce_binarize(x), "VALID"), None


def _emit_one_padded(x, plan: PaddingPlan, conv: _BinaryConv):
    inner = plan.inner
    pads = [[0, 0], [inner[0], inner[2]], [inner[1], inner[3]], [0, 0]]
    return conv(tf().pad(lce_binarize(x), pads, constant_values=plan.fill), "VALID"), None


def _emit_same(x, plan: PaddingPlan, conv: _BinaryConv):
    return conv(lce_binarize(x), "SAME"), None


def _emit_corrected(x, plan: PaddingPlan, conv: _BinaryConv):
    """Pad the float tensor (with `plan.fill` inside, +1 outside), lce_binarize, VALID binary conv.

    Padding before the sign, with concat, keeps LCE from seeing a Pad + VALID conv that bug 1
    would rewrite to SAME (docs/LCE_NOTES.md "Binary ops"); the +1s that stand for torch's zeros are
    taken back by the correction map."""
    inner, outer = plan.inner, plan.outer
    padded = pad_constant(x, [(inner[0], inner[2]), (inner[1], inner[3])], plan.fill)
    padded = pad_constant(padded, [(outer[0], outer[2]), (outer[1], outer[3])], 1.0)
    mask = plan.zero_mask(_hw(x))
    y = conv(lce_binarize(padded), "VALID")
    correction = correction_map(mask, conv.k_hwio.astype(np.float64), conv.strides, conv.dilations)
    return y, (correction if np.any(correction) else None)


_EMITTERS = {
    "valid": _emit_valid,
    "one_padded": _emit_one_padded,
    "same": _emit_same,
    "corrected": _emit_corrected,
}


def _conv_bias(tr, node, channels: int) -> np.ndarray:
    bias = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    return np.zeros(channels, np.float32) if bias is None else bias.astype(np.float32)


def _apply_correction(y, bias: np.ndarray, correction: np.ndarray | None, scale: np.ndarray):
    """(y, bias) with a correction map subtracted from the accumulator."""
    if correction is None:
        return y, bias
    if np.all(correction == correction[:1, :1]):
        # the same at every position (e.g. a 1x1 output): it is per channel, so it folds
        # into the bias; a reshaped Sub would be moved back and fused with a 2-D bias
        return y, (bias - correction[0, 0] * scale).astype(np.float32)
    return subtract_spatial(y, correction), bias


def _binary_dense(tr, node, match, chain, src: Value) -> Value | None:
    for step in chain:
        if step.op_type not in ("Flatten", "Reshape", "Identity", "Squeeze", "Slice"):
            return None
        src = tr.replay(step, src)
    if len(src.shape()) != 2:
        return None
    kernel = match.kernel
    attrs = attributes(node)
    if node.op_type == "Gemm" and attrs.get("transB", 0):
        kernel = kernel.T
    signs, scale = _sign_and_scale(match, kernel, 1)
    if src.layout == Layout.PERMUTED_COLUMNS:
        signs = signs[src.perm]
    n, features = src.shape()
    x4 = (
        src.tensor
        if src.layout == Layout.FLAT_IN_NHWC
        else tf().reshape(src.tensor, [n, 1, 1, features])
    )
    k = sign_kernel(signs.reshape(1, 1, *signs.shape))
    y = tf().nn.conv2d(lce_binarize(x4), k, [1, 1, 1, 1], "VALID")
    bias = np.zeros(len(scale), np.float32)
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        c = tr.const(node.input[2])
        if c is None or c.size not in (1, len(scale)):
            return None
        bias = np.broadcast_to(c.reshape(-1) * attrs.get("beta", 1.0), bias.shape).astype(
            np.float32
        )
    return Value(
        None,
        Layout.FLAT_IN_NHWC,
        accumulator=y,
        scale=scale,
        shift=bias,
        fan_in=int(signs.shape[0]),
    )


def dense(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Float MatMul / Gemm with a constant right-hand side."""
    attrs = attributes(node)
    kernel = tr.const(node.input[1])
    x = inputs[0]
    if kernel is None or x is None or kernel.ndim != 2 or len(x.shape()) != 2:
        raise unsupported(node, "only [N, F] x constant [F, O] products")
    if node.op_type == "Gemm":
        if attrs.get("transA", 0):
            raise unsupported(node, "transA=1")
        if attrs.get("transB", 0):
            kernel = kernel.T
        kernel = kernel * np.float32(attrs.get("alpha", 1.0))
    if x.layout == Layout.PERMUTED_COLUMNS:
        kernel = kernel[x.perm]
    t = tf().reshape(x.tensor, [x.shape()[0], -1]) if x.layout == Layout.FLAT_IN_NHWC else x.tensor
    y = tf().matmul(t, weight(kernel))
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        c = tr.const(node.input[2])
        if c is None:
            raise unsupported(node, "the bias must be a constant")
        y = y + tf().constant((c * np.float32(attrs.get("beta", 1.0))).astype(np.float32))
    return Value(y, Layout.LOGICAL)


def _pool_attrs(tr, node, x: Value):
    attrs = attributes(node)
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if len(kernel) != 2 or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise unsupported(node, "only 2-D pooling without dilation")
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise unsupported(node, f"auto_pad={attrs['auto_pad']}")
    if attrs.get("auto_pad", "NOTSET") == "VALID":
        pads = [0, 0, 0, 0]
    return kernel, strides, pads, attrs


def pool_windows(
    size: int, kernel: int, stride: int, before: int, after: int, ceil: bool, include_pad: bool
) -> list[tuple[int, int]]:
    """The [start, end) input range each output of a pool reads along one axis, as torch and
    ONNX Runtime compute it (coordinates of the unpadded input: the padding is negative or
    at least `size`).

    ceil_mode rounds the output count up but drops a last window that would start in the
    trailing padding; a window never reaches past the trailing padding, and without
    `include_pad` (MaxPool, AveragePool with count_include_pad=0) only the input is read.

    >>> pool_windows(7, 2, 2, 0, 0, ceil=True, include_pad=True)  # the last window is 1 wide
    [(0, 2), (2, 4), (4, 6), (6, 7)]
    >>> pool_windows(8, 3, 2, 1, 1, ceil=True, include_pad=False)
    [(0, 2), (1, 4), (3, 6), (5, 8), (7, 8)]
    """
    span = size + before + after - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + before:
        out -= 1
    lo, hi = (-before, size + after) if include_pad else (0, size)
    return [
        (max(i * stride - before, lo), min(i * stride - before + kernel, hi)) for i in range(out)
    ]


def _runs(windows: list[tuple[int, int]], stride: int) -> list[tuple[int, int, int]]:
    """(start, width, count): consecutive windows of one width, `stride` apart."""
    runs: list[list[int]] = []
    for start, end in windows:
        last = runs[-1] if runs else None
        if last and end - start == last[1] and start == last[0] + last[2] * stride:
            last[2] += 1
        else:
            runs.append([start, end - start, 1])
    return [(a, w, n) for a, w, n in runs]


def _floor_windows(size, kernel, stride, before, after) -> list[tuple[int, int]]:
    return pool_windows(size, kernel, stride, before, after, ceil=False, include_pad=True)


def max_pool(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Float MaxPool; ceil_mode pads the end with the lowest float (every window holds at least
    one input value, so the maximum is torch's)."""
    x = _nhwc(tr, node, inputs[0])
    kernel, strides, pads, attrs = _pool_attrs(tr, node, x)
    if attrs.get("ceil_mode", 0):
        pads = list(pads)
        for axis, size in enumerate(x.shape()[2:]):
            windows = pool_windows(size, kernel[axis], strides[axis], pads[axis],
                                   pads[axis + 2], ceil=True, include_pad=True)  # fmt: skip
            last_end = (len(windows) - 1) * strides[axis] - pads[axis] + kernel[axis]
            pads[axis + 2] = max(last_end - size, 0)
    t, mode = pool_pads(x.tensor, kernel, strides, pads, float(np.finfo(np.float32).min))
    return Value(tf().nn.max_pool2d(t, kernel, [1, *strides, 1], mode), Layout.NHWC)


def average_pool(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """Float AveragePool. Each output is the sum of the inputs its window reads divided by how
    many it reads (padding included with count_include_pad=1). When TensorFlow's VALID or SAME
    pool has the same windows, it is one op; otherwise (ceil_mode, padding that is not SAME)
    the outputs are cut into blocks whose windows share one size, each an exact VALID pool on
    its slice of the input, then concatenated."""
    x = _nhwc(tr, node, inputs[0])
    kernel, strides, pads, attrs = _pool_attrs(tr, node, x)
    include = bool(attrs.get("count_include_pad", 0)) and any(pads)
    ceil = bool(attrs.get("ceil_mode", 0))
    windows = [
        pool_windows(size, kernel[a], strides[a], pads[a], pads[a + 2], ceil, include)
        for a, size in enumerate(x.shape()[2:])
    ]
    t = x.tensor
    hw = _hw(t)
    floor = [_floor_windows(hw[a], kernel[a], strides[a], pads[a], pads[a + 2]) for a in (0, 1)]
    if all(len(w) == len(f) for w, f in zip(windows, floor, strict=True)):
        if include:
            # only the pads the pool reads, so no Pad + VALID can be mistaken for SAME (bug 1)
            t = pad_constant(t, _read_pads(t, kernel, strides, [1, 1], pads), 0.0)
            return Value(tf().nn.avg_pool2d(t, kernel, [1, *strides, 1], "VALID"), Layout.NHWC)
        mode = padding_mode(hw, kernel, strides, [1, 1], pads)
        if mode is not None:
            return Value(tf().nn.avg_pool2d(t, kernel, [1, *strides, 1], mode), Layout.NHWC)
    return Value(_blocked_average(t, windows, strides), Layout.NHWC)


def _blocked_average(t: Any, windows: list[list[tuple[int, int]]], strides: list[int]) -> Any:
    """Average pooling with per-output windows (`pool_windows` of each axis), as VALID pools on
    slices: one per pair of runs of equal-width windows. Padding read by a window is zeros."""
    hw = _hw(t)
    before = [max(-windows[a][0][0], 0) for a in (0, 1)]
    after = [max(windows[a][-1][1] - hw[a], 0) for a in (0, 1)]
    if any(before) or any(after):
        t = pad_constant(t, [(before[0], after[0]), (before[1], after[1])], 0.0)
    rows = []
    for top, height, n_rows in _runs(windows[0], strides[0]):
        blocks = []
        for left, width, n_cols in _runs(windows[1], strides[1]):
            r0, c0 = top + before[0], left + before[1]
            r1 = r0 + (n_rows - 1) * strides[0] + height
            c1 = c0 + (n_cols - 1) * strides[1] + width
            window = t[:, r0:r1, c0:c1, :]
            blocks.append(tf().nn.avg_pool2d(window, [height, width], [1, *strides, 1], "VALID"))
        rows.append(blocks[0] if len(blocks) == 1 else tf().concat(blocks, axis=2))
    return rows[0] if len(rows) == 1 else tf().concat(rows, axis=1)


def global_pool(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = _nhwc(tr, node, inputs[0])
    reduce = tf().reduce_mean if node.op_type == "GlobalAveragePool" else tf().reduce_max
    return Value(reduce(x.tensor, axis=[1, 2], keepdims=True), Layout.NHWC)


def batch_norm(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    x = inputs[0]
    gamma, beta, mean, var = (tr.const(n) for n in node.input[1:5])
    if any(c is None for c in (gamma, beta, mean, var)):
        raise unsupported(node, "statistics must be constants (inference mode)")
    eps = attributes(node).get("epsilon", 1e-5)
    m = (gamma / np.sqrt(var.astype(np.float64) + eps)).astype(np.float32)
    b = (beta - mean * m).astype(np.float32)
    return channel_affine(x, m, b)


HANDLERS = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "MatMul": dense,
    "Gemm": dense,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_pool,
    "GlobalMaxPool": global_pool,
    "BatchNormalization": batch_norm,
}
