"""Where bnnexport opens its runtimes: TensorFlow, ONNX Runtime, TFLite and LCE's interpreter.

Every session and interpreter in `converters`, `bnnexport` and `benchmarks` comes from here, so
the conversion gate, `bench`'s scoring and `bench`'s timing run the same runtime with the same
settings. One way per runtime runs a model: `open_model(kind, model, threads)` gives a
`RuntimeModel` whose `run(inputs)` takes any batch (NCHW float32, the ONNX model's own layout,
chunked to the batch the model takes; put in the input layout a flatbuffer declares, NHWC by
default, by `feed`) and whose `run_one(x1)` is the one bare call a benchmark times, on a batch
`feed` gave; `run_onnx`, `run_lce` and `run_tflite` are `run` on a file, its bytes or an open
session.

- `open_model`: a `RuntimeModel` in one of `RUNTIMES`: "onnxruntime" (`OrtModel`), "tflite"
  (`TfliteModel`, the stock interpreter, for the float model) or "lce" (`LceModel`);
- `tf`: TensorFlow, imported on first use with its start-up noise discarded;
- `stderr_filtered`: file descriptor 2 captured around a runtime's creation, every line but
  the known harmless ones (`HARMLESS_LINES`) written back;
- `ort_session`: an ONNX Runtime CPU session (intra-op threads as asked, one inter-op thread,
  ORT's kernel-scaling fusions off, see `SCALING_FUSIONS`);
- `tflite_interpreter`: the stock TFLite interpreter, its XNNPACK line filtered;
- `lce_interpreter`: LCE's interpreter with indirect BGEMM (docs/LCE_NOTES.md "Running
  flatbuffers") or LCE's default kernels, and `lce_batch_predict` to run it on whole batches;
- `lce_kernel_settings`: what LCE's interpreter must be told to run a flatbuffer (nothing, or
  indirect BGEMM for a grouped `LceBconv2d`, which LCE's default kernel refuses);
- `check_input_shape`: a batch refused in one line unless it fits the model's input.

A flatbuffer's bytes (`read_flatbuffer`) and the input layout it declares (`input_layout`,
`to_input_layout`) are `converters.flatbuffer`'s.

A file that a runtime cannot load raises `InvalidModelError` (one line), never a traceback.
TensorFlow, LCE and ONNX Runtime are imported inside the functions that need them. Comparing
outputs is the gate's (`converters.gate`).

Example:
    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Sign", ["x"], ["y"])], "sign",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    >>> session = ort_session(model.SerializeToString(), threads=1)
    >>> session.run(None, {"x": np.array([[-2.0, 0.0, 3.0]], np.float32)})[0]
    array([[-1.,  0.,  1.]], dtype=float32)
    >>> session.get_session_options().intra_op_num_threads
    1
    >>> sign = open_model("onnxruntime", model.SerializeToString())
    >>> sign.run(np.array([[-2.0, 0.0, 3.0], [1.0, -1.0, 0.5]], np.float32))  # batch 1 each
    array([[-1.,  0.,  1.],
           [ 1., -1.,  1.]], dtype=float32)
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from bnnexport.converters.errors import InputShapeError, InvalidModelError
from bnnexport.converters.flatbuffer import (
    input_layout,
    nchw_shape,
    read_flatbuffer,
    to_input_layout,
)

if TYPE_CHECKING:
    import onnx
    import onnxruntime
    from larq_compute_engine.tflite.python.interpreter import Interpreter as LceInterpreter
    from tensorflow.lite import Interpreter as TfliteInterpreter

# ORT fusions that fold a constant scale into a kernel: on a ±1 kernel the rounding of the
# scaled sums turns a binary conv's exact zeros into tiny signed values, and sign(0) = +1 flips
SCALING_FUSIONS = ["ConvBNFusion", "ConvMulFusion", "MatmulBNFusion", "MatMulScaleFusion"]

# what TFLite's C++ runtime prints on fd 2, past Python and TF_CPP_MIN_LOG_LEVEL, the first
# time an interpreter of the process allocates its tensors; it reports nothing wrong
# (docs/LCE_NOTES.md "Runtime log lines")
HARMLESS_LINES = frozenset({"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."})


@contextlib.contextmanager
def fd_filtered(fd: int, drop: Callable[[str], bool]) -> Iterator[None]:
    """File descriptor `fd` (1 or 2) into a temporary file while the block runs (C++ code
    writes there directly, not through `sys.stdout`/`sys.stderr`); afterwards every captured
    line for which `drop` is false is written back to `fd`, also when the block raises, so no
    real error is hidden.

    Example:
        >>> with fd_filtered(2, lambda line: line in HARMLESS_LINES):
        ...     _ = os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.")
    """
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines = sink.read().splitlines(keepends=True)
            kept = [ln for ln in lines if not drop(ln.decode(errors="replace").rstrip("\r\n"))]
            if kept:
                with os.fdopen(os.dup(fd), "wb") as out:
                    out.write(b"".join(kept))


def stderr_filtered(drop: Callable[[str], bool]) -> contextlib.AbstractContextManager[None]:
    """`fd_filtered` on file descriptor 2."""
    return fd_filtered(2, drop)


def _harmless(line: str) -> bool:
    return line in HARMLESS_LINES


def tf() -> ModuleType:
    """The tensorflow module, imported on first use (training only for its TensorBoard writer).

    Call it before importing larq_compute_engine: TF's native libraries print start-up log lines
    straight to file descriptor 2 (TF_CPP_MIN_LOG_LEVEL no longer silences them), which would
    break the CLI's promise of one line per error. They are discarded during the first import.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with stderr_filtered(lambda line: True):
        import tensorflow
    return tensorflow


