"""A NumPy reference interpreter of TFLite/LCE flatbuffers, for the emulated aarch64 device.

The stand-in for `lce_benchmark_model` (lce_benchmark_model_standin.py) runs it when `--graph` is
a real flatbuffer, so the device's outputs are the model's, not a made-up formula. It reads the
flatbuffer with its own small table reader and LCE's custom options with a small flexbuffer map
reader, and runs the ops of bnnexport's converted models (mnist-bnn, BinaryNet, Bi-Real-Net-18,
QuickNet-Small; float and int8) with LCE 0.16's semantics (docs/LCE_NOTES.md "Reference
interpreter"): binary convolutions as ±1 dot products with one- or zero-padding and LCE's output
transforms (float, int8, bitpacked by thresholds), int8 ops with TFLite's fixed-point
requantization as LCE's host build applies it. An op it does not know raises `UnsupportedOp`
naming it: it never guesses. Runs under the device's Debian python3 + numpy only: imports
nothing from the project, nor flatbuffers/tflite.

Example:
    >>> model = load("model-arm64-int8.tflite")                         # doctest: +SKIP
    >>> model.check_supported(); model.run(images).shape               # doctest: +SKIP
    (40, 10)
"""

import struct

import numpy as np

# --- the flatbuffer table reader (TFLite's schema.fbs field numbers) -------------------------


def _u(buf, fmt, at):
    return struct.unpack_from(fmt, buf, at)[0]


