"""`bnnexport export`."""

from __future__ import annotations

import click

from bnnexport.cli.common import count_option, emit, handle_errors, json_option, locks_run


@click.command("export")
@click.argument("run_dir", type=click.Path())
@click.option(
    "--opset",
    type=click.IntRange(13, 18),
    default=17,
    show_default=True,
    help="ONNX opset to write (the legacy exporter honours 13-18).",
)
@count_option(
    "--batch", default=1, help="Batch dimension written into model.onnx (LCE runs batch 1)."
)
@count_option(
    "--samples",
    default=1000,
    help="Test samples checked in ONNX Runtime and written to RUN_DIR/samples.npz (not with "
    "--out).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.onnx",
    help="Write the ONNX model here instead. [default: RUN_DIR/model.onnx] The run directory "
    "is then left as it is: its model.onnx, samples.npz and export.json stay, and `bnnexport "
    "convert RUN_DIR` still converts RUN_DIR/model.onnx. FILE's folder gets FILE, "
    "provenance.json (bnnexport's record of the files it wrote there) and, when the check "
    "refuses, FILE-gate-refusal.json; `bnnexport convert FILE.onnx` converts it (checked on "
    "random inputs against ONNX Runtime, without the run's samples and PyTorch).",
)
@json_option
@handle_errors
@locks_run("run_dir")
def export_command(
    run_dir: str, opset: int, batch: int, samples: int, out: str | None, as_json: bool
) -> None:
    """Export the model of RUN_DIR to RUN_DIR/model.onnx (or --out) and check it in ONNX Runtime.

    The binary kernels are verified first; the test samples go to RUN_DIR/samples.npz with
    model.onnx (with --out, nothing is written into RUN_DIR). Exits 1
    (leaving any previous model.onnx untouched) when ONNX Runtime disagrees with PyTorch by more
    than 1e-4 of the logit range on a sample, unless imposing ONNX Runtime's signs in PyTorch
    explains it by a few rounding ties (listed under tie_samples; an exact 0 in both runtimes
    decided differently never counts), or when more than 1 % of the predictions PyTorch is sure
    of (top-1 margin >= 5 % of the logit range; and more than one) differ before any replay.
    """
    from bnnexport.stages.export import export_onnx

    emit(
        export_onnx(
            run_dir,
            opset=opset,
            batch=batch,
            samples=samples,
            out=out,
            progress=False if as_json else None,
        ),
        as_json,
    )
