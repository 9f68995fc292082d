"""`bnnexport verify`."""

from __future__ import annotations

import click

from bnnexport.cli.common import emit, handle_errors, json_option, locks_run


@click.command("verify")
@click.argument(
    "path", metavar="RUN_DIR|CHECKPOINT.pt|MODEL.onnx|PACKED.safetensors", type=click.Path()
)
@json_option
@handle_errors
@locks_run("path")
def verify_command(path: str, as_json: bool) -> None:
    """Check that every binary kernel is strictly ±1 and every binary input is binarized.

    PATH is a run directory (its checkpoint is checked and the report written to
    RUN_DIR/verify.json), a checkpoint, a packed .safetensors file or an ONNX model. In ONNX, a
    kernel that is ±1 times one positive scale per output channel (BatchNorm folded in) passes
    and is reported as "scaled".

    Exit status: 0 when strict; 1 when not, with one line per offending layer on stderr (its
    name, how many values are off, a few of them with their indices); 2 for a missing,
    truncated or foreign file.
    """
    from bnnexport.stages.verify import verify

    report = verify(path)
    emit(report, as_json)
    if not report.strict:
        for item in report.offending:
            click.echo(f"bnnexport: not binary: {item['message']}", err=True)
        raise SystemExit(1)
