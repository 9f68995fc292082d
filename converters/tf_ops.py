"""TensorFlow building blocks the translator emits, written in the exact forms LCE recognises.

Layouts: ONNX is NCHW, LCE wants NHWC. A translated tensor is a `Value` that remembers how its
stored TensorFlow tensor maps to the logical ONNX tensor:

- ``"nhwc"``: logical [N, C, H, W] stored as [N, H, W, C];
- ``"plain"``: stored exactly as the logical tensor;
- ``"flat4"``: logical [N, C] stored as [N, 1, 1, C] (outputs of dense layers emitted as 1x1
  convs, so the next binary dense needs no reshape);
- ``"perm"``: logical [N, F] stored as [N, F] with columns permuted (`perm[j]` is the logical
  column of stored column j): the result of flattening NHWC, which the next dense layer
  absorbs by permuting its kernel rows instead of transposing activations.

A `Value` may also hold a pending per-channel affine map `accumulator * scale + shift` over the
integer accumulator of a binary conv: BatchNorm, biases and channel scales fold into it, and a
binarization of it can break exact ties the way torch does (sign(0) = +1, see `nudged`).

Example:
    >>> import tensorflow as tf                                   # doctest: +SKIP
    >>> binarize(tf.constant([-0.5, 0.0, 2.0])).numpy()           # doctest: +SKIP
    array([-1.,  1.,  1.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from converters.errors import UnsupportedOpError
from converters.runtimes import tf  # the translator modules take `tf` from here

if TYPE_CHECKING:
    import onnx

    from converters.graph import Graph
    from converters.patterns import Binarization, BinaryLayerMatch


@dataclass
class Value:
    """A translated tensor: the stored TF tensor plus how it maps to the ONNX tensor."""

    stored: Any
    # "plain": ONNX's own layout; "nhwc": a 4-D NCHW tensor stored NHWC; "flat4": a flattened
    # NHWC tensor (columns in NHWC order); "perm": a flat tensor whose columns are permuted by
    # `perm` relative to ONNX's
    layout: str = "plain"
    perm: np.ndarray | None = None
    # a pending per-channel affine map over a binary conv's integer accumulator (module doc):
    # the value is accumulator * scale + shift, emitted only when read (`tensor`)
    accumulator: Any = None
    scale: np.ndarray | None = None
    shift: np.ndarray | None = None
    # the name scope of the node that made the pending affine map: its ops are named after
    # that node wherever they are first read (converters.layer_map)
    origin: str | None = None
    # the fan-in K of the binary conv whose raw output this is (its accumulator, or a ReLU of
    # it): LCE may fold a per-channel affine that follows into the bconv (`affine_after_bconv`)
    fan_in: int | None = None

    @property
    def tensor(self) -> Any:
        """The stored tensor, materialising a pending affine map."""
        if self.stored is None:
            with self._scope():
                self.stored = affine_after_bconv(
                    self.accumulator, self.scale, self.shift, self.fan_in
                )
        return self.stored

    def _scope(self) -> Any:
        return tf().name_scope(self.origin + "/") if self.origin else contextlib.nullcontext()

    @property
    def is_affine(self) -> bool:
        return self.accumulator is not None

    def nudged(self) -> Any:
        """`accumulator * scale + shift'` with the shift moved half an accumulator step, so no
        value is exactly 0.

        The accumulator is an integer; torch maps an exact 0 to +1, LCE's kernels may not
        (docs/LCE_NOTES.md "Running flatbuffers"), so the threshold is moved to the half-integer
        that keeps every integer's sign as torch computes it.
        """
        with self._scope():
            return affine(self.accumulator, self.scale, tie_break_bias(self.scale, self.shift))

    def logical(self) -> Any:
        """The tensor in ONNX's logical layout (NCHW for 4-D)."""
        t = self.tensor
        if self.layout == "nhwc":
            return tf().transpose(t, [0, 3, 1, 2])
        if self.layout == "flat4":
            return tf().reshape(t, [t.shape[0], t.shape[3]])
        if self.layout == "perm":
            return _unpermute(t, self.perm)
        return t

    def shape(self) -> list[int]:
        """The logical (ONNX) shape."""
        s = list(self.tensor.shape) if self.stored is not None else list(self.accumulator.shape)
        if self.layout == "nhwc":
            return [s[0], s[3], s[1], s[2]]
        if self.layout == "flat4":
            return [s[0], s[3]]
        return s


