"""`bnnexport convert`."""

from __future__ import annotations

from typing import Any

import click

from bnnexport.cli.common import (
    choice_option,
    count_option,
    emit,
    handle_errors,
    json_option,
    locks_run,
)
from bnnexport.converters.choices import LAYER_PRECISIONS, TARGETS


@click.command("convert")
@click.argument("source", metavar="RUN_DIR|MODEL.onnx", type=click.Path())
@choice_option(
    "--target",
    choices=TARGETS,
    default="arm64",
    help='Device the flatbuffer is for. Both use LCE\'s target "arm"; the file is '
    "named model-arm64.tflite or model-arm32.tflite.",
)
@choice_option(
    "--format",
    "fmt",
    choices=["lce", "tflite"],
    default="lce",
    help="lce: the LCE flatbuffer only. tflite: also a plain float TFLite model "
    "(model-float.tflite) that the stock TFLite interpreter runs, for comparison.",
)
@count_option(
    "--samples",
    default=None,
    help="Check on only the first N samples of RUN_DIR/samples.npz. [default: all]",
)
@click.option(
    "--allow-float",
    "allow_float",
    multiple=True,
    metavar="LAYER|all",
    help="Let this binary layer (its ONNX node name, as the error names it) stay a "
    "float layer instead of failing; repeatable; 'all' allows every one. Allowed "
    "layers are listed in the report's float_fallbacks. A name that is no binary layer of "
    "the model is refused (exit 2), listing the ones it has.",
)
@count_option(
    "--batched-copy",
    "--batch-twin",
    "batched_copy",
    default=None,
    metavar="N",
    help="Also write model-TARGET-bN.tflite, a copy of the model converted at batch N and "
    "passed by the same gate, for accuracy on a device (`bench --device-batch N`). "
    "(--batch-twin is the deprecated spelling.)",
)
@count_option(
    "--batch",
    default=1,
    help="Batch size fixed in place of a dynamic batch dimension (tf2onnx and "
    "dynamic-axes exports); the flatbuffer takes exactly this batch. Other than 1, it is "
    "written as MODEL-TARGET-bN.tflite, converted and gated as --batched-copy N is.",
)
@click.option(
    "--disable-rewrite",
    "disabled_rewrites",
    multiple=True,
    metavar="PASS",
    help="Skip one pass of the normalising front end (e.g. bitorch-sign); repeatable. "
    "A diagnostic: the conversion then names the node that pass would rewrite.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.tflite",
    help="Where the flatbuffer of a MODEL.onnx goes. [default: MODEL-TARGET.tflite beside "
    "MODEL.onnx; MODEL-TARGET-bN.tflite with --batch N] Its folder also gets provenance.json "
    "(bnnexport's record of the files it wrote there, so a later command replaces only its "
    "own), OUT-float.tflite with --format tflite (MODEL-float.tflite by default), OUT-bN.tflite "
    "with --batched-copy N, and OUT-gate-refusal.json when the gate refuses; nothing else. A "
    "RUN_DIR's flatbuffer is always RUN_DIR/model-TARGET.tflite (what bench reads).",
)
@click.option(
    "--trust-twin",
    is_flag=True,
    help="When the check on real weights cannot decide because more binarization inputs lie "
    "within rounding of zero than ties explain (a degenerate model, e.g. untrained "
    "BatchNorm), convert on the strength of the exact-grid twin alone; the report's "
    "trusted_twin says so. Any other refusal still exits 1.",
)
@choice_option(
    "--float-layers",
    "float_layers",
    choices=LAYER_PRECISIONS,
    default=None,
    help="int8: run the float layers (conv, depthwise, dense) in int8, per output channel for "
    "kernels and per tensor for activations, every binary layer still an LceBconv2d; written "
    "to model-TARGET-int8.tflite and convert-int8.json beside the float ones (MODEL-TARGET-"
    "int8.tflite for an ONNX file), checked against the same int8 model in ONNX Runtime. "
    "[default: the run's own (int8 after train --float-layers int8), else float32]",
)
@click.option(
    "--calibration-samples",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.npz",
    help="int8: calibrate the activation ranges on these inputs (an .npz with `inputs`, NCHW "
    "float32, the model's shape). [default: the run's samples.npz; random inputs for an ONNX "
    "file; none for a model trained with --float-layers int8, which carries its ranges]",
)
@choice_option(
    "--io",
    choices=LAYER_PRECISIONS,
    default="float32",
    help="int8: the flatbuffer's input and output types (int8: no QUANTIZE / DEQUANTIZE at the "
    "ends; feed it inputs quantized with its input scale and zero point).",
)
@choice_option(
    "--input-layout",
    "input_layout",
    choices=["nhwc", "nchw"],
    default=None,
    help="How the flatbuffer takes its image input: nhwc (channels last, TFLite's convention: "
    "what an app on the device feeds, camera frames in HWC; no TRANSPOSE op at its input) or "
    "nchw (PyTorch's and ONNX's layout, turned NHWC by a TRANSPOSE inside the model). The "
    "flatbuffer's metadata (input_layout) and convert.json say which; samples stay NCHW and are "
    "transposed wherever bnnexport feeds the flatbuffer. A model with no NCHW image input (a "
    "flat input, or tf2onnx's channels-last one) is taken as the ONNX model takes it, and the "
    "option is refused for it. [default: nhwc, for arm64 and arm32]",
)
@click.option(
    "--max-accuracy-drop",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="POINTS",
    help="int8: refuse (exit 1, no flatbuffer kept) a model whose top-1 on the run's labelled "
    "samples is more than this many percentage points below the float model's; a large value "
    "(e.g. 100) allows any loss.",
)
@json_option
@handle_errors
@locks_run("source")
def convert_command(source: str, as_json: bool, **options: Any) -> None:
    """Convert RUN_DIR/model.onnx (or any MODEL.onnx) to a Larq Compute Engine flatbuffer.

    RUN_DIR is a run directory after `bnnexport export` (checkpoint.pt, model.onnx,
    samples.npz): the flatbuffer, convert.json and the manifest provenance.json go into it, and
    the gate runs on its samples against ONNX Runtime and PyTorch. Any other folder is refused
    (exit 2) and nothing is written into it. A MODEL.onnx is converted to --out (default
    MODEL-TARGET.tflite beside it) and checked on 16 random inputs against ONNX Runtime; what
    else its folder gets is listed under --out.

    Every binary layer (a Conv/MatMul/Gemm with a ±1 kernel fed by a binarization) must become an
    LceBconv2d: exit 1 naming each one that would stay float (see --allow-float). The flatbuffer
    then runs in LCE's interpreter on the run's test samples (random inputs for a raw MODEL.onnx)
    and is compared with ONNX Runtime and PyTorch, and an exact-grid twin of the graph (parameters
    and inputs on power-of-two grids, so every sum is exact) is converted too and must agree with no
    sign tie at all. Exit 1, keeping no flatbuffer, when a sample differs by more than 1e-4 of the
    logit range, unless replaying LCE's own signs explains it by a few rounding ties (listed under
    tie_samples; an exact 0 in both runtimes never counts, nor does the same value decided
    differently twice); the error line names gate-refusal.json, which says why. An unsupported
    ONNX op exits 2, naming the node and its op type.

    With --float-layers int8 the float layers (stem, shortcut convs, head) run in int8: their
    activation ranges calibrated on the run's samples (or --calibration-samples), BatchNorm
    folded, kernels per output channel. The flatbuffer is then checked against the same int8
    model in ONNX Runtime (each int8 tensor within one quantization step, given the flatbuffer's
    own int8 tensors before it), and its top-1 against the float model's (--max-accuracy-drop).

    Any ONNX file is first normalised: bitorch's, Brevitas' (QONNX BipolarQuant and plain),
    ReActNet/Bi-Real/IR-Net's and tf2onnx's binarizations become one canonical form, weights
    binarized in the graph are folded, shape chains fold at --batch. A plain Sign (sign(0) = 0)
    in front of a binary layer converts only when no exact 0 reaches it on the samples (else
    exit 1).
    """
    from bnnexport.converters.normalize import REWRITES
    from bnnexport.stages.convert import convert_run

    unknown = sorted(set(options["disabled_rewrites"]) - set(REWRITES))
    if unknown:
        raise click.BadParameter(
            f"unknown pass {unknown[0]!r}; passes: {', '.join(REWRITES)}",
            param_hint="--disable-rewrite",
        )
    # every option is convert_run's argument of the same name
    report = convert_run(source, progress=False if as_json else None, **options)
    emit(report, as_json, title=None if as_json else f"converted -> {report.output}")
