"""The one way to convert at batch N: a copy of the ONNX model at batch N, converted through the
whole gate.

Two callers need a flatbuffer at batch N: `convert --batch N` (a dynamic batch fixed at N) and the
batched copy for accuracy on a device (`convert --batched-copy N`: `lce_benchmark_model` runs a
flatbuffer at the batch it was converted with, and `--input_layer_shape` cannot re-batch a batch-1
model, docs/LCE_NOTES.md "aarch64 device"). `rebatch` fixes the ONNX input's batch dimension to N;
a graph that hard-codes batch 1 elsewhere (a Reshape to a constant [1, ...], an output fixed at 1)
is refused with one `HardCodedBatchError`, as is one whose outputs at batch N differ from those at
batch 1 on the same samples (checked with ONNX Runtime). `convert_batched` then converts the copy
through the same gate as a batch-1 file (`converters.lce.convert_onnx`).

Example:
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> graph = helper.make_graph(
    ...     [helper.make_node("Flatten", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])])
    >>> copy = rebatch(helper.make_model(graph), 8)
    >>> [d.dim_value for d in copy.graph.input[0].type.tensor_type.shape.dim]
    [8, 2, 3]
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from bnnexport.converters.errors import ConversionMismatchError, InvalidModelError

if TYPE_CHECKING:
    from bnnexport.converters.gate.checks import Reference
    from bnnexport.converters.lce import ConversionResult, ConvertOptions


class HardCodedBatchError(InvalidModelError):
    """The ONNX graph cannot run at another batch size: it hard-codes batch 1 (exit 2)."""


@dataclasses.dataclass
class BatchedResult:
    """The batched copy that was written and how its gate went (LCE vs ONNX Runtime, plain)."""

    output: str
    batch: int
    argmax_agreement: float  # the copy's LCE outputs vs ONNX Runtime's, before any tie replay
    max_abs_diff: float
    samples: int
    lce_bytes: int

    @classmethod
    def of(cls, result: ConversionResult) -> BatchedResult:
        """The summary of the copy's conversion (`convert_batched`'s result)."""
        gate = result.gate("ONNX Runtime") or result.gate("ONNX Runtime int8", "LCE int8")
        return cls(
            output=str(result.output),
            batch=result.batch,
            argmax_agreement=gate.plain_argmax_agreement,
            max_abs_diff=gate.plain_max_abs_diff,
            samples=result.samples,
            lce_bytes=result.lce_bytes,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def batched_path(flatbuffer: str | Path, batch: int) -> Path:
    """model-arm64.tflite -> model-arm64-bN.tflite."""
    flatbuffer = Path(flatbuffer)
    return flatbuffer.with_name(f"{flatbuffer.stem}-b{batch}{flatbuffer.suffix}")


def _constants(model: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def rebatch(model: Any, batch: int) -> Any:
    """A copy of `model` (onnx.ModelProto) whose input takes exactly `batch` samples.

    Raises HardCodedBatchError when a Reshape's constant target shape starts with 1 or when shape
    inference fixes an output's first dimension to another size than `batch`.
    """
    import onnx

    if batch < 1:
        raise ValueError("batch must be at least 1")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _batched_input(copy).type.tensor_type.shape.dim[0].dim_value = batch  # clears a dim_param
    if batch > 1:
        _refuse_batch_one_reshapes(copy, batch)
    del copy.graph.value_info[:]  # shapes inferred at batch 1 no longer hold
    for output in copy.graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
    _refuse_fixed_outputs(copy, batch)
    return copy


def _batched_input(model: Any) -> Any:
    """The model's one non-initializer input; InvalidModelError unless there is exactly one."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1 or not inputs[0].type.tensor_type.shape.dim:
        raise InvalidModelError("a batched copy needs a model with exactly one batched input")
    return inputs[0]


def _refuse_batch_one_reshapes(model: Any, batch: int) -> None:
    """HardCodedBatchError at the first Reshape whose constant target shape starts with 1."""
    constants = _constants(model)
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        shape = constants.get(node.input[1])
        if shape is not None and shape.ndim == 1 and len(shape) > 1 and int(shape[0]) == 1:
            raise HardCodedBatchError(
                f"node {node.name or node.output[0]} (Reshape) hard-codes batch 1 in its target "
                f"shape {shape.tolist()}; export with a batch-free reshape (x.flatten(1)) to get "
                f"a batch-{batch} copy"
            )


