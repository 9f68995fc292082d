"""Run the three runtimes on the same inputs and compare them: the converter's fidelity gate.

- `run_onnx`: ONNX Runtime (the reference the converted model must match);
- `run_lce`: Larq Compute Engine's interpreter, with its fastest x86 setting (docs/LCE_NOTES.md
"Running flatbuffers");
- `run_tflite`: the stock TFLite interpreter, for the float model;
  (each takes a model file, its bytes, or a session/interpreter opened by `converters.runtimes`)
- `op_histogram`: which ops a flatbuffer holds (LCE's custom ops by name, e.g. LceBconv2d);
- `validate_outputs`: argmax agreement and max |diff| relative to the logit range, raising
  `ConversionMismatchError` with the worst difference when they fall short.

All take and return NCHW float32 batches, the ONNX model's own layout.

Example:
    >>> x = np.random.default_rng(0).normal(size=(8, 1, 28, 28)).astype(np.float32)
    >>> ref = run_onnx("model.onnx", x)                                 # doctest: +SKIP
    >>> validate_outputs(ref, run_lce("model-arm64.tflite", x))         # doctest: +SKIP
    Agreement(max_abs_diff=3.8e-05, argmax_agreement=1.0, ...)
"""

from __future__ import annotations

import importlib.util
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from converters.errors import ConversionMismatchError, InputShapeError, InvalidModelError
from converters.runtimes import (
    lce_batch_predict,
    lce_interpreter,
    ort_session,
    read_flatbuffer,
    tflite_interpreter,
)

# The one tolerance: max |diff| as a fraction of the reference's logit range (at least 1), for
# every comparison of a converted model with its reference (converters.gate uses it too).
RTOL = 1e-4

if TYPE_CHECKING:
    import onnxruntime
    from larq_compute_engine.tflite.python.interpreter import Interpreter as LceInterpreter
    from tensorflow.lite import Interpreter as TfliteInterpreter


def check_input_shape(expected: Sequence[Any], inputs: np.ndarray, model: str) -> None:
    """InputShapeError unless `inputs` (a batch) fits the model's input shape (batch free)."""
    fixed = [d if isinstance(d, (int, np.integer)) and d > 0 else None for d in expected[1:]]
    if inputs.ndim != len(expected) or any(
        d is not None and d != actual for d, actual in zip(fixed, inputs.shape[1:], strict=True)
    ):
        want = ", ".join("N" if d is None else str(d) for d in ["N", *fixed][1:])
        raise InputShapeError(
            f"inputs of shape {tuple(inputs.shape)} do not fit {model}, which takes (N, {want})"
        )


def _batched(run: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, batch: int | None):
    """Run `run` over `inputs` in chunks of the model's fixed batch size (last one padded)."""
    inputs = np.ascontiguousarray(inputs, dtype=np.float32)
    if batch is None or batch <= 0:
        return run(inputs)
    outputs = []
    for start in range(0, len(inputs), batch):
        chunk = inputs[start : start + batch]
        real = len(chunk)
        if real < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - real, axis=0)])
        outputs.append(np.asarray(run(chunk))[:real])
    return np.concatenate(outputs)


def _opened(model: object) -> bool:
    """Whether `model` is an open session or interpreter rather than a file or bytes."""
    return not isinstance(model, (str, Path, bytes))


def run_onnx(
    model: str | Path | bytes | onnxruntime.InferenceSession,
    inputs: np.ndarray,
    optimize: bool = True,
    threads: int = 0,
) -> np.ndarray:
    """Outputs of ONNX Runtime (CPU) for an NCHW float32 batch.

    `model` is a path, a serialized model (opened with `converters.runtimes.ort_session`, with
    `optimize` and `threads`) or a session opened there. ORT's kernel-scaling fusions are always
    off, so ONNX Runtime computes the binary layers exactly as PyTorch does.
    """
    session = model if _opened(model) else ort_session(model, threads, optimize=optimize)
    label = model if isinstance(model, (str, Path)) else "(in memory)"
    first = session.get_inputs()[0]
    check_input_shape(first.shape, np.asarray(inputs), f"ONNX model {label}")
    batch = first.shape[0] if isinstance(first.shape[0], int) else None
    return _batched(lambda x: session.run(None, {first.name: x})[0], inputs, batch)