def _unpermute(t: Any, perm: np.ndarray) -> Any:
    """Columns of a "perm" [N, F] tensor back in logical order.

    A flattened NHWC tensor ([N, hw * c] holding logical column k*hw + p at p*c + k) goes back
    through reshape [N, hw, c] -> transpose -> reshape: a few shape constants, where a GATHER
    would store F int indices (37 KB for BinaryNet's 4608 features). Any other permutation
    falls back to a gather with int32 indices.
    """
    n, features = (int(d) for d in t.shape)
    hw = int(perm[1]) if features > 1 else 1
    if hw > 0 and features % hw == 0:
        c = features // hw
        if np.array_equal(perm, np.arange(features).reshape(c, hw).T.reshape(-1)):
            t3 = tf().reshape(t, [n, hw, c])
            return tf().reshape(tf().transpose(t3, [0, 2, 1]), [n, features])
    return tf().gather(t, np.argsort(perm).astype(np.int32), axis=1)


def affine(acc: Any, m: np.ndarray, b: np.ndarray) -> Any:
    """`acc * m + b` with per-channel (last axis) constants, skipping no-op parts."""
    out = acc
    if not np.all(m == 1.0):
        out = out * tf().constant(m.astype(np.float32))
    if np.any(b != 0.0):
        out = out + tf().constant(b.astype(np.float32))
    return out


# LCE's float output transform folds its back-transformation into the bias, K*m + b, in float32
# (docs/LCE_NOTES.md "Binary ops"): b survives only to within an ulp of K*|m|. Beyond this K*|m|
# (an ulp of 2^-8), the affine map is applied after the bconv instead of folded into it.
FOLD_LIMIT = 2.0**15


def affine_after_bconv(acc: Any, m: np.ndarray, b: np.ndarray, fan_in: int | None) -> Any:
    """`acc * m + b` (per channel, last axis) on a binary conv's raw output `acc` (an integer,
    or a ReLU of one) of fan-in `fan_in`, folded by LCE into the bconv where that keeps b exact
    to 2^-8 (`fan_in * |m| <= FOLD_LIMIT` for every channel).

    Otherwise (a BatchNorm whose running variance is ~0, a channel that never fired while it
    was calibrated: multiplier gamma/sqrt(eps) ~ 316) it is computed after the bconv, on a
    flattened view LCE cannot fold, as `(acc - t) * m + (b + t * m)` with t = round(-b / m)
    per channel: the integer subtraction is exact and leaves the small remainder to the
    multiply, as torch's `(x - mean) * scale + beta` does, where `acc * m + b` would cancel
    two large numbers."""
    if fan_in is None or fan_in * float(np.abs(m).max(initial=0.0)) <= FOLD_LIMIT:
        return affine(acc, m, b)
    m64, b64 = m.astype(np.float64), b.astype(np.float64)
    t = np.round(np.divide(-b64, m64, out=np.zeros_like(b64), where=m64 != 0))
    shape = [int(d) for d in acc.shape]

    def tiled(c: np.ndarray) -> Any:
        return tf().constant(np.broadcast_to(c.astype(np.float32), shape[1:]).reshape(1, -1))

    flat = tf().reshape(acc, [shape[0], -1])  # as `subtract_spatial`: no fusion across it
    flat = (flat - tiled(t)) * tiled(m64) + tiled(b64 + t * m64)
    return tf().reshape(flat, shape)


def tie_break_bias(m: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bias b' such that sign(a*m + b') == sign(a*m + b) (sign(0)=+1) for every integer a,
    and a*m + b' is never 0."""
    m64, b64 = m.astype(np.float64), b.astype(np.float64)
    out = b64.copy()
    for c in range(len(m64)):
        if m64[c] == 0.0:
            out[c] = 1.0 if b64[c] >= 0 else -1.0  # only its sign matters to a binarization
            continue
        t = -b64[c] / m64[c]  # a*m + b >= 0  <=>  a >= t (m > 0)  or  a <= t (m < 0)
        near = round(t)
        if abs(t - near) <= 1e-6 * max(1.0, abs(t)):
            t = float(near)  # an exact tie in torch: a == t gives +1
        k = math.ceil(t) - 0.5 if m64[c] > 0 else math.floor(t) + 0.5
        out[c] = -k * m64[c]
    return out.astype(np.float32)


# the name scope binarizations are emitted in, while a binary layer emits its own input's
_BINARIZE_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "binarize_scope", default=None
)


