"""Run a model in each of the three runtimes on a batch of inputs.

- `run_onnx`: ONNX Runtime (the reference the converted model must match);
- `run_lce`: Larq Compute Engine's interpreter, with its fastest x86 setting (docs/LCE_NOTES.md
  "Running flatbuffers");
- `run_tflite`: the stock TFLite interpreter, for the float model.

Each takes a model file, its bytes, or a session/interpreter opened by `converters.runtimes`,
and takes and returns NCHW float32 batches, the ONNX model's own layout. Comparing the outputs
is the gate's (`converters.gate`).

Example:
    >>> x = np.random.default_rng(0).normal(size=(8, 1, 28, 28)).astype(np.float32)
    >>> ref = run_onnx("model.onnx", x)                                 # doctest: +SKIP
    >>> run_lce("model-arm64.tflite", x).shape == ref.shape            # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from converters.errors import InputShapeError
from converters.runtimes import (
    lce_batch_predict,
    lce_interpreter,
    ort_session,
    tflite_interpreter,
)

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
