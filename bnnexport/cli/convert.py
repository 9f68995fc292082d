"""`bnnexport convert`."""

from __future__ import annotations

import click

from bnnexport.cli.common import emit, handle_errors, json_option


@click.command("convert")
@click.argument("source", metavar="RUN_DIR|MODEL.onnx", type=click.Path())
@click.option("--target", type=click.Choice(["arm64", "arm32"]), default="arm64",
              show_default=True,
              help="Device the flatbuffer is for. Both use LCE's target \"arm\"; the file is "
                   "named model-arm64.tflite or model-arm32.tflite.")
@click.option("--format", "fmt", type=click.Choice(["lce", "tflite"]), default="lce",
              show_default=True,
              help="lce: the LCE flatbuffer only. tflite: also a plain float TFLite model "
                   "(model-float.tflite) that the stock TFLite interpreter runs, for comparison.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Check on only the first N samples of RUN_DIR/samples.npz. [default: all]")
@click.option("--batch-twin", type=click.IntRange(min=1), default=None, metavar="N",
              help="Also write model-TARGET-bN.tflite, the model converted at batch N and passed "
                   "by the same gate, for accuracy on a device (`bench --device-batch N`).")
@json_option
@handle_errors
def convert_command(source: str, target: str, fmt: str, samples: int | None,
                    batch_twin: int | None, as_json: bool) -> None:
    """Convert RUN_DIR/model.onnx (or any MODEL.onnx) to a Larq Compute Engine flatbuffer.

    Every binary layer (a Conv/MatMul/Gemm fed by a binarization) becomes an LceBconv2d. The
    flatbuffer then runs in LCE's interpreter on the run's test samples (random inputs for a raw
    MODEL.onnx) and is compared with ONNX Runtime and PyTorch: exit 1, keeping no flatbuffer, when
    argmax agreement is below 100 % or max |diff| exceeds 1e-4 of the logit range on a sample
    that no sign tie explains (a pre-sign value within float rounding of zero that the runtimes
    decide differently; such samples are listed under sign_ties). An unsupported ONNX op exits
    2, naming the node and its op type.
    """
    from bnnexport.convert import convert_run

    report = convert_run(source, target=target, fmt=fmt, samples=samples, batch_twin=batch_twin)
    emit(report, as_json, title=None if as_json else f"converted -> {report.output}")