@contextlib.contextmanager
def binarizing_in(scope: str | None) -> Iterator[None]:
    """Name the ops of every `binarize` inside the block after `scope` (the binarization's
    ONNX node), not after the layer being translated (converters.layer_map)."""
    token = _BINARIZE_SCOPE.set(scope)
    try:
        yield
    finally:
        _BINARIZE_SCOPE.reset(token)


def binarize(x: Any) -> Any:
    """sign(x) with sign(0) = +1, in the docs/LCE_NOTES.md "Binary ops" form LCE turns into
    `LceQuantize`."""
    scope = _BINARIZE_SCOPE.get()
    with tf().name_scope(scope + "/") if scope else contextlib.nullcontext():
        return tf().sign(tf().sign(x) + 0.1)


def sign_kernel(signs: np.ndarray) -> Any:
    """A ±1 kernel as an int8 constant cast to float32.

    The converters fold the cast before LCE's patterns run, so the flatbuffer has the same ops
    and weights (a few tensor names and the order of small constants may differ), while the
    traced graph, the SavedModel and the converters' imports of it each hold a quarter of the
    float bytes (docs/LCE_NOTES.md "int8 kernels"). The cast is named as a constant would be, so the
    names of the fused ops after it stay the same.
    """
    stored = tf().constant(np.asarray(signs, np.int8), name="sign_kernel")
    return tf().cast(stored, tf().float32, name="Const")


def same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's SAME padding (before, after) for one spatial axis."""
    extent = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def effective_pads(
    size: int, kernel: int, stride: int, dilation: int, before: int, after: int
) -> tuple[int, int, int]:
    """(before, after, out) where `after` drops trailing padding torch never reads."""
    extent = (kernel - 1) * dilation + 1
    out = (size + before + after - extent) // stride + 1
    used_after = (out - 1) * stride + extent - size - before
    return before, max(min(after, used_after), 0), out