def has_quantize_nodes(model: str | Path | bytes) -> bool:
    """Whether an ONNX file or serialized model holds a QuantizeLinear node (its op type is
    written verbatim in the protobuf; a tensor merely named so only costs ORT's int8 fusions).

    Example:
        >>> has_quantize_nodes(b"...QuantizeLinear..."), has_quantize_nodes(b"...Conv...")
        (True, False)
    """
    try:
        payload = model if isinstance(model, bytes) else Path(model).read_bytes()
    except OSError:  # ONNX Runtime says what is wrong with the path
        return False
    return b"QuantizeLinear" in payload


def ort_session(
    model: str | Path | bytes, threads: int = 0, *, optimize: bool = True
) -> onnxruntime.InferenceSession:
    """An ONNX Runtime CPU session for an ONNX file or serialized model.

    Args:
        model: a path, or a serialized `ModelProto` (a graph built or rewired in memory).
        threads: intra-op threads; 0 lets ONNX Runtime choose (one per physical core).
        optimize: False turns every graph optimization off (evaluating single nodes exactly as
            written, as the normaliser's constant folding does).

    ORT's kernel-scaling fusions are always off (`SCALING_FUSIONS`), so ONNX Runtime computes
    the binary layers exactly as PyTorch does; a quantized (QDQ) model runs with the basic
    optimizations only, as its Q/DQ nodes say, never ORT's fused int8 kernels (which saturate
    on a CPU without VNNI). InvalidModelError when it cannot load the model.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # warnings (unused initializers, shape merges) would go straight to stderr, beside the CLI's
    # one-line errors; errors still raise
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif has_quantize_nodes(model):
        # the QDQ model's own arithmetic, not ORT's fused int8 kernels: on a CPU without VNNI
        # they saturate (docs/LCE_NOTES.md "ONNX Runtime's int8 kernels")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    label = "(in memory)" if isinstance(model, bytes) else model
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else str(model), sess_options=options,
            providers=["CPUExecutionProvider"], disabled_optimizers=SCALING_FUSIONS,
        )  # fmt: skip
    except Exception as error:
        raise InvalidModelError(f"ONNX Runtime cannot load {label}: {error}") from None


def probe_session(
    model: onnx.ModelProto, tensors: Sequence[str]
) -> tuple[onnxruntime.InferenceSession, int]:
    """An ONNX Runtime session of a copy of `model` whose outputs include `tensors` (values
    inside the graph: a calibration's ranges, the gate's binarization inputs), and the batch
    the model's input was fixed to (1 when it is free)."""
    import onnx

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in known:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = ort_session(probe.SerializeToString())
    first = session.get_inputs()[0].shape[0]
    return session, first if isinstance(first, int) and first > 0 else 1


