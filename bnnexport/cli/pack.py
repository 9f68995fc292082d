"""`bnnexport pack`."""

from __future__ import annotations

import click

from bnnexport.cli.common import emit, handle_errors, json_option, locks_run


@click.command("pack")
@click.argument("run_dir", type=click.Path())
@json_option
@handle_errors
@locks_run("run_dir")
def pack_command(run_dir: str, as_json: bool) -> None:
    """Write RUN_DIR/model.safetensors: binary kernels at 1 bit per weight, the rest as is.

    The model is verified first (RUN_DIR/verify.json); a model whose binary kernels are not
    strictly ±1 is refused with exit 1 and nothing is written. Bits are 1 where the weight is -1
    (LCE's convention). The file is safetensors (never unpickled) with the model name, arguments,
    config, shapes and a content hash as metadata; `bnnexport.load_packed` and every command that
    takes a checkpoint read it back. Prints float32 vs packed bytes, file_ratio (the whole
    packed file over the float32 weights) and binary_kernel_ratio (the binary kernels alone:
    1/32), and writes RUN_DIR/pack.json.
    """
    from bnnexport.stages.pack import pack

    report = pack(run_dir)
    emit(report, as_json, title=f"packed {report.model} -> {report.packed}")