def is_same(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> bool:
    """True when ONNX pads (before, after) give exactly TensorFlow's SAME padding."""
    b, a, out = effective_pads(size, kernel, stride, dilation, before, after)
    return (b, a) == same_pads(size, kernel, stride, dilation) and out == -(-size // stride)


def pad_constant(x: Any, pads: list[tuple[int, int]], value: float) -> Any:
    """Pad an NHWC tensor with `value`.

    Zero uses the plain Pad op; another value is built with concat, because a PadV2 right
    before a float Conv2D is rewritten by LCE to SAME zero padding (docs/LCE_NOTES.md "Binary ops",
    bug 1).
    """
    if value == 0.0:
        return tf().pad(x, [[0, 0], *pads, [0, 0]])
    for axis, (before, after) in zip((1, 2), pads, strict=True):
        parts = []
        shape = list(x.shape)
        if before:
            shape[axis] = before
            parts.append(tf().fill(shape, np.float32(value)))
        parts.append(x)
        if after:
            shape[axis] = after
            parts.append(tf().fill(shape, np.float32(value)))
        if len(parts) > 1:
            x = tf().concat(parts, axis=axis)
    return x


def pool_pads(x: Any, kernel, strides, pads, value: float) -> tuple[Any, str]:
    """Pad an NHWC tensor for pooling: returns (tensor, padding) using SAME when exact."""
    h, w = int(x.shape[1]), int(x.shape[2])
    (top, left, bottom, right) = pads
    if not any(pads):
        return x, "VALID"
    if is_same(h, kernel[0], strides[0], 1, top, bottom) and is_same(
        w, kernel[1], strides[1], 1, left, right
    ):
        return x, "SAME"
    b_h = effective_pads(h, kernel[0], strides[0], 1, top, bottom)
    b_w = effective_pads(w, kernel[1], strides[1], 1, left, right)
    return pad_constant(x, [(b_h[0], b_h[1]), (b_w[0], b_w[1])], value), "VALID"


def correction_map(mask: np.ndarray, kernel_hwio: np.ndarray, strides, dilations) -> np.ndarray:
    """VALID conv of a [H, W] 0/1 mask (broadcast over input channels) with a HWIO kernel.

    The difference between convolving a one-padded and a zero-padded binary input: the sum of
    the kernel taps that land on padding, per output position and channel.
    """
    kh, kw, _, cout = kernel_hwio.shape
    taps = kernel_hwio.sum(axis=2)  # [kh, kw, O]: the mask is the same for every input channel
    sh, sw = strides
    dh, dw = dilations
    out_h = (mask.shape[0] - ((kh - 1) * dh + 1)) // sh + 1
    out_w = (mask.shape[1] - ((kw - 1) * dw + 1)) // sw + 1
    out = np.zeros((out_h, out_w, cout), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            window = mask[i * dh : i * dh + sh * (out_h - 1) + 1 : sh]
            window = window[:, j * dw : j * dw + sw * (out_w - 1) + 1 : sw]
            out += window[:, :, None] * taps[i, j][None, None, :]
    return out


def subtract_spatial(y: Any, const: np.ndarray) -> Any:
    """y - const for a spatial (not per-channel) constant, reshaped so LCE cannot fuse it.

    LCE folds a constant Add/Sub right after a bconv into the per-channel bias without a
    shape check (docs/LCE_NOTES.md "Binary ops", bug 2); a reshape in between prevents that fusion.
    """
    shape = [int(d) for d in y.shape]
    flat = tf().reshape(y, [shape[0], -1])
    flat = flat - tf().constant(const.reshape(1, -1).astype(np.float32))
    return tf().reshape(flat, shape)


def onnx_const_to_layout(value: np.ndarray, target: Value) -> np.ndarray:
    """Broadcast-compatible form of an ONNX constant for an operand in `target`'s layout."""
    rank = len(target.shape())
    c = np.asarray(value, dtype=np.float32)
    if c.ndim == 0:
        return c
    c = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if target.layout == "nhwc":
        return np.transpose(c, (0, 2, 3, 1))
    if target.layout == "flat4":
        return c.reshape(c.shape[0], 1, 1, c.shape[1])
    if target.layout == "perm":
        return c if c.shape[1] == 1 else c[:, target.perm]
    return c


def per_channel(c: np.ndarray, channels: int) -> np.ndarray | None:
    """The [C] vector of a constant in stored layout that only varies along the last axis."""
    if c.ndim == 0 or c.size == 1:
        return np.full(channels, c.reshape(-1)[0], dtype=np.float32)
    if all(d == 1 for d in c.shape[:-1]) and c.shape[-1] in (1, channels):
        return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float32)
    return None


def unsupported(node: Any, why: str) -> UnsupportedOpError:
    """The error for an ONNX `node` of a supported op type that this translator cannot take
    (the translator adds the list of supported op types)."""
    return UnsupportedOpError(node.name or node.output[0], node.op_type, why=why)


def stored_channels(x: Value) -> int | None:
    """Channel count when the stored layout keeps channels on the last axis."""
    shape = x.shape()
    if x.layout in ("nhwc", "flat4") or (x.layout == "plain" and len(shape) == 2):
        return shape[1]
    return None


def channel_affine(x: Value, m: np.ndarray, b: np.ndarray) -> Value:
    """x * m + b with per-channel (logical axis 1) constants."""
    channels = stored_channels(x)
    if x.is_affine and channels is not None:
        return Value(
            None,
            x.layout,
            x.perm,
            accumulator=x.accumulator,
            scale=x.scale * m,
            shift=x.shift * m + b,
            fan_in=x.fan_in,
        )
    if channels is not None and x.fan_in is not None:  # a ReLU of a bconv's accumulator
        return Value(affine_after_bconv(x.tensor, m, b, x.fan_in), x.layout, x.perm)
    if channels is not None:
        # 1-D constants: LCE folds a Mul/Add after a bconv into its [C] multiplier and bias,
        # and a 4-D [1, 1, 1, C] constant there makes the flatbuffer fail to load
        mc, bc = m.astype(np.float32), b.astype(np.float32)
    else:
        shape = [1, len(m)] + [1] * (len(x.shape()) - 2)
        mc = onnx_const_to_layout(m.reshape(shape), x)
        bc = onnx_const_to_layout(b.reshape(shape), x)
    return Value(x.tensor * tf().constant(mc) + tf().constant(bc), x.layout, x.perm)


class TranslatorView(Protocol):
    """What a handler (`HANDLERS[op](tr, node, inputs) -> Value`) may use of the translator."""

    graph: Graph

    def const(self, name: str) -> np.ndarray | None:
        """A folded constant input, or None."""

    def binarized_source(self, found: Binarization) -> Value:
        """The float tensor a binarization reads, with torch's tie-break at exact zeros."""

    def chain(self, match: BinaryLayerMatch) -> list[onnx.NodeProto]:
        """Nodes between a binary layer's binarization and its data input."""

    def replay(self, node: onnx.NodeProto, x: Value) -> Value:
        """Apply a shape-only node (or max-pool) to `x` instead of its ONNX input."""