def _refuse_fixed_outputs(model: Any, batch: int) -> None:
    """HardCodedBatchError when shape inference keeps an output's batch at another size. Only a
    check: when inference fails, ONNX Runtime has the last word (`rebatch_onnx`)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return
    for output in inferred.graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value != batch:
            raise HardCodedBatchError(
                f"output {output.name} keeps batch {dims[0].dim_value} when the input takes "
                f"{batch}: the graph hard-codes its batch size"
            )


def rebatch_onnx(
    source: str | Path, target: str | Path, batch: int, inputs: np.ndarray | None = None
) -> Path:
    """Write the batch-`batch` copy of the ONNX file `source` to `target`, checked with ORT.

    ONNX Runtime runs the copy and the model as a batch-1 conversion sees it (`_as_converted`)
    on the same samples (`inputs`, else random ones: two whole batches and a padded one); the
    copy must run and give the same outputs per sample, else HardCodedBatchError.
    """
    import onnx
    from bnnexport.converters.runtimes import run_onnx

    source, target = Path(source), Path(target)
    model = onnx.load(str(source))
    onnx.save(rebatch(model, batch), str(target))
    if inputs is None:
        shape = [d.dim_value or 1 for d in _batched_input(model).type.tensor_type.shape.dim]
        rng = np.random.default_rng(0)
        inputs = rng.standard_normal([2 * batch + 1, *shape[1:]]).astype(np.float32)
    try:
        outputs = run_onnx(target, inputs)
    except InvalidModelError:
        raise
    except Exception as error:
        line = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise HardCodedBatchError(
            f"{source.name} does not run at batch {batch} in ONNX Runtime ({line}): the graph "
            "hard-codes its batch size"
        ) from None
    reference = run_onnx(_as_converted(model).SerializeToString(), inputs)
    _require_same_outputs(reference, outputs, f"{source.name} at batch {batch}")
    return target


def _as_converted(model: Any) -> Any:
    """`model` at the batch a conversion without `--batch` gives it: a dynamic batch fixed at 1
    (so every sample runs alone), a fixed one kept."""
    fixed = _batched_input(model).type.tensor_type.shape.dim[0].dim_value > 0
    return model if fixed else rebatch(model, 1)


def _require_same_outputs(reference: np.ndarray, outputs: np.ndarray, what: str) -> None:
    """HardCodedBatchError unless `outputs` are `reference`'s, sample by sample (shape too)."""
    from bnnexport.converters.gate import compare_outputs

    try:
        agreement = compare_outputs(reference, outputs)
    except ConversionMismatchError as error:  # another shape: samples were mixed or merged
        raise HardCodedBatchError(
            f"{what} gives outputs of another shape than at batch 1 ({error}): the graph mixes "
            "samples"
        ) from None
    if not agreement.passed:
        raise HardCodedBatchError(
            f"{what} gives other outputs than at batch 1 on the same samples (max |diff| "
            f"{agreement.max_abs_diff:.3g}): the graph mixes samples"
        )


def convert_batched(
    onnx_path: str | Path,
    output: str | Path,
    batch: int,
    target: str = "arm64",
    inputs: np.ndarray | None = None,
    options: ConvertOptions | None = None,
    references: Sequence[Reference] = (),
    write_float_tflite: str | Path | None = None,
    labels: np.ndarray | None = None,
) -> ConversionResult:
    """Convert `onnx_path` at batch `batch` into the flatbuffer `output`: its copy at batch N
    (`rebatch_onnx`, checked with ONNX Runtime) through the whole gate, options and references
    of a batch-1 conversion (`converters.lce.convert_onnx`)."""
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    with tempfile.TemporaryDirectory(prefix="bnnexport-batched-") as tmp:
        copy_onnx = rebatch_onnx(onnx_path, Path(tmp) / f"model-b{batch}.onnx", batch, inputs)
        return convert_onnx(
            copy_onnx,
            output,
            target=target,
            inputs=inputs,
            options=options or ConvertOptions(),
            references=references,
            write_float_tflite=write_float_tflite,
            labels=labels,
        )
