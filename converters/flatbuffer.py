"""A minimal TFLite flatbuffer reader: the operators a model holds, its signature's outputs, its
constant tensors of one element type, and its metadata (with the one writer: metadata added),
the input layout the metadata declares, and a batch put in that layout.

Enough of the schema to list operators (LCE's custom ops by name, e.g. `LceBconv2d`) with their
tensors' names, shapes and element types, and to read a constant's values, without importing
TensorFlow. A flatbuffer's `metadata` is TFLite's list of named buffers, which interpreters
ignore and apps read (TFLite's C++ `FlatBufferModel::ReadAllMetadata`): `with_metadata` adds
entries (bnnexport writes the class names there) through TF's generated schema, `metadata`
reads them back. Every flatbuffer bnnexport converts from a model with an image input says there
how it takes that input (`input_layout`: "nhwc", TFLite's convention, or "nchw", PyTorch's and
ONNX's), and `to_input_layout` turns bnnexport's NCHW samples into it: the one place on this
machine where samples meet a flatbuffer's layout (docs/LCE_NOTES.md "Input layout").

Example:
    >>> from bnnexport.converters.flatbuffer import op_histogram
    >>> op_histogram("model-arm64.tflite")["LceBconv2d"]              # doctest: +SKIP
    3
"""

from __future__ import annotations

import importlib.util
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bnnexport.converters.choices import INPUT_LAYOUTS
from bnnexport.converters.errors import InputShapeError, InvalidModelError


def read_flatbuffer(path_or_bytes: str | Path | bytes) -> bytes:
    """The bytes of a TFLite flatbuffer; InvalidModelError when missing or not a flatbuffer."""
    if isinstance(path_or_bytes, bytes):
        data = path_or_bytes
    else:
        path = Path(path_or_bytes)
        if not path.is_file():
            raise InvalidModelError(f"no such flatbuffer: {path}")
        data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise InvalidModelError("not a TFLite flatbuffer (no TFL3 identifier)")
    return data


