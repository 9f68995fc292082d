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

    RUN_DIR is a run directory or a checkpoint file.
    """
    from bnnexport.runs import load_model
    from bnnexport.summary import summarize

    emit(summarize(load_model(run_dir)), as_json)
