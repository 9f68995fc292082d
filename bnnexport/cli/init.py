"""`bnnexport init`."""

from __future__ import annotations

import click

from bnnexport.cli.common import NameOrImport, count_option, emit, handle_errors, json_option
from bnnexport.models import list_models


def _shape(_ctx: click.Context, _param: click.Parameter, value: str | None):
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise click.BadParameter(f"expected C,H,W (e.g. 3,64,64), got {value!r}")
    return shape


@click.command("init")
@click.option(
    "--model",
    required=True,
    type=NameOrImport(list_models(), "factory"),
    help="Model from the registry (`bnnexport zoo list`), or your own as module:factory "
    "(called with num_classes and input_shape as far as it takes them; its kernels are "
    "found by tracing and set to ±1).",
)
@click.option(
    "--input-shape",
    callback=_shape,
    default=None,
    help="C,H,W [default: the model's native size; a factory's own input_shape default].",
)
@count_option(
    "--num-classes", default=None, help="Number of classes [default: the model's native number]."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Run directory to write. [default: runs/MODEL-init]",
)
@click.option("--force", is_flag=True, help="Replace a run already in --out.")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed for the kernels and the BatchNorm statistics.",
)
@click.option(
    "--dataset",
    default=None,
    help="Data set whose test images `bnnexport export` should use (recorded only).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of that data set (recorded only).",
)
@json_option
@handle_errors
def init_command(
    model, input_shape, num_classes, out, force, seed, dataset, data_dir, as_json
) -> None:
    """Write an initialised, untrained run (±1 kernels, randomised BatchNorm statistics, the
    record of its binary kernels), ready for summary, verify, pack, export, convert and bench."""
    from bnnexport.stages.init import init_run

    report = init_run(model, input_shape, num_classes, out, force, seed, dataset, data_dir)
    emit(report, as_json, title=f"initialised {report.model} -> {report.run_dir}")