def _table(buf: bytes, pos: int) -> tuple[int, list[int]]:
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    size = struct.unpack_from("<H", buf, vtable)[0]
    fields = [struct.unpack_from("<H", buf, vtable + 4 + 2 * k)[0] for k in range((size - 4) // 2)]
    return pos, fields


def _field(buf: bytes, table: tuple[int, list[int]], index: int) -> int | None:
    pos, fields = table
    return pos + fields[index] if index < len(fields) and fields[index] else None


def _vector(buf: bytes, at: int) -> list[int]:
    start = at + struct.unpack_from("<I", buf, at)[0]
    count = struct.unpack_from("<I", buf, start)[0]
    return [start + 4 + 4 * k for k in range(count)]


def _deref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _schema() -> Any:
    """TF's generated TFLite schema module, loaded without importing TensorFlow; None without
    TensorFlow."""
    spec = importlib.util.find_spec("tensorflow")
    if spec and spec.submodule_search_locations:
        path = (
            Path(next(iter(spec.submodule_search_locations))) / "lite/python/schema_py_generated.py"
        )
        if path.is_file():
            module_spec = importlib.util.spec_from_file_location("_tflite_schema", path)
            module = importlib.util.module_from_spec(module_spec)
            try:
                module_spec.loader.exec_module(module)
                return module
            except Exception:
                pass
    return None


def _builtin_names() -> dict[int, str]:
    """BuiltinOperator names from TF's generated schema (`_schema`)."""
    schema = _schema()
    if schema is not None:
        return {v: k for k, v in vars(schema.BuiltinOperator).items() if isinstance(v, int)}
    return {0: "ADD", 1: "AVERAGE_POOL_2D", 2: "CONCATENATION", 3: "CONV_2D",
            4: "DEPTHWISE_CONV_2D", 9: "FULLY_CONNECTED", 17: "MAX_POOL_2D", 18: "MUL",
            22: "RESHAPE", 25: "SOFTMAX", 32: "CUSTOM", 34: "PAD", 39: "TRANSPOSE",
            41: "SUB", 42: "DIV", 60: "PADV2"}  # fmt: skip


def _op_codes(buf: bytes, model: tuple[int, list[int]]) -> list[str]:
    """The name of each operator code: builtin by schema name, custom by custom code."""
    names = _builtin_names()
    codes = []
    for at in _vector(buf, _field(buf, model, 1)):
        code = _table(buf, _deref(buf, at))
        deprecated = _field(buf, code, 0)
        custom = _field(buf, code, 1)
        builtin = _field(buf, code, 3)
        number = struct.unpack_from("<i", buf, builtin)[0] if builtin else 0
        if deprecated is not None and not builtin:
            number = struct.unpack_from("<b", buf, deprecated)[0]
        if custom is not None:
            codes.append(_string(buf, custom))
        else:
            codes.append(names.get(number, f"BUILTIN_{number}"))
    return codes


# TFLite's TensorType enum (schema.fbs), the values a tensor's `type` field holds
TENSOR_TYPES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 5: "STRING",
                6: "BOOL", 7: "INT16", 8: "COMPLEX64", 9: "INT8", 10: "FLOAT64"}  # fmt: skip


@dataclass
class FlatOp:
    """One operator of a flatbuffer's main subgraph: its index in the execution plan (the
    node index `lce_benchmark_model`'s op profile prints), type, and tensor names."""

    index: int
    op_type: str
    inputs: list[str]
    outputs: list[str]
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    # each tensor's element type by schema name (FLOAT32, INT8, INT32, ...; "" when left out)
    input_types: list[str] = field(default_factory=list)
    output_types: list[str] = field(default_factory=list)


def _int_vector(buf: bytes, at: int | None) -> tuple[int, ...]:
    if at is None:
        return ()
    start = _deref(buf, at)
    count = struct.unpack_from("<I", buf, start)[0]
    return struct.unpack_from(f"<{count}i", buf, start + 4)


def flatbuffer_ops(flatbuffer_bytes: bytes | str | Path) -> list[FlatOp]:
    """The operators of the main subgraph in execution order, with their tensors' names
    ("" for an optional input left out)."""
    buf = read_flatbuffer(flatbuffer_bytes)
    try:
        model = _table(buf, _deref(buf, 0))
        codes = _op_codes(buf, model)
        subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
        tensors = [_table(buf, _deref(buf, at)) for at in _vector(buf, _field(buf, subgraph, 0))]

        def name(index: int) -> str:
            at = _field(buf, tensors[index], 3) if index >= 0 else None
            return _string(buf, at) if at is not None else ""

        def shape(index: int) -> list[int]:
            return list(_int_vector(buf, _field(buf, tensors[index], 0))) if index >= 0 else []

        def dtype(index: int) -> str:
            if index < 0:
                return ""
            at = _field(buf, tensors[index], 1)  # absent: the schema's default, FLOAT32
            return TENSOR_TYPES.get(struct.unpack_from("<b", buf, at)[0] if at else 0, "?")

        ops = []
        operators = _field(buf, subgraph, 3)
        for k, op_at in enumerate(_vector(buf, operators) if operators else []):
            op = _table(buf, _deref(buf, op_at))
            index = _field(buf, op, 0)
            code = codes[struct.unpack_from("<I", buf, index)[0] if index else 0]
            ins, outs = (_int_vector(buf, _field(buf, op, f)) for f in (1, 2))
            ops.append(
                FlatOp(
                    k,
                    code,
                    [name(i) for i in ins],
                    [name(i) for i in outs],
                    [shape(i) for i in ins],
                    [shape(i) for i in outs],
                    [dtype(i) for i in ins],
                    [dtype(i) for i in outs],
                )  # fmt: skip
            )
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return ops


INT8 = 9  # TENSOR_TYPES' INT8


def _per_tensor_int8(buf: bytes, tensor: tuple[int, list[int]]) -> bool:
    """Whether a tensor is int8, quantized per tensor (one scale)."""
    kind, quantization = _field(buf, tensor, 1), _field(buf, tensor, 4)
    if kind is None or struct.unpack_from("<b", buf, kind)[0] != INT8 or quantization is None:
        return False
    scales = _field(buf, _table(buf, _deref(buf, quantization)), 2)
    return scales is not None and struct.unpack_from("<I", buf, _deref(buf, scales))[0] == 1


def _main_ops(buf: bytes) -> list[tuple[str, tuple[int, list[int]]]]:
    """Each operator of the main subgraph in execution order: its type and its table."""
    model = _table(buf, _deref(buf, 0))
    codes = _op_codes(buf, model)
    subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
    operators = _field(buf, subgraph, 3)
    ops = []
    for at in _vector(buf, operators) if operators else []:
        op = _table(buf, _deref(buf, at))
        index = _field(buf, op, 0)
        ops.append((codes[struct.unpack_from("<I", buf, index)[0] if index else 0], op))
    return ops


def _dequantized_int8(buf: bytes, ops: list[tuple[str, tuple[int, list[int]]]]) -> dict[int, int]:
    """The float tensor each `DEQUANTIZE` of a per-tensor int8 tensor writes -> that int8
    tensor (tensor indices of the main subgraph)."""
    model = _table(buf, _deref(buf, 0))
    subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
    tensors = [_table(buf, _deref(buf, at)) for at in _vector(buf, _field(buf, subgraph, 0))]
    found = {}
    for kind, op in ops:
        ins, outs = (_int_vector(buf, _field(buf, op, f)) for f in (1, 2))
        if kind == "DEQUANTIZE" and ins and outs and _per_tensor_int8(buf, tensors[ins[0]]):
            found[outs[0]] = ins[0]
    return found


def binarize_int8_directly(flatbuffer_bytes: bytes | str | Path) -> tuple[bytes, int]:
    """The flatbuffer with every `LceQuantize` that reads a `DEQUANTIZE` of an int8 activation
    reading that int8 tensor itself, and how many it rewired (0: the bytes as they were). Only
    the `LceQuantize`'s input index changes, in place: the `DEQUANTIZE` stays, for its other
    readers (a residual ADD) or, if it has none left, as an unread op.

    Why: LCE's converter leaves a binarization of an int8 tensor on the dequantized float one
    when a float op (a residual ADD) reads that tensor too, and LCE's aarch64 build dequantizes
    the zero point to a residue of about 1e-9 of either sign, which then binarizes to -1 where
    the model (and the x86 build) says +1; an `LceQuantize` reading int8 compares the integer
    with the zero point, exactly (docs/LCE_NOTES.md "int8 on ARM"). On every runtime whose
    `DEQUANTIZE` maps the zero point to 0 the two compute the same signs.

    Example:
        >>> rewired, count = binarize_int8_directly(flatbuffer)          # doctest: +SKIP
        >>> count                                                         # doctest: +SKIP
        4
    """
    buf = bytearray(read_flatbuffer(flatbuffer_bytes))
    try:
        ops = _main_ops(buf)
        dequantized = _dequantized_int8(buf, ops)
        rewired = 0
        for kind, op in ops:
            at = _field(buf, op, 1)
            if kind != "LceQuantize" or at is None:
                continue
            first = _deref(buf, at) + 4  # the first input's tensor index
            source = dequantized.get(struct.unpack_from("<i", buf, first)[0])
            if source is not None:
                struct.pack_into("<i", buf, first, source)
                rewired += 1
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return bytes(buf), rewired


def op_histogram(flatbuffer_bytes: bytes | str | Path) -> dict[str, int]:
    """How many times each operator occurs in a TFLite flatbuffer (all subgraphs).

    Builtin ops by their schema name (CONV_2D, FULLY_CONNECTED...), custom ops by their
    custom code (LceQuantize, LceBconv2d, LceBMaxPool2d, LceDequantize).
    """
    buf = read_flatbuffer(flatbuffer_bytes)
    try:
        model = _table(buf, _deref(buf, 0))
        codes = _op_codes(buf, model)
        counts: Counter[str] = Counter()
        for at in _vector(buf, _field(buf, model, 2)):
            subgraph = _table(buf, _deref(buf, at))
            operators = _field(buf, subgraph, 3)
            for op_at in _vector(buf, operators) if operators else []:
                op = _table(buf, _deref(buf, op_at))
                index = _field(buf, op, 0)
                counts[codes[struct.unpack_from("<I", buf, index)[0] if index else 0]] += 1
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return dict(sorted(counts.items()))


# the kind a global average pool counts as in `op_kinds`, whichever op writes it
GLOBAL_AVERAGE_POOL = "GLOBAL_AVERAGE_POOL"


def op_kinds(flatbuffer_bytes: bytes | str | Path) -> dict[str, int]:
    """`op_histogram` of the main subgraph with two spellings of one computation counted as
    one kind, as docs/BENCHMARKS.md "Op parity" compares flatbuffers:

    - a global average pool is `GLOBAL_AVERAGE_POOL`, whether written as MEAN or as an
      AVERAGE_POOL_2D whose output is 1x1 (LCE's `convert_keras_model` writes Keras' global
      pool as the one, bnnexport's translator ONNX's GlobalAveragePool as the other);
    - LCE's max-pool on packed bits, `LceBMaxPool2d`, is a MAX_POOL_2D: LCE writes it for a
      max-pool between a bconv and the next binarization, where it replaces the float
      MAX_POOL_2D (and the BatchNorm and LceQuantize around it).

    >>> kinds_beyond({"ADD": 3, "MEAN": 1}, {"ADD": 2, "MUL": 4})
    {'ADD': (3, 2), 'MEAN': (1, 0)}
    """
    counts: Counter[str] = Counter()
    for op in flatbuffer_ops(flatbuffer_bytes):
        pooled = op.output_shapes[0] if op.output_shapes else []
        whole_map = len(pooled) == 4 and pooled[1:3] == [1, 1]
        if op.op_type in ("MEAN", "AVERAGE_POOL_2D") and whole_map:
            counts[GLOBAL_AVERAGE_POOL] += 1
        elif op.op_type == "LceBMaxPool2d":
            counts["MAX_POOL_2D"] += 1
        else:
            counts[op.op_type] += 1
    return dict(sorted(counts.items()))


def kinds_beyond(kinds: dict[str, int], reference: dict[str, int]) -> dict[str, tuple[int, int]]:
    """{op kind: (its count in `kinds`, in `reference`)} for every kind `kinds` has more often."""
    return {
        k: (n, reference.get(k, 0)) for k, n in sorted(kinds.items()) if n > reference.get(k, 0)
    }


def _string(buf: bytes, at: int) -> str:
    start = _deref(buf, at)
    length = struct.unpack_from("<I", buf, start)[0]
    return buf[start + 4 : start + 4 + length].decode()


def signature_outputs(flatbuffer_bytes: bytes | str | Path) -> list[str]:
    """The serving signature's output names, in the order the interpreter returns outputs.

    The converter orders a flatbuffer's outputs its own way (not by name); the signature maps
    each name to a tensor, and the main subgraph lists its output tensors in output order.
    """
    buf = read_flatbuffer(flatbuffer_bytes)
    try:
        model = _table(buf, _deref(buf, 0))
        subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
        at = _deref(buf, _field(buf, subgraph, 2))
        order = struct.unpack_from(f"<{struct.unpack_from('<I', buf, at)[0]}i", buf, at + 4)
        signature = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 7))[0]))
        names = {}
        for entry in _vector(buf, _field(buf, signature, 1)):
            tensor_map = _table(buf, _deref(buf, entry))
            index = _field(buf, tensor_map, 1)
            names[struct.unpack_from("<I", buf, index)[0] if index else 0] = _string(
                buf, _field(buf, tensor_map, 0)
            )
        return [names[k] for k in order]
    except (struct.error, IndexError, KeyError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"flatbuffer without a readable signature ({error})") from None