def run_lce(
    flatbuffer: str | Path | bytes | LceInterpreter, inputs: np.ndarray, num_threads: int = 1
) -> np.ndarray:
    """Outputs of LCE's interpreter (indirect BGEMM, the fast x86 kernels) for an NCHW batch.

    `flatbuffer` is a path, its bytes, or an interpreter from `converters.runtimes`."""
    interpreter = flatbuffer if _opened(flatbuffer) else lce_interpreter(flatbuffer, num_threads)
    check_input_shape(list(interpreter.input_shapes[0]), np.asarray(inputs), "the LCE flatbuffer")
    batch = interpreter.input_shapes[0][0]
    if batch == 1:
        return np.asarray(interpreter.predict(np.ascontiguousarray(inputs, dtype=np.float32)))
    predict = lce_batch_predict(interpreter)  # a batch-N flatbuffer takes whole batches
    return _batched(lambda x: predict([x])[0], inputs, batch)


def run_tflite(
    flatbuffer: str | Path | bytes | TfliteInterpreter, inputs: np.ndarray, num_threads: int = 1
) -> np.ndarray:
    """Outputs of the stock TFLite interpreter (float model) for an NCHW batch.

    `flatbuffer` is a path, its bytes, or an interpreter from `converters.runtimes`."""
    interpreter = flatbuffer if _opened(flatbuffer) else tflite_interpreter(flatbuffer, num_threads)
    source = interpreter.get_input_details()[0]
    check_input_shape(list(source["shape"]), np.asarray(inputs), "the TFLite flatbuffer")
    target = interpreter.get_output_details()[0]

    def run(x: np.ndarray) -> np.ndarray:
        interpreter.set_tensor(source["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(target["index"]).copy()

    return _batched(run, inputs, int(source["shape"][0]))


# --- a minimal flatbuffer reader: enough to list a TFLite model's operators ----------------


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


def _builtin_names() -> dict[int, str]:
    """BuiltinOperator names from TF's generated schema, loaded without importing TensorFlow."""
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
                ops = module.BuiltinOperator
                return {v: k for k, v in vars(ops).items() if isinstance(v, int)}
            except Exception:
                pass
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
                )  # fmt: skip
            )
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as error:
        raise InvalidModelError(f"truncated or corrupt flatbuffer ({error})") from None
    return ops


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


@dataclass
class Agreement:
    """How closely a candidate's outputs follow the reference's."""

    max_abs_diff: float
    argmax_agreement: float
    logit_range: float
    tolerance: float
    samples: int

    @property
    def passed(self) -> bool:
        """Every top class agrees and no output is further than the tolerance (NaN fails)."""
        return self.argmax_agreement >= 1.0 and self.max_abs_diff <= self.tolerance


def compare(reference: np.ndarray, candidate: np.ndarray, rtol: float = RTOL) -> Agreement:
    """Max |diff| and argmax agreement; tolerance = rtol x the reference's value range."""
    ref, out = (np.asarray(a, np.float64) for a in (reference, candidate))
    ref, out = (a.reshape(len(a), -1 if len(a) else 0) for a in (ref, out))  # 0 samples: 0 x 0
    if ref.shape != out.shape:
        raise ConversionMismatchError(f"output shapes differ: {ref.shape} vs {out.shape}")
    diff = np.abs(ref - out)
    worst = float(diff.max()) if diff.size else 0.0
    if not np.isfinite(out).all():
        worst = float("inf")
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    tolerance = rtol * max(span, 1.0)
    agreement = 1.0
    if ref.size:
        # the candidate's top class agrees when the reference scores it within the tolerance of
        # its own top class: a (near-)tie in the reference makes either choice right
        picked = ref[np.arange(len(ref)), out.argmax(axis=1)]
        agreement = float(np.mean(picked >= ref.max(axis=1) - tolerance))
    return Agreement(worst, agreement, span, tolerance, len(ref))


def validate_outputs(
    reference: np.ndarray, candidate: np.ndarray, rtol: float = RTOL, what: str = "converted model"
) -> Agreement:
    """`compare`, raising `ConversionMismatchError` when argmax agreement < 100 % or the worst
    |diff| exceeds the tolerance; the message names the worst sample and output."""
    result = compare(reference, candidate, rtol)
    if not result.passed:
        ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
        out = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
        sample, index = np.unravel_index(np.nanargmax(np.abs(ref - out)), ref.shape)
        raise ConversionMismatchError(
            f"{what} disagrees with the reference: argmax agreement "
            f"{result.argmax_agreement:.2%} on {result.samples} samples, max |diff| "
            f"{result.max_abs_diff:.3g} (tolerance {result.tolerance:.3g}; worst at sample "
            f"{sample}, output {index}: {ref[sample, index]:.6g} vs {out[sample, index]:.6g})"
        )
    return result
