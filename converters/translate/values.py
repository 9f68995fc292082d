"""A translated tensor (`Value`) and the per-channel affine maps over a binary conv's accumulator.

Layouts: ONNX is NCHW, LCE wants NHWC. A translated tensor is a `Value` that remembers how its
stored TensorFlow tensor maps to the logical ONNX tensor (`Layout`).

A `Value` may also hold a pending per-channel affine map `accumulator * scale + shift` over the
integer accumulator of a binary conv: BatchNorm, biases and channel scales fold into it, and a
binarization of it can break exact ties the way torch does (sign(0) = +1, see `nudged`).

Example:
    >>> import numpy as np
    >>> from bnnexport.converters.translate.values import tie_break_bias
    >>> float(tie_break_bias(np.array([1.0], np.float32), np.array([-2.0], np.float32))[0])
    -1.5
"""

from __future__ import annotations

import contextlib
import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from bnnexport.converters.runtimes import tf


class Layout(enum.Enum):
    """How a `Value`'s stored TensorFlow tensor holds the logical ONNX tensor."""

    #: stored exactly as the logical tensor
    LOGICAL = "logical"
    #: logical [N, C, H, W] stored as [N, H, W, C], the layout LCE's binary convs take
    NHWC = "nhwc"
    #: logical [N, C] stored as [N, 1, 1, C]: dense layers emitted as 1x1 convs, so the next
    #: binary dense layer needs no reshape
    FLAT_IN_NHWC = "flat-in-nhwc"
    #: logical [N, F] stored as [N, F] with its columns permuted (`Value.perm[j]` is the logical
    #: column of stored column j): a flattened NHWC tensor, which the next dense layer absorbs
    #: by permuting its kernel rows instead of transposing activations
    PERMUTED_COLUMNS = "permuted-columns"


@dataclass
class Value:
    """A translated tensor: the stored TF tensor plus how it maps to the ONNX tensor."""

    stored: Any
    layout: Layout = Layout.LOGICAL
    perm: np.ndarray | None = None  # with Layout.PERMUTED_COLUMNS: stored column -> logical
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
        if self.layout == Layout.NHWC:
            return tf().transpose(t, [0, 3, 1, 2])
        if self.layout == Layout.FLAT_IN_NHWC:
            return tf().reshape(t, [t.shape[0], t.shape[3]])
        if self.layout == Layout.PERMUTED_COLUMNS:
            return _unpermute(t, self.perm)
        return t

    def shape(self) -> list[int]:
        """The logical (ONNX) shape."""
        s = list(self.tensor.shape) if self.stored is not None else list(self.accumulator.shape)
        if self.layout == Layout.NHWC:
            return [s[0], s[3], s[1], s[2]]
        if self.layout == Layout.FLAT_IN_NHWC:
            return [s[0], s[3]]
        return s


def _unpermute(t: Any, perm: np.ndarray) -> Any:
    """Columns of a `Layout.PERMUTED_COLUMNS` [N, F] tensor back in logical order.

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


def onnx_const_to_layout(value: np.ndarray, target: Value) -> np.ndarray:
    """Broadcast-compatible form of an ONNX constant for an operand in `target`'s layout."""
    rank = len(target.shape())
    c = np.asarray(value, dtype=np.float32)
    if c.ndim == 0:
        return c
    c = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if target.layout == Layout.NHWC:
        return np.transpose(c, (0, 2, 3, 1))
    if target.layout == Layout.FLAT_IN_NHWC:
        return c.reshape(c.shape[0], 1, 1, c.shape[1])
    if target.layout == Layout.PERMUTED_COLUMNS:
        return c if c.shape[1] == 1 else c[:, target.perm]
    return c


def per_channel(c: np.ndarray, channels: int) -> np.ndarray | None:
    """The [C] vector of a constant in stored layout that only varies along the last axis."""
    if c.ndim == 0 or c.size == 1:
        return np.full(channels, c.reshape(-1)[0], dtype=np.float32)
    if all(d == 1 for d in c.shape[:-1]) and c.shape[-1] in (1, channels):
        return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float32)
    return None


def stored_channels(x: Value) -> int | None:
    """Channel count when the stored layout keeps channels on the last axis."""
    shape = x.shape()
    if x.layout in (Layout.NHWC, Layout.FLAT_IN_NHWC) or (
        x.layout == Layout.LOGICAL and len(shape) == 2
    ):
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
