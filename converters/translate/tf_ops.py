"""TensorFlow building blocks the translator emits, written in the exact forms LCE recognises:
binarizations (`lce_binarize`, LceQuantize), ±1 kernels stored as int8 (`sign_kernel`), constant
padding that LCE cannot rewrite (`pad_constant`, `pool_pads`, `subtract_spatial`), and what a
handler may use of the translator (`TranslatorView`). Translated tensors are
`converters.translate.values.Value`s.

Example:
    >>> import tensorflow as tf                                   # doctest: +SKIP
    >>> lce_binarize(tf.constant([-0.5, 0.0, 2.0])).numpy()           # doctest: +SKIP
    array([-1.,  1.,  1.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import contextvars
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from bnnexport.converters.errors import UnsupportedOpError
from bnnexport.converters.runtimes import tf  # the translator modules take `tf` from here
from bnnexport.converters.translate.padding import effective_pads, is_same
from bnnexport.converters.translate.values import Value

if TYPE_CHECKING:
    import onnx
    from bnnexport.converters.graph import OnnxGraph
    from bnnexport.converters.patterns import Binarization, BinaryLayerMatch


# the name scope binarizations are emitted in, while a binary layer emits its own input's
_BINARIZE_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "binarize_scope", default=None
)


@contextlib.contextmanager
def binarizing_in(scope: str | None) -> Iterator[None]:
    """Name the ops of every `lce_binarize` inside the block after `scope` (the binarization's
    ONNX node), not after the layer being translated (converters.layer_map)."""
    token = _BINARIZE_SCOPE.set(scope)
    try:
        yield
    finally:
        _BINARIZE_SCOPE.reset(token)


def lce_binarize(x: Any) -> Any:
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


class WeightStore:
    """A traced module's large float weights as variables instead of graph constants.

    A constant lives inside the GraphDef, which the SavedModel serialises as one protobuf and
    LCE's converter parses and imports into MLIR as attributes; a variable goes to the
    SavedModel's variables files in binary, and the converter freezes it into the same
    constant before its passes run, so the flatbuffer has the same ops and weights (as LCE's
    `convert_keras_model` gets them from Keras' variables). DoReFa-Net@64: tracing and saving
    28.8 -> 6.3 s, LCE's converter 32.0 -> 12.6 s (docs/BENCHMARKS.md "Conversion time").

    The k-th weight a trace asks for is the k-th variable: made on the first trace (outside the
    graph, `init_scope`), read again by a retrace, which asks in the same order.
    """

    MIN_ELEMENTS = 1024  # smaller ones stay constants: a variable would cost more than it saves

    def __init__(self) -> None:
        self.variables: list[Any] = []
        self._checksums: list[tuple[tuple[int, ...], int]] = []
        self._next = 0

    def restart(self) -> None:
        """A new trace of the module's function starts: its weights come in order again."""
        self._next = 0

    def read(self, array: np.ndarray) -> Any:
        k, self._next = self._next, self._next + 1
        checksum = (array.shape, zlib.crc32(np.ascontiguousarray(array)))
        if k == len(self.variables):
            with tf().init_scope():
                self.variables.append(tf().Variable(array, trainable=False, name=f"weight_{k}"))
            self._checksums.append(checksum)
        elif self._checksums[k] != checksum:  # never silently another layer's weights
            raise RuntimeError(f"a retrace asked for weight {k} in another order")
        return self.variables[k].read_value()


_WEIGHTS: contextvars.ContextVar[WeightStore | None] = contextvars.ContextVar(
    "weights", default=None
)


@contextlib.contextmanager
def storing_weights(store: WeightStore) -> Iterator[None]:
    """Inside the block, `weight` puts large float weights into `store`'s variables."""
    token = _WEIGHTS.set(store)
    try:
        yield
    finally:
        _WEIGHTS.reset(token)


def weight(array: np.ndarray) -> Any:
    """A float kernel as a tensor: a variable of the `WeightStore` of the module being traced
    when it is large, else a constant."""
    values = np.asarray(array, np.float32)
    store = _WEIGHTS.get()
    if store is None or values.size < WeightStore.MIN_ELEMENTS:
        return tf().constant(values)
    return store.read(values)


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


def subtract_spatial(y: Any, const: np.ndarray) -> Any:
    """y - const for a spatial (not per-channel) constant, reshaped so LCE cannot fuse it.

    LCE folds a constant Add/Sub right after a bconv into the per-channel bias without a
    shape check (docs/LCE_NOTES.md "Binary ops", bug 2); a reshape in between prevents that fusion.
    """
    shape = [int(d) for d in y.shape]
    flat = tf().reshape(y, [shape[0], -1])
    flat = flat - tf().constant(const.reshape(1, -1).astype(np.float32))
    return tf().reshape(flat, shape)


def unsupported(node: Any, why: str) -> UnsupportedOpError:
    """The error for an ONNX `node` of a supported op type that this translator cannot take
    (the translator adds the list of supported op types)."""
    return UnsupportedOpError(node.name or node.output[0], node.op_type, why=why)


class TranslatorView(Protocol):
    """What a handler (`HANDLERS[op](tr, node, inputs) -> Value`) may use of the translator."""

    graph: OnnxGraph
    # ONNX tensor -> its translated Value, output by a witness model (`build_module(witness=
    # True)`): every binarization's input, and every int8 activation (converters.gate)
    witnessed: dict[str, Value]

    def const(self, name: str) -> np.ndarray | None:
        """A folded constant input, or None."""

    def value(self, name: str) -> Value:
        """The translated value of ONNX tensor `name` (translated first when it is not yet)."""

    def binarized_source(self, found: Binarization) -> Value:
        """The float tensor a binarization reads, with torch's tie-break at exact zeros."""

    def chain(self, match: BinaryLayerMatch) -> list[onnx.NodeProto]:
        """Nodes between a binary layer's binarization and its data input."""

    def replay(self, node: onnx.NodeProto, x: Value) -> Value:
        """Apply a shape-only node (or max-pool) to `x` instead of its ONNX input."""