def tflite_interpreter(flatbuffer: str | Path | bytes, threads: int = 1) -> TfliteInterpreter:
    """The stock TFLite interpreter for a float flatbuffer, tensors allocated."""
    data = read_flatbuffer(flatbuffer)
    # "tf.lite.Interpreter is deprecated": still the stock one; and its INFO line on fd 2
    with warnings.catch_warnings(), stderr_filtered(_harmless):
        warnings.simplefilter("ignore")
        try:
            interpreter = tf().lite.Interpreter(model_content=data, num_threads=threads)
            interpreter.allocate_tensors()
        except Exception as error:
            raise InvalidModelError(f"TFLite cannot load the flatbuffer: {error}") from None
    return interpreter


def lce_interpreter(
    flatbuffer: str | Path | bytes, threads: int = 1, *, default_kernels: bool = False
) -> LceInterpreter:
    """LCE's Python interpreter for a flatbuffer (indirect BGEMM, the fast x86 kernels,
    docs/LCE_NOTES.md "Running flatbuffers"). Its `predict(x)` runs `x` one sample at a time; for a
    flatbuffer converted at batch N, or to time one call without `predict`'s per-sample loop, use
    `lce_batch_predict`. With `default_kernels`, LCE's own defaults, as `Interpreter(buf)`, an
    app's default op resolver and `lce_benchmark_model` without flags run it (their bconv kernel
    refuses a grouped `LceBconv2d`: `lce_kernel_settings`)."""
    tf()  # first, so TensorFlow's start-up log lines are discarded
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    data = read_flatbuffer(flatbuffer)
    kernels = {} if default_kernels else INDIRECT_BGEMM
    try:
        return Interpreter(data, num_threads=threads, **kernels)
    except Exception as error:
        raise InvalidModelError(f"LCE cannot load the flatbuffer: {error}") from None


# the interpreter setting that runs every LceBconv2d LCE 0.16 writes, grouped ones included
INDIRECT_BGEMM = {"use_indirect_bgemm": True}


@dataclass(frozen=True)
class KernelSettings:
    """The LCE interpreter settings a flatbuffer needs besides LCE's defaults (`flags`: empty
    when the defaults run it) and, when the defaults refuse it, what their kernels said."""

    flags: dict[str, bool]
    refusal: str = ""


def lce_kernel_settings(flatbuffer: str | Path | bytes) -> KernelSettings:
    """What LCE's interpreter must be told to run `flatbuffer`: nothing when it prepares with
    LCE's default kernels; `use_indirect_bgemm=True` when only that does (a grouped
    `LceBconv2d`: docs/LCE_NOTES.md "Grouped convolutions"). InvalidModelError when neither
    runs it. The default kernels' error lines are kept for `refusal`, not printed."""
    data = read_flatbuffer(flatbuffer)
    said: list[str] = []

    def captured(line: str) -> bool:
        said.append(line)
        return True  # not written back: the CLI's errors stay one line

    try:
        with stderr_filtered(captured):
            lce_interpreter(data, default_kernels=True)
        return KernelSettings({})
    except InvalidModelError:
        errors = [line.removeprefix("ERROR: ") for line in said if line.startswith("ERROR: ")]
    lce_interpreter(data)  # raises when indirect BGEMM cannot run it either
    return KernelSettings(dict(INDIRECT_BGEMM), "; ".join(errors) or "it failed to prepare")


def lce_batch_predict(
    interpreter: LceInterpreter,
) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """A function that runs `interpreter` once: one whole batch per input, one array per output.

    LCE's `Interpreter.predict` feeds one sample at a time, so it cannot run a batch-N
    flatbuffer and adds a Python loop to every timed call; the object it wraps (its
    undocumented `interpreter` attribute) takes whole batches (docs/LCE_NOTES.md "Running
    flatbuffers"). This is the one place bnnexport reaches into it.
    """
    return interpreter.interpreter.predict


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