def _fields(buf, table):
    vtable = table - _u(buf, "<i", table)
    return [_u(buf, "<H", vtable + 4 + 2 * k) for k in range((_u(buf, "<H", vtable) - 4) // 2)]


def _get(buf, table, k):
    offsets = _fields(buf, table)
    return table + offsets[k] if k < len(offsets) and offsets[k] else None


def _items(buf, at):
    if at is None:
        return []
    start = at + _u(buf, "<I", at)
    return [start + 4 + 4 * k for k in range(_u(buf, "<I", start))]


def _ref(buf, at):
    return at + _u(buf, "<I", at)


def _text(buf, at):
    start = _ref(buf, at)
    return buf[start + 4 : start + 4 + _u(buf, "<I", start)].decode()


def _scalar(buf, table, k, fmt, default=0):
    at = _get(buf, table, k)
    return default if at is None else _u(buf, fmt, at)


def _array(buf, at, dtype):
    """A flatbuffer vector of scalars as a NumPy array ([] when the field is absent)."""
    if at is None:
        return np.zeros(0, dtype)
    start = _ref(buf, at)
    return np.frombuffer(buf, dtype, _u(buf, "<I", start), start + 4).copy()


def is_flatbuffer(path):
    """True for a TFLite flatbuffer (file identifier TFL3), False for anything else."""
    with open(path, "rb") as file:
        return file.read(8)[4:8] == b"TFL3"


# --- flexbuffers: enough to read a map of scalars (LCE's custom options) ---------------------


def _flex_scalar(buf, at, width, kind):
    if kind in (1, 26):  # INT, BOOL
        return int.from_bytes(buf[at : at + width], "little", signed=kind == 1)
    if kind == 2:  # UINT
        return int.from_bytes(buf[at : at + width], "little")
    if kind == 3:  # FLOAT
        return _u(buf, "<f" if width == 4 else "<d", at)
    raise ValueError(f"flexbuffer value of type {kind} is not a scalar")


def flex_map(buf):
    """The root map of a flexbuffer as a dict of its scalar values (keys sorted, as written)."""
    if not buf:
        return {}
    root_width, packed = buf[-1], buf[-2]
    root = len(buf) - 2 - root_width
    if packed >> 2 != 9:  # MAP
        raise ValueError("custom options are not a flexbuffer map")
    width = 1 << (packed & 3)
    values = root - int.from_bytes(buf[root : root + root_width], "little")
    size = int.from_bytes(buf[values - width : values], "little")
    keys_at = values - 3 * width
    keys = keys_at - int.from_bytes(buf[keys_at : keys_at + width], "little")
    key_width = int.from_bytes(buf[values - 2 * width : values - width], "little")
    result = {}
    for k in range(size):
        slot = keys + k * key_width
        start = slot - int.from_bytes(buf[slot : slot + key_width], "little")
        name = buf[start : buf.index(b"\0", start)].decode()
        kind = buf[values + size * width + k] >> 2
        result[name] = _flex_scalar(buf, values + k * width, width, kind)
    return result


# --- the model -------------------------------------------------------------------------------

TYPES = {0: np.float32, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 9: np.int8}
TYPE_NAMES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool",
              7: "int16", 9: "int8"}  # fmt: skip
BUILTIN = {
    0: "ADD", 1: "AVERAGE_POOL_2D", 2: "CONCATENATION", 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D",
    6: "DEQUANTIZE", 9: "FULLY_CONNECTED", 17: "MAX_POOL_2D", 18: "MUL", 19: "RELU", 21: "RELU6",
    22: "RESHAPE", 34: "PAD", 39: "TRANSPOSE", 40: "MEAN", 41: "SUB", 43: "SQUEEZE",
    49: "SPLIT", 114: "QUANTIZE",
}  # fmt: skip


class UnsupportedOp(Exception):
    """The flatbuffer holds an op (or an op variant) this interpreter does not implement."""


class Tensor:
    """One tensor of the main subgraph: shape, dtype, quantization and constant data."""

    def __init__(self, buf, table, buffers):
        self.name = _text(buf, _get(buf, table, 3))
        self.shape = tuple(int(d) for d in _array(buf, _get(buf, table, 0), "<i4"))
        self.type = _scalar(buf, table, 1, "<b")
        self.dtype = TYPES.get(self.type)
        quant = _get(buf, table, 4)
        quant = _ref(buf, quant) if quant is not None else None
        self.scale = _array(buf, _get(buf, quant, 2), "<f4") if quant else np.zeros(0)
        self.zero_point = _array(buf, _get(buf, quant, 3), "<i8") if quant else np.zeros(0)
        self.data = None
        data = _get(buf, buffers[_scalar(buf, table, 2, "<I")], 0)
        if data is not None and self.dtype is not None:
            raw = _array(buf, data, np.uint8)
            if raw.size:
                self.data = raw.view(np.dtype(self.dtype).newbyteorder("<")).reshape(self.shape)


class Op:
    """One operator: its builtin code (None: custom) and name, tensor indices, options."""

    def __init__(self, buf, table, codes):
        self.code, self.name = codes[_scalar(buf, table, 0, "<I")]
        self.inputs = [int(i) for i in _array(buf, _get(buf, table, 1), "<i4")]
        self.outputs = [int(i) for i in _array(buf, _get(buf, table, 2), "<i4")]
        options = _get(buf, table, 4)
        self.options = _ref(buf, options) if options is not None else None
        self.custom = flex_map(_array(buf, _get(buf, table, 5), np.uint8).tobytes())


class Model:
    """A flatbuffer's main subgraph, ready to run."""

    def __init__(self, buf):
        self.buf = buf
        self.rounding = "x86"  # `load(path, rounding)` sets it
        model = _ref(buf, 0)
        codes = []
        for at in _items(buf, _get(buf, model, 1)):
            code = _ref(buf, at)
            custom = _get(buf, code, 1)
            builtin = max(_scalar(buf, code, 3, "<i"), _scalar(buf, code, 0, "<b"))
            name = _text(buf, custom) if custom else BUILTIN.get(builtin, f"BUILTIN_{builtin}")
            codes.append((None if custom else builtin, name))
        buffers = [_ref(buf, at) for at in _items(buf, _get(buf, model, 4))]
        graph = _ref(buf, _items(buf, _get(buf, model, 2))[0])
        tensors = _items(buf, _get(buf, graph, 0))
        self.tensors = [Tensor(buf, _ref(buf, at), buffers) for at in tensors]
        self.inputs = [int(i) for i in _array(buf, _get(buf, graph, 1), "<i4")]
        self.outputs = [int(i) for i in _array(buf, _get(buf, graph, 2), "<i4")]
        self.ops = [Op(buf, _ref(buf, at), codes) for at in _items(buf, _get(buf, graph, 3))]

    def option(self, op, k, fmt="<b", default=0):
        """Field k of a builtin op's options table."""
        return default if op.options is None else _scalar(self.buf, op.options, k, fmt, default)

    def check_supported(self):
        """Raise UnsupportedOp naming the first op (or op variant) this interpreter cannot run."""
        for op in self.ops:
            types = [self.tensors[i].type for i in op.inputs + op.outputs if i >= 0]
            if op.name not in KERNELS or any(t not in (0, 2, 9) for t in types):
                kinds = "/".join(sorted({TYPE_NAMES.get(t, f"type {t}") for t in types}))
                raise UnsupportedOp(f"op {op.name} ({kinds}) is not implemented")

    def run(self, inputs):
        """The model's first output for a batch of inputs (reshaped to the input tensor's shape
        with any batch size)."""
        self.check_supported()
        first = self.tensors[self.inputs[0]]
        values = {i: t.data for i, t in enumerate(self.tensors) if t.data is not None}
        values[self.inputs[0]] = np.asarray(inputs, first.dtype).reshape((-1,) + first.shape[1:])
        for op in self.ops:
            args = [values[i] if i >= 0 else None for i in op.inputs]
            result = KERNELS[op.name](self, op, args)  # a tuple for an op of several outputs
            results = result if isinstance(result, tuple) else (result,)
            for index, value in zip(op.outputs, results, strict=True):
                values[index] = value
        self.last_values = values  # every tensor by index (benchmarks/int8_on_arm.py reads them)
        return values[self.outputs[0]]

    def tensor(self, op, k):
        """Input k of an op (k = -1: its output) as a Tensor."""
        return self.tensors[op.outputs[0] if k == -1 else op.inputs[k]]


ROUNDINGS = ("x86", "arm")  # whose int8 requantization: LCE's x86 host build, or its ARM build


def load(path, rounding="x86"):
    """The model of a flatbuffer file, computing int8 requantization as LCE's x86 build does
    (`rounding="x86"`, the host's interpreter) or as its aarch64 build does ("arm", what
    `lce_benchmark_model` computes on a device, and so the stand-in)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding {rounding!r}: one of {ROUNDINGS}")
    with open(path, "rb") as file:
        model = Model(file.read())
    model.rounding = rounding
    return model


def int8_output_step(path):
    """The scale of the int8 tensor a flatbuffer's float output is dequantized from: what one
    int8 step of its output is worth."""
    model = load(path)
    last = model.ops[-1]
    if last.name != "DEQUANTIZE":
        raise ValueError(f"{path}: its last op is {last.name}, not DEQUANTIZE")
    return float(model.tensors[last.inputs[0]].scale[0])


# --- geometry shared by convolutions and pools (TFLite's SAME = 0, VALID = 1) ----------------


def _geometry(size, k, stride, dilation, padding):
    """(output size, padding before, padding after) along one spatial axis."""
    span = (k - 1) * dilation + 1
    if padding == 1:
        return (size - span) // stride + 1, 0, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + span - size, 0)
    return out, total // 2, total - total // 2


def _patches(x, kernel, stride, dilation, padding, pad_value):
    """NHWC -> (N, OH, OW, kh * kw, C): each output position's window, `pad_value` off the edges."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh, top, bottom = _geometry(x.shape[1], kh, sh, dh, padding)
    ow, left, right = _geometry(x.shape[2], kw, sw, dw, padding)
    x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=pad_value)
    taps = [
        x[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    return np.stack(taps, axis=3)


def _conv_geometry(m, op):
    """(stride, dilation, padding) of a CONV_2D / DEPTHWISE_CONV_2D (options differ by index)."""
    first = 4 if op.name == "CONV_2D" else 5
    stride = (m.option(op, 2, "<i", 1), m.option(op, 1, "<i", 1))
    dilation = (m.option(op, first + 1, "<i", 1), m.option(op, first, "<i", 1))
    return stride, dilation, m.option(op, 0)


# --- float and int8 arithmetic as TFLite does it ---------------------------------------------

FLOAT_RANGES = {0: (-np.inf, np.inf), 1: (0.0, np.inf), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


def _activate(m, out, y, activation):
    """The fused activation: a float clamp, or int8's clamp in the output's quantized units."""
    low, high = FLOAT_RANGES[activation]
    if out.dtype == np.float32:
        return np.clip(y, low, high).astype(np.float32)
    scale, zero = float(out.scale[0]), int(out.zero_point[0])
    low = -128 if low == -np.inf else max(-128, zero + _round_away(low / scale))
    high = 127 if high == np.inf else min(127, zero + _round_away(high / scale))
    return np.clip(y, low, high).astype(np.int8)


def _round_away(x):
    """Round half away from zero (TfLiteRound, std::round)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _quantize_multiplier(real):
    """TFLite's QuantizeMultiplier: real = q * 2**(shift - 31), q a Q31 int in [2**30, 2**31)."""
    mantissa, shift = np.frexp(np.asarray(real, np.float64))
    q = _round_away(mantissa * (1 << 31)).astype(np.int64)
    shift = np.where(q == 1 << 31, shift + 1, shift).astype(np.int64)
    q = np.where(q == 1 << 31, q // 2, q)
    tiny = shift < -31
    return np.where(tiny, 0, q), np.where(tiny, 0, shift)


def _requantize(acc, q, shift, rounding="x86"):
    """MultiplyByQuantizedMultiplier, in int64: a left shift for shift > 0, a rounding high
    multiply by the Q31 multiplier (ties up), then a rounding right shift whose ties go up as
    ruy's x86 kernels (LCE's host build) round them, or away from zero as the ARM build does
    (`rounding="arm"`: TFLite's RoundingDivideByPOT; docs/LCE_NOTES.md "int8 on ARM", found by
    comparing the real aarch64 tool's int8 tensors with this: bit for bit equal then). The ARM
    build rounds so in its int8 GEMM (CONV_2D, and FULLY_CONNECTED, which takes the same GEMM);
    its DEPTHWISE_CONV_2D rounds ties up like the x86 build (`_tie_rounding`)."""
    acc = acc.astype(np.int64) * np.left_shift(np.int64(1), np.maximum(shift, 0))
    high = (acc * q + (1 << 30)) >> 31
    right = np.maximum(-shift, 0)
    if rounding == "arm":
        mask = np.left_shift(np.int64(1), right) - 1
        threshold = (mask >> 1) + (high < 0)  # a negative tie rounds down: away from zero
        return (high >> right) + ((high & mask) > threshold)
    half = np.where(right > 0, np.left_shift(np.int64(1), np.maximum(right - 1, 0)), 0)
    return (high + half) >> right


def _tie_rounding(m, op):
    """The requantization rounding `op` gets in the build `m.rounding` names."""
    return "x86" if op.name == "DEPTHWISE_CONV_2D" else m.rounding


def _int8_output(m, op, acc, input_scale, weight_scale, activation):
    """An int32 accumulator requantized to the op's int8 output, as TFLite's conv / FC do."""
    out = m.tensor(op, -1)
    effective = float(input_scale) * weight_scale.astype(np.float64) / float(out.scale[0])
    q, shift = _quantize_multiplier(effective)
    requantized = _requantize(acc, q, shift, _tie_rounding(m, op))
    return _activate(m, out, requantized + int(out.zero_point[0]), activation)


def _offset(m, op, x):
    """An int8 input with its zero point taken away (int64), and its scale."""
    tensor = m.tensor(op, 0)
    return x.astype(np.int64) - int(tensor.zero_point[0]), float(tensor.scale[0])


# --- builtin ops -----------------------------------------------------------------------------


def op_conv_2d(m, op, args):
    x, w, b = args
    stride, dilation, padding = _conv_geometry(m, op)
    activation = m.option(op, 3)
    if m.tensor(op, 0).dtype == np.int8:
        x, scale = _offset(m, op, x)
        cols = _patches(x, w.shape[1:3], stride, dilation, padding, 0)
        acc = cols.reshape(cols.shape[:3] + (-1,)) @ w.reshape(len(w), -1).astype(np.int64).T
        acc = acc + (0 if b is None else b.astype(np.int64))
        return _int8_output(m, op, acc, scale, m.tensor(op, 1).scale, activation)
    cols = _patches(x.astype(np.float64), w.shape[1:3], stride, dilation, padding, 0.0)
    y = cols.reshape(cols.shape[:3] + (-1,)) @ w.reshape(len(w), -1).astype(np.float64).T
    return _activate(m, m.tensor(op, -1), y + (0.0 if b is None else b), activation)


def op_depthwise_conv_2d(m, op, args):
    x, w, b = args  # w: (1, kh, kw, C * multiplier); output channel c reads input c // multiplier
    stride, dilation, padding = _conv_geometry(m, op)
    multiplier, activation = w.shape[3] // x.shape[3], m.option(op, 4)
    weights = w.reshape(-1, w.shape[3])
    if m.tensor(op, 0).dtype == np.int8:
        x, scale = _offset(m, op, x)
        cols = np.repeat(_patches(x, w.shape[1:3], stride, dilation, padding, 0), multiplier, 4)
        acc = np.einsum("nhwkc,kc->nhwc", cols, weights.astype(np.int64))
        acc = acc + (0 if b is None else b.astype(np.int64))
        return _int8_output(m, op, acc, scale, m.tensor(op, 1).scale, activation)
    cols = _patches(x.astype(np.float64), w.shape[1:3], stride, dilation, padding, 0.0)
    cols = np.repeat(cols, multiplier, axis=4)
    y = np.einsum("nhwkc,kc->nhwc", cols, weights.astype(np.float64))
    return _activate(m, m.tensor(op, -1), y + (0.0 if b is None else b), activation)


def op_fully_connected(m, op, args):
    x, w, b = args
    activation, keep = m.option(op, 0), m.option(op, 2)
    rows = x.reshape(-1, w.shape[1])
    if m.tensor(op, 0).dtype == np.int8:
        rows, scale = _offset(m, op, rows)
        acc = rows @ w.astype(np.int64).T + (0 if b is None else b.astype(np.int64))
        y = _int8_output(m, op, acc, scale, m.tensor(op, 1).scale, activation)
    else:
        y = rows.astype(np.float64) @ w.astype(np.float64).T + (0.0 if b is None else b)
        y = _activate(m, m.tensor(op, -1), y, activation)
    return y.reshape(x.shape[:-1] + (len(w),)) if keep else y


def _pool(m, op, x, reduce, pad_value):
    kernel = (m.option(op, 4, "<i", 1), m.option(op, 3, "<i", 1))
    stride = (m.option(op, 2, "<i", 1), m.option(op, 1, "<i", 1))
    return reduce(_patches(x, kernel, stride, (1, 1), m.option(op, 0), pad_value), axis=3)


def op_max_pool_2d(m, op, args):
    (x,) = args
    low = -np.inf if x.dtype == np.float32 else np.iinfo(x.dtype).min
    return _activate(m, m.tensor(op, -1), _pool(m, op, x, np.max, low), m.option(op, 5))


def op_average_pool_2d(m, op, args):
    """The mean of the in-bounds cells; int8: their int sum divided by their count, rounded
    half away from zero in integers, as TFLite's int8 kernel does (in and out share a scale)."""
    (x,) = args
    count = _pool(m, op, np.ones(x.shape[:3] + (1,), np.int64), np.sum, 0)
    if x.dtype == np.int8:
        total = _pool(m, op, x.astype(np.int64), np.sum, 0)
        half = np.where(total > 0, count // 2, -(count // 2))
        y = np.sign(total + half) * (np.abs(total + half) // count)  # C++ truncation
        return _activate(m, m.tensor(op, -1), y, m.option(op, 5))
    total = _pool(m, op, x.astype(np.float64), np.sum, 0.0)
    return _activate(m, m.tensor(op, -1), total / count, m.option(op, 5))


def op_reshape(m, op, args):
    shape = m.tensor(op, -1).shape
    if int(np.prod(shape)) != args[0].size:  # another batch size than the flatbuffer's
        shape = (-1,) + shape[1:]
    return args[0].reshape(shape)


def op_quantize(m, op, args):
    (x,) = args
    out = m.tensor(op, -1)
    if x.dtype != np.float32:
        raise UnsupportedOp("op QUANTIZE (int8 -> int8) is not implemented")
    q = np.rint(x / out.scale[0]) + int(out.zero_point[0])  # ties to even, as LCE's host build
    return np.clip(q, -128, 127).astype(np.int8)


def op_dequantize(m, op, args):
    """(q - z) * s in float32 on the x86 build; on the ARM build one fused multiply-add,
    q * s + float32(-z * s), so a value at the zero point becomes that rounding's residue
    (a few 1e-9, either sign) instead of 0 (docs/LCE_NOTES.md "int8 on ARM")."""
    tensor = m.tensor(op, 0)
    scale, zero = np.float32(tensor.scale[0]), int(tensor.zero_point[0])
    if (
        m.rounding == "arm"
    ):  # exact in float64 (a 24-bit scale times an 8-bit integer), rounded once
        offset = np.float64(np.float32(-zero * np.float64(scale)))
        return (args[0].astype(np.float64) * np.float64(scale) + offset).astype(np.float32)
    q = args[0].astype(np.int32) - zero
    return (q.astype(np.float32) * scale).astype(np.float32)


def op_add(m, op, args):
    a, b = args
    if a.dtype != np.float32:
        raise UnsupportedOp("op ADD (int8) is not implemented")
    return _activate(m, m.tensor(op, -1), a + b, m.option(op, 0))


def op_mul(m, op, args):
    a, b = args
    if a.dtype != np.float32:
        raise UnsupportedOp("op MUL (int8) is not implemented")
    return _activate(m, m.tensor(op, -1), a * b, m.option(op, 0))


def op_sub(m, op, args):
    a, b = args
    if a.dtype != np.float32:
        raise UnsupportedOp("op SUB (int8) is not implemented")
    return _activate(m, m.tensor(op, -1), a - b, m.option(op, 0))


def op_pad(m, op, args):
    x, paddings = args[:2]
    value = 0 if x.dtype == np.float32 else int(m.tensor(op, 0).zero_point[0])
    return np.pad(x, [tuple(p) for p in paddings], constant_values=value)


def op_mean(m, op, args):
    x, axes = args
    if x.dtype != np.float32:
        raise UnsupportedOp("op MEAN (int8) is not implemented")
    y = x.astype(np.float64).mean(axis=tuple(int(a) for a in np.ravel(axes)), keepdims=True)
    return y.astype(np.float32).reshape((len(x),) + m.tensor(op, -1).shape[1:])


def op_concatenation(m, op, args):
    """Float: joined. int8: each input rescaled to the output's grid in float32,
    round(q * s_in / s_out - z_in * s_in / s_out) + z_out (ties away), as TFLite's kernel does."""
    out = m.tensor(op, -1)
    if out.dtype == np.int8:
        parts = []
        for k, q in enumerate(args):
            tensor = m.tensor(op, k)
            scale = np.float32(tensor.scale[0]) * (np.float32(1) / np.float32(out.scale[0]))
            offset = np.float32(-int(tensor.zero_point[0])) * scale
            y = _round_away(q.astype(np.float32) * scale + offset) + int(out.zero_point[0])
            parts.append(np.clip(y, -128, 127))
        args = parts
    batch = max(len(a) for a in args)  # a constant (batch 1) joins a batch of N
    args = [np.broadcast_to(a, (batch,) + a.shape[1:]) for a in args]
    y = np.concatenate(args, axis=m.option(op, 0, "<i"))
    return _activate(m, out, y, m.option(op, 1))


def op_transpose(m, op, args):
    return np.transpose(args[0], [int(a) for a in args[1]])


def op_split(m, op, args):
    """SPLIT(axis, x) into num_splits equal parts (a grouped conv's per-group inputs); any type,
    the values moved as they are."""
    axis, x = int(np.asarray(args[0]).reshape(-1)[0]), args[1]
    return tuple(np.split(x, m.option(op, 0, "<i", 1), axis=axis % x.ndim))


# --- LCE's custom ops ------------------------------------------------------------------------


def _pack(negative):
    """Bools (..., C) -> LCE's bitpacked int32 words (..., ceil(C / 32)): bit c % 32 of word
    c // 32 is set for a negative value; the last word's unused bits are 0."""
    channels = negative.shape[-1]
    negative = np.pad(negative, [(0, 0)] * (negative.ndim - 1) + [(0, -channels % 32)])
    bits = negative.reshape(negative.shape[:-1] + (-1, 32)).astype(np.uint64)
    return (bits << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32).view(np.int32)


def _unpack(words, channels):
    """LCE's bitpacked int32 words (..., W) -> ±1.0 (..., channels): a set bit is -1."""
    bits = (words.view(np.uint32)[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return 1.0 - 2.0 * bits.reshape(words.shape[:-1] + (-1,))[..., :channels].astype(np.float32)


def op_lce_quantize(m, op, args):
    (x,) = args
    zero = int(m.tensor(op, 0).zero_point[0]) if x.dtype == np.int8 else 0
    return _pack(x < zero)


def op_lce_dequantize(m, op, args):
    out = m.tensor(op, -1)
    signs = _unpack(args[0], out.shape[-1])
    if out.dtype == np.float32:
        return signs
    q = _round_away(signs / out.scale[0]) + int(out.zero_point[0])
    return np.clip(q, -128, 127).astype(np.int8)


def op_lce_bmaxpool2d(m, op, args):
    """Max of ±1 values = AND of their sign bits; cells beyond the edges do not count."""
    o = op.custom
    kernel = (o["filter_height"], o["filter_width"])
    stride = (o["stride_height"], o["stride_width"])
    cells = _patches(args[0], kernel, stride, (1, 1), o["padding"], -1)
    return np.bitwise_and.reduce(cells, axis=3)


def _distinct_rows(rows):
    """(the distinct rows of a matrix of -1/0/+1, each row's index among them): a binary
    layer's windows repeat (an image's background), and the emulated device's reference BLAS
    is slow, so each distinct window is multiplied once."""
    key = np.packbits(np.concatenate([rows < 0, rows == 0], axis=1), axis=1)
    key = np.ascontiguousarray(key).view(np.dtype((np.void, key.shape[1]))).ravel()
    _, first, where = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], where.ravel()


def op_lce_bconv2d(m, op, args):
    """±1 dot products over the window (padding +1 or 0), then LCE's output transform: compare
    the XOR-popcount with thresholds (bitpacked output), or clamp it and apply the multiplier and
    bias folded as LCE's kernel folds them (float, or int8 with its scale and zero point)."""
    x, w, multiplier, bias, thresholds = args
    o = op.custom
    channels_in, padding = o["channels_in"], o["padding"]
    groups = x.shape[-1] // w.shape[-1]
    per_group = channels_in // groups
    signs = _unpack(x, channels_in)
    kernel, stride = w.shape[1:3], (o["stride_height"], o["stride_width"])
    dilation = (o["dilation_height_factor"], o["dilation_width_factor"])
    cols = _patches(signs, kernel, stride, dilation, padding, float(o["pad_values"]))
    rows, where = _distinct_rows(cols.reshape(-1, cols.shape[3] * cols.shape[4]))
    rows = rows.reshape((len(rows),) + cols.shape[3:])
    filters = _unpack(w, per_group)  # (O, kh, kw, per_group)
    per_out = len(w) // groups
    dots = [
        rows[..., g * per_group : (g + 1) * per_group].reshape(len(rows), -1)
        @ filters[g * per_out : (g + 1) * per_out].reshape(per_out, -1).T
        for g in range(groups)
    ]
    dot = np.concatenate(dots, axis=-1).astype(np.int64)  # exact: small integers in float32
    dot = dot[where].reshape(cols.shape[:3] + (-1,))
    depth = kernel[0] * kernel[1] * per_group
    out = m.tensor(op, -1)
    if out.dtype == np.int32:
        return _pack((depth - dot) // 2 > thresholds)
    low, high = FLOAT_RANGES[o["fused_activation_function"]]
    low, high = max(low, -depth), min(high, depth)
    doubled = np.clip(depth - dot, depth - high, depth - low)  # 2 * popcount, clamped
    scale = float(out.scale[0]) if out.dtype == np.int8 else 1.0
    zero = float(out.zero_point[0]) if out.dtype == np.int8 else 0.0
    folded_multiplier = (-multiplier.astype(np.float64) / scale).astype(np.float32)
    folded_bias = (bias + depth * multiplier.astype(np.float64)) / scale + zero
    if m.rounding == "arm":  # one fused multiply-add: exact in float64, rounded once
        y = doubled * folded_multiplier.astype(np.float64) + folded_bias.astype(np.float32)
        y = y.astype(np.float32)
    else:
        y = doubled.astype(np.float32) * folded_multiplier + folded_bias.astype(np.float32)
    if out.dtype == np.float32:
        return y
    return np.clip(_round_away(y), -128, 127).astype(np.int8)


KERNELS = {
    "CONV_2D": op_conv_2d, "DEPTHWISE_CONV_2D": op_depthwise_conv_2d,
    "FULLY_CONNECTED": op_fully_connected, "MAX_POOL_2D": op_max_pool_2d,
    "AVERAGE_POOL_2D": op_average_pool_2d, "RESHAPE": op_reshape, "QUANTIZE": op_quantize,
    "DEQUANTIZE": op_dequantize, "ADD": op_add, "SUB": op_sub, "MUL": op_mul, "PAD": op_pad,
    "MEAN": op_mean,
    "CONCATENATION": op_concatenation, "LceQuantize": op_lce_quantize,
    "LceDequantize": op_lce_dequantize, "LceBMaxPool2d": op_lce_bmaxpool2d,
    "LceBconv2d": op_lce_bconv2d, "TRANSPOSE": op_transpose, "SPLIT": op_split,
}  # fmt: skip
