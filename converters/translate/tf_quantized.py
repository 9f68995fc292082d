"""int8 handlers of the translator: the QDQ form of `converters.quantize` as the TensorFlow
fake quantization LCE's converter turns into int8 ops.

- `QuantizeLinear -> DequantizeLinear` on an activation, per tensor with scale s and zero
  point z, becomes `tf.quantization.fake_quant_with_min_max_vars` over [(qmin - z) s,
  (qmax - z) s] (8 bits): TFLite then stores the tensor as int8 with that scale and zero point.
  A float conv or depthwise conv between two such tensors becomes an int8 `CONV_2D` /
  `DEPTHWISE_CONV_2D` whose kernel TFLite quantizes per output channel at max |w| / 127, the
  kernel the QDQ model holds (its `DequantizeLinear` of a constant is folded by the reader);
  a binarization of such a tensor an `LceQuantize` reading int8 (docs/LCE_NOTES.md "int8
  around binary layers").
- A dense layer (MatMul/Gemm) whose input is such a tensor becomes a 1x1 conv on [N, 1, 1, F]:
  TFLite quantizes a FULLY_CONNECTED kernel per tensor only, a conv's per output channel.

Example:
    >>> HANDLERS["DequantizeLinear"]   # (translator, node, inputs) -> Value   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from bnnexport.converters.graph import attributes
from bnnexport.converters.translate import tf_layers
from bnnexport.converters.translate.tf_ops import TranslatorView, tf, unsupported
from bnnexport.converters.translate.values import Layout, Value

if TYPE_CHECKING:
    from onnx import NodeProto


def quantized_range(scale: float, zero_point: np.ndarray) -> tuple[float, float]:
    """The real range [lowest, highest] of a per-tensor int8 or uint8 quantization."""
    info = np.iinfo(np.asarray(zero_point).dtype)
    zero = int(np.asarray(zero_point).reshape(-1)[0])
    return (info.min - zero) * scale, (info.max - zero) * scale


def _point(tr: TranslatorView, node: NodeProto) -> tuple[float, np.ndarray] | None:
    """(scale, zero point) of a per-tensor QuantizeLinear/DequantizeLinear with constants."""
    scale = tr.const(node.input[1])
    zero = tr.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.uint8(0)
    if scale is None or zero is None or np.asarray(scale).size != 1 or np.size(zero) != 1:
        return None
    return float(np.asarray(scale).reshape(-1)[0]), np.asarray(zero)


def quantize(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """A QuantizeLinear read only by DequantizeLinears of the same scale and zero point: its
    input, which the DequantizeLinear fake-quantizes (an int8 tensor of its own has no float
    form here)."""
    readers = tr.graph.consumers.get(node.output[0], ())
    same = all(r.op_type == "DequantizeLinear" and r.input[1:] == node.input[1:] for r in readers)
    if inputs[0] is None or not readers or not same or _point(tr, node) is None:
        raise unsupported(node, "only as QuantizeLinear -> DequantizeLinear, per tensor")
    return inputs[0]


def dequantize(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """QuantizeLinear -> DequantizeLinear as TensorFlow's fake quantization (module doc)."""
    source = tr.graph.producer.get(node.input[0])
    found = _point(tr, node)
    if source is None or source.op_type != "QuantizeLinear" or found is None:
        raise unsupported(node, "only after a QuantizeLinear, or of a constant (folded)")
    x = inputs[0]
    lowest, highest = quantized_range(*found)
    t = tf().quantization.fake_quant_with_min_max_vars(
        x.tensor, lowest, highest, num_bits=8, narrow_range=False
    )
    value = Value(t, x.layout, x.perm)
    if node.output[0] not in {o.name for o in tr.graph.outputs}:  # (an output is output)
        tr.witnessed.setdefault(node.output[0], value)  # what the int8 gate imposes, checks
    return value


def _reads_quantized(tr: TranslatorView, node: NodeProto) -> bool:
    source = tr.graph.producer.get(node.input[0])
    return source is not None and source.op_type == "DequantizeLinear"


def dense(tr: TranslatorView, node: NodeProto, inputs: list[Value | None]) -> Value:
    """A dense layer: on a quantized input, a 1x1 conv whose kernel TFLite quantizes per output
    channel (module doc); otherwise the float dense layer of `tf_layers`."""
    if not _reads_quantized(tr, node):
        return tf_layers.dense(tr, node, inputs)
    attrs = attributes(node)
    kernel, x = tr.const(node.input[1]), inputs[0]
    if kernel is None or x is None or kernel.ndim != 2 or len(x.shape()) != 2:
        raise unsupported(node, "only [N, F] x constant [F, O] products")
    if node.op_type == "Gemm":
        if attrs.get("transA", 0):
            raise unsupported(node, "transA=1")
        kernel = (kernel.T if attrs.get("transB", 0) else kernel) * np.float32(
            attrs.get("alpha", 1.0)
        )
    if x.layout == Layout.PERMUTED_COLUMNS:
        kernel = kernel[x.perm]
    n, features = x.shape()
    x4 = x.tensor
    if x.layout != Layout.FLAT_IN_NHWC:
        x4 = tf().reshape(x.tensor, [n, 1, 1, features])
    k = tf().constant(kernel.reshape(1, 1, *kernel.shape).astype(np.float32))
    y = tf().nn.conv2d(x4, k, [1, 1, 1, 1], "VALID")
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        bias = tr.const(node.input[2])
        if bias is None:
            raise unsupported(node, "the bias must be a constant")
        y = y + tf().constant((bias * np.float32(attrs.get("beta", 1.0))).astype(np.float32))
    return Value(y, Layout.FLAT_IN_NHWC)


HANDLERS = {
    "QuantizeLinear": quantize,
    "DequantizeLinear": dequantize,
    "MatMul": dense,
    "Gemm": dense,
}
