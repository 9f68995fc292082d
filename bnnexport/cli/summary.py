"""`bnnexport summary`."""

from __future__ import annotations

import click

from bnnexport.cli.common import emit, handle_errors, json_option


@click.command("summary")
@click.argument("run_dir", type=click.Path())
@json_option
@handle_errors
def summary_command(run_dir: str, as_json: bool) -> None:
    """Per layer: precision of inputs and weights, parameters, memory and MACs; totals binary vs
    float, size at 1-bit packing vs float32, and the share of MACs that are binary.

    RUN_DIR is a run directory, a checkpoint file or a packed `.safetensors`. Which kernels are
    binary is the run's own record (written by train or init); every conv, linear and matmul
    call of one forward pass is a layer, those of a model of your own included.
    """
    from bnnexport.run.checkpoint import open_run_model
    from bnnexport.stages.summary import summarize

    loaded = open_run_model(run_dir)
    emit(summarize(loaded.model, kernels=loaded.kernels), as_json)