NUMPY_TYPES = {"FLOAT32": "<f4", "INT32": "<i4", "INT8": "i1", "UINT8": "u1", "INT64": "<i8"}


def constant_tensors(flatbuffer_bytes: bytes | str | Path, tensor_type: str) -> list[np.ndarray]:
    """The constant tensors of the main subgraph whose element type is `tensor_type` (a
    `TENSOR_TYPES` name in `NUMPY_TYPES`), with their shapes: those whose buffer holds data."""
    buf = read_flatbuffer(flatbuffer_bytes)
    wanted = next(k for k, v in TENSOR_TYPES.items() if v == tensor_type)
    try:
        model = _table(buf, _deref(buf, 0))
        buffers = [_table(buf, _deref(buf, at)) for at in _vector(buf, _field(buf, model, 4))]
        subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
        found = []
        for at in _vector(buf, _field(buf, subgraph, 0)):
            tensor = _table(buf, _deref(buf, at))
            kind, index = _field(buf, tensor, 1), _field(buf, tensor, 2)
            if (struct.unpack_from("<b", buf, kind)[0] if kind else 0) != wanted or not index:
                continue
            data = _field(buf, buffers[struct.unpack_from("<I", buf, index)[0]], 0)
            if data is None:
                continue  # an activation: no data of its own
            start = _deref(buf, data)
            size = struct.unpack_from("<I", buf, start)[0]
            dtype = np.dtype(NUMPY_TYPES[tensor_type])
            values = np.frombuffer(buf, dtype, size // dtype.itemsize, offset=start + 4)
            shape = _int_vector(buf, _field(buf, tensor, 0))
            found.append(values.reshape(shape).copy())
    except (struct.error, IndexError, ValueError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return found


def output_step(flatbuffer_bytes: bytes | str | Path) -> float | None:
    """What one int8 step of the first output is worth: the scale of the int8 tensor a final
    DEQUANTIZE makes it from (an int8 flatbuffer's float output); None for a float output.

    Example:
        >>> output_step("model-arm64-int8.tflite")                      # doctest: +SKIP
        0.0421872921288
    """
    buf = read_flatbuffer(flatbuffer_bytes)
    ops = flatbuffer_ops(buf)
    try:
        model = _table(buf, _deref(buf, 0))
        subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
        tensors = [_table(buf, _deref(buf, at)) for at in _vector(buf, _field(buf, subgraph, 0))]
        output = _int_vector(buf, _field(buf, subgraph, 2))[0]
        producer = next(op for op in ops if op.outputs and op.outputs[0] == _tensor_name(
            buf, tensors[output]))  # fmt: skip
        if producer.op_type != "DEQUANTIZE" or producer.input_types[0] != "INT8":
            return None
        names = [_tensor_name(buf, t) for t in tensors]
        quantization = _field(buf, tensors[names.index(producer.inputs[0])], 4)
        scales = _field(buf, _table(buf, _deref(buf, quantization)), 2) if quantization else None
        if scales is None:
            return None
        start = _deref(buf, scales)
        return float(struct.unpack_from("<f", buf, start + 4)[0])
    except (struct.error, IndexError, StopIteration, ValueError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None


def input_shapes(flatbuffer_bytes: bytes | str | Path) -> list[list[int]]:
    """The shape of each input of the main subgraph, in input order (as the interpreter takes
    them: NHWC for a flatbuffer whose `input_layout` is "nhwc")."""
    buf = read_flatbuffer(flatbuffer_bytes)
    try:
        model = _table(buf, _deref(buf, 0))
        subgraph = _table(buf, _deref(buf, _vector(buf, _field(buf, model, 2))[0]))
        tensors = _vector(buf, _field(buf, subgraph, 0))
        return [
            list(_int_vector(buf, _field(buf, _table(buf, _deref(buf, tensors[k])), 0)))
            for k in _int_vector(buf, _field(buf, subgraph, 1))
        ]
    except (struct.error, IndexError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None


def _tensor_name(buf: bytes, tensor: tuple[int, list[int]]) -> str:
    at = _field(buf, tensor, 3)
    return _string(buf, at) if at is not None else ""


def metadata(flatbuffer_bytes: bytes | str | Path) -> dict[str, bytes]:
    """The flatbuffer's metadata: each entry's name and the bytes of its buffer (TFLite's own,
    such as `min_runtime_version`, and any `with_metadata` added)."""
    buf = read_flatbuffer(flatbuffer_bytes)
    try:
        model = _table(buf, _deref(buf, 0))
        buffers = [_table(buf, _deref(buf, at)) for at in _vector(buf, _field(buf, model, 4))]
        entries = _field(buf, model, 6)
        found = {}
        for at in _vector(buf, entries) if entries else []:
            entry = _table(buf, _deref(buf, at))
            index = _field(buf, entry, 1)
            data = _field(buf, buffers[struct.unpack_from("<I", buf, index)[0] if index else 0], 0)
            start = _deref(buf, data) if data is not None else None
            size = struct.unpack_from("<I", buf, start)[0] if start is not None else 0
            found[_string(buf, _field(buf, entry, 0))] = (
                buf[start + 4 : start + 4 + size] if size else b""
            )
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return found


def with_metadata(flatbuffer_bytes: bytes, entries: dict[str, bytes]) -> bytes:
    """The flatbuffer with `entries` added to its metadata (an entry of the same name
    replaced), written anew through TF's generated schema; nothing else changes (the caller
    checks the interpreter computes the same: `converters.lce`)."""
    import flatbuffers

    schema = _schema()
    if schema is None:
        raise InvalidModelError("writing flatbuffer metadata needs TensorFlow's TFLite schema")
    model = schema.ModelT.InitFromPackedBuf(read_flatbuffer(flatbuffer_bytes), 0)
    model.metadata = [m for m in model.metadata or [] if _text(m.name) not in entries]
    model.buffers = model.buffers or []
    for name, value in entries.items():
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(value, np.uint8)
        model.buffers.append(buffer)
        entry = schema.MetadataT()
        entry.name, entry.buffer = name, len(model.buffers) - 1
        model.metadata.append(entry)
    builder = flatbuffers.Builder(len(flatbuffer_bytes) + sum(map(len, entries.values())) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# the metadata entry saying how the flatbuffer takes its image input, and what it may say:
# "nhwc" (channels last: TFLite's convention, what a device app feeds) or "nchw" (PyTorch's and
# ONNX's layout, the samples' own); docs/LCE_NOTES.md "Input layout"
LAYOUT_ENTRY = "input_layout"


def layout_metadata(layout: str | None) -> dict[str, bytes]:
    """The metadata entry declaring `layout` ({} for None: a model with no image input).

    Example:
        >>> layout_metadata("nhwc"), layout_metadata(None)
        ({'input_layout': b'nhwc'}, {})
    """
    if layout is None:
        return {}
    if layout not in INPUT_LAYOUTS:
        raise ValueError(f"input layout must be one of {', '.join(INPUT_LAYOUTS)}, got {layout!r}")
    return {LAYOUT_ENTRY: layout.encode()}


def input_layout(flatbuffer_bytes: bytes | str | Path) -> str | None:
    """The input layout the flatbuffer's metadata declares ("nhwc" or "nchw"); None when it
    declares none (another tool's flatbuffer, a model with no image input, or one bnnexport
    wrote before it declared a layout: those took NCHW), and it is then fed as it is."""
    declared = metadata(flatbuffer_bytes).get(LAYOUT_ENTRY)
    if declared is None:
        return None
    layout = declared.decode(errors="replace")
    if layout not in INPUT_LAYOUTS:
        raise InvalidModelError(f"the flatbuffer declares an unknown input layout {layout!r}")
    return layout


def to_input_layout(inputs: np.ndarray, layout: str | None) -> np.ndarray:
    """A batch of NCHW samples (bnnexport's, as PyTorch and ONNX take them) as a flatbuffer of
    input layout `layout` takes it: transposed to NHWC for "nhwc", as it is otherwise; float32
    and C-contiguous either way.

    Example:
        >>> to_input_layout(np.zeros((2, 3, 4, 5)), "nhwc").shape
        (2, 4, 5, 3)
    """
    inputs = np.asarray(inputs, np.float32)
    if layout == "nhwc":
        if inputs.ndim != 4:
            raise InputShapeError(
                f"an NHWC flatbuffer takes images (N, C, H, W here), not inputs of shape "
                f"{tuple(inputs.shape)}"
            )
        inputs = inputs.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(inputs)


def nchw_shape(shape: list[int], layout: str | None) -> list[int]:
    """The NCHW shape of the batches `to_input_layout` turns into a flatbuffer input of
    `shape` and `layout` (`shape` itself unless "nhwc").

    Example:
        >>> nchw_shape([1, 28, 28, 1], "nhwc"), nchw_shape([1, 10], None)
        ([1, 1, 28, 28], [1, 10])
    """
    shape = [int(d) for d in shape]
    if layout == "nhwc" and len(shape) == 4:
        return [shape[0], shape[3], shape[1], shape[2]]
    return shape