class RuntimeModel(ABC):
    """A model opened in one runtime (`open_model`), run on NCHW float32 batches.

    `run(inputs)`: the first output for any number of samples, after `check_input_shape`,
    given the model's input layout (`feed`), in chunks of the batch the model takes (the last
    one padded). `feed(inputs)`: a batch of NCHW samples as the model itself takes it, NHWC for
    a flatbuffer that declares so (`converters.flatbuffer.to_input_layout`), as it is
    otherwise. `run_one(x)`: one bare call on `x`, a batch `feed` gave of the batch the model
    takes (bench's batch-1 sample), nothing checked or copied: the call a benchmark times.
    `input_shape` is the shape of the NCHW batches `run` takes (the runtime's own first input
    shape, in NCHW); `input_layout` what the flatbuffer declares (None: fed as it is)."""

    kind: ClassVar[str]

    def __init__(
        self, input_shape: Sequence[Any], label: str, input_layout: str | None = None
    ) -> None:
        self.input_layout = input_layout
        shape = list(input_shape)
        self.input_shape = nchw_shape(shape, input_layout) if input_layout else shape
        self.label = label if input_layout != "nhwc" else f"{label} (NHWC input, fed NCHW)"

    @property
    def batch(self) -> int | None:
        """The batch the model takes; None when it takes any."""
        first = self.input_shape[0]
        return int(first) if isinstance(first, (int, np.integer)) and first > 0 else None

    def feed(self, inputs: np.ndarray) -> np.ndarray:
        """NCHW samples as the model takes them (float32, C-contiguous)."""
        return to_input_layout(inputs, self.input_layout)

    def run(self, inputs: np.ndarray) -> np.ndarray:
        """The first output on `inputs`, chunked to the model's batch."""
        check_input_shape(self.input_shape, np.asarray(inputs), self.label)
        return _batched(self.run_one, self.feed(inputs), self.batch)

    @abstractmethod
    def run_one(self, x: np.ndarray) -> np.ndarray:
        """The first output of one call on `x`, which must be of the model's batch."""


class OrtModel(RuntimeModel):
    """A model in ONNX Runtime (`ort_session`): the reference a converted model must match."""

    kind = "onnxruntime"

    def __init__(self, session: onnxruntime.InferenceSession, label: str = "(in memory)") -> None:
        self.session = session
        first = session.get_inputs()[0]
        self.input_name = first.name
        super().__init__(first.shape, f"ONNX model {label}")

    def run_one(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]


class TfliteModel(RuntimeModel):
    """A float flatbuffer in the stock TFLite interpreter (`tflite_interpreter`)."""

    kind = "tflite"

    def __init__(self, interpreter: TfliteInterpreter, input_layout: str | None = None) -> None:
        self.interpreter = interpreter
        source = interpreter.get_input_details()[0]
        self.input_index = source["index"]
        self.output_index = interpreter.get_output_details()[0]["index"]
        shape = [int(d) for d in source["shape"]]
        super().__init__(shape, "the TFLite flatbuffer", input_layout)

    def run_one(self, x: np.ndarray) -> np.ndarray:
        self.interpreter.set_tensor(self.input_index, x)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output_index)  # a copy (`tensor()` is the view)


