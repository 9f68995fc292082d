"""Where bnnexport opens its runtimes: TensorFlow, ONNX Runtime, TFLite and LCE's interpreter.

Every session and interpreter in `converters`, `bnnexport` and `benchmarks` comes from here, so
the conversion gate, `bench`'s scoring and `bench`'s timing run the same runtime with the same
settings:

- `tf`: TensorFlow, imported on first use with its start-up noise discarded;
- `stderr_filtered`: file descriptor 2 captured around a runtime's creation, every line but
  the known harmless ones (`HARMLESS_LINES`) written back;
- `ort_session`: an ONNX Runtime CPU session (intra-op threads as asked, one inter-op thread,
  ORT's kernel-scaling fusions off, see `SCALING_FUSIONS`);
- `tflite_interpreter`: the stock TFLite interpreter, for the float model;
- `lce_interpreter`: LCE's interpreter with indirect BGEMM (docs/LCE_NOTES.md "Running
flatbuffers"), and
  `lce_batch_predict` to run it on whole batches;
- `read_flatbuffer`: a flatbuffer's bytes, refused unless it is one.

A file that a runtime cannot load raises `InvalidModelError` (one line), never a traceback.
TensorFlow, LCE and ONNX Runtime are imported inside the functions that need them.

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
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from converters.errors import InvalidModelError

if TYPE_CHECKING:
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
    """The tensorflow module, imported on first use (training never pays for it).

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
    the binary layers exactly as PyTorch does. InvalidModelError when it cannot load the model.
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
    label = "(in memory)" if isinstance(model, bytes) else model
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else str(model), sess_options=options,
            providers=["CPUExecutionProvider"], disabled_optimizers=SCALING_FUSIONS,
        )  # fmt: skip
    except Exception as error:
        raise InvalidModelError(f"ONNX Runtime cannot load {label}: {error}") from None


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


def lce_interpreter(flatbuffer: str | Path | bytes, threads: int = 1) -> LceInterpreter:
    """LCE's Python interpreter for a flatbuffer (indirect BGEMM, the fast x86 kernels,
    docs/LCE_NOTES.md "Running flatbuffers"). Its `predict(x)` runs `x` one sample at a time; for a
    flatbuffer converted at batch N, or to time one call without `predict`'s per-sample loop, use
    `lce_batch_predict`."""
    tf()  # first, so TensorFlow's start-up log lines are discarded
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    data = read_flatbuffer(flatbuffer)
    try:
        return Interpreter(data, num_threads=threads, use_indirect_bgemm=True)
    except Exception as error:
        raise InvalidModelError(f"LCE cannot load the flatbuffer: {error}") from None


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
