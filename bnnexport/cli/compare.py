"""`bnnexport compare`."""

from __future__ import annotations

import click

from bnnexport.cli.common import emit, handle_errors, json_option


@click.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="runs/compare",
    show_default=True,
    help="Folder for compare.png, compare.json and compare.csv.",
)
@json_option
@handle_errors
def compare_command(run_dirs: tuple[str, ...], out: str, as_json: bool) -> None:
    """Compare training runs: one figure (test accuracy and π_t over steps, one curve per
    setting) and one table (final accuracy, flips, seconds, π over the last epoch in all and
    per layer, optimizer, hyperparameters, and every other setting the runs differ in, such
    as --float-layers, --batch-size or --precision, which the labels show too).

    Runs that differ only in their seed are one setting: mean ± sample std (n - 1) in the
    table, error bars in the figure (`bnnexport sweep --seeds N` makes such runs); a setting
    keeps the colour its sweep gave it.
    """
    from bnnexport.stages.compare import compare, format_table

    report = compare(list(run_dirs), out)
    if as_json:
        emit(report, True)
        return
    click.echo(format_table(report.rows))
    click.echo(f"figure: {report.figure}; table: {report.table}")
    for note in report.notes:
        click.echo(f"bnnexport: note: {note}", err=True)