class LceModel(RuntimeModel):
    """An LCE flatbuffer in LCE's interpreter (`lce_interpreter`: indirect BGEMM), with the
    input layout its metadata declares (`open_model` reads it; None: fed as it is)."""

    kind = "lce"

    def __init__(self, interpreter: LceInterpreter, input_layout: str | None = None) -> None:
        self.interpreter = interpreter
        self.predict = lce_batch_predict(interpreter)  # one call, without predict()'s loop
        # a flatbuffer converted with int8 input and output (`convert --io int8`) takes and
        # gives int8: `run` and `run_one` quantize float inputs and dequantize outputs with
        # its own scales and zero points (docs/LCE_NOTES.md "int8 around binary layers")
        self.int8_io = np.dtype(interpreter.input_types[0]) == np.int8
        shape = list(interpreter.input_shapes[0])
        super().__init__(shape, "the LCE flatbuffer", input_layout)

    def run(self, inputs: np.ndarray) -> np.ndarray:
        check_input_shape(self.input_shape, np.asarray(inputs), self.label)
        if self.batch == 1 and not self.int8_io:  # LCE's predict: a sample at a time
            return np.asarray(self.interpreter.predict(self.feed(inputs)))
        return _batched(self.run_one, self.feed(inputs), self.batch)

    def run_one(self, x: np.ndarray) -> np.ndarray:
        if not self.int8_io:
            return self.predict([x])[0]
        scale, zero = self.interpreter.input_scales[0], self.interpreter.input_zero_points[0]
        q = np.clip(np.rint(np.asarray(x, np.float64) / scale) + zero, -128, 127)
        y = self.predict([q.astype(np.int8)])[0]
        scale, zero = self.interpreter.output_scales[0], self.interpreter.output_zero_points[0]
        return ((y.astype(np.float32) - np.float32(zero)) * np.float32(scale)).astype(np.float32)


RUNTIMES = ("onnxruntime", "tflite", "lce")


def open_model(
    kind: str, model: str | Path | bytes, threads: int = 1, *, optimize: bool = True
) -> RuntimeModel:
    """`model` (a file or its bytes) opened in the runtime `kind`, one of `RUNTIMES`, with
    `threads` threads (for ONNX Runtime, 0 lets it choose; `optimize` is its `ort_session`
    switch); a flatbuffer with the input layout its metadata declares. InvalidModelError when
    the runtime cannot load it."""
    if kind == "onnxruntime":
        label = str(model) if isinstance(model, (str, Path)) else "(in memory)"
        return OrtModel(ort_session(model, threads, optimize=optimize), label)
    if kind == "tflite":
        return TfliteModel(tflite_interpreter(model, threads), input_layout(model))
    if kind == "lce":
        return LceModel(lce_interpreter(model, threads), input_layout(model))
    raise ValueError(f"unknown runtime {kind!r}; choose one of {', '.join(RUNTIMES)}")


def _opened(model: object) -> bool:
    """Whether `model` is an open session or interpreter rather than a file or bytes."""
    return not isinstance(model, (str, Path, bytes))


def run_onnx(
    model: str | Path | bytes | onnxruntime.InferenceSession,
    inputs: np.ndarray,
    optimize: bool = True,
    threads: int = 0,
) -> np.ndarray:
    """Outputs of ONNX Runtime (CPU) for an NCHW float32 batch: `open_model("onnxruntime")`'s
    `run`, or `OrtModel`'s on a session opened here. ORT's kernel-scaling fusions are always
    off, so ONNX Runtime computes the binary layers exactly as PyTorch does."""
    if _opened(model):
        return OrtModel(model).run(inputs)
    return open_model("onnxruntime", model, threads, optimize=optimize).run(inputs)


def run_lce(
    flatbuffer: str | Path | bytes | LceInterpreter, inputs: np.ndarray, num_threads: int = 1
) -> np.ndarray:
    """Outputs of LCE's interpreter (indirect BGEMM, the fast x86 kernels) for an NCHW batch:
    `open_model("lce")`'s `run` (in the input layout the flatbuffer declares), or `LceModel`'s
    on an interpreter opened here (fed as it is: an interpreter does not keep the metadata)."""
    if _opened(flatbuffer):
        return LceModel(flatbuffer).run(inputs)
    return open_model("lce", flatbuffer, num_threads).run(inputs)


def run_tflite(
    flatbuffer: str | Path | bytes | TfliteInterpreter, inputs: np.ndarray, num_threads: int = 1
) -> np.ndarray:
    """Outputs of the stock TFLite interpreter (float model) for an NCHW batch:
    `open_model("tflite")`'s `run` (in the input layout the flatbuffer declares), or
    `TfliteModel`'s on an interpreter opened here (fed as it is)."""
    if _opened(flatbuffer):
        return TfliteModel(flatbuffer).run(inputs)
    return open_model("tflite", flatbuffer, num_threads).run(inputs)
