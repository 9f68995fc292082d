"""`bnnexport zoo list`."""

from __future__ import annotations

import json

import click

from bnnexport.cli.common import handle_errors, json_option
from bnnexport.errors import ConfigError


@click.group("zoo")
def zoo_command() -> None:
    """The model zoo: models `train --model` and `init --model` accept."""


@zoo_command.command("list")
@click.argument("pattern", default="*")
@json_option
@handle_errors
def list_command(pattern: str, as_json: bool) -> None:
    """Registered models (whose name holds PATTERN, or matches it as a shell pattern such as
    'quicknet-*') at their native input size: parameters, binary share of the parameters and
    of the MACs (as `summary` counts them), binary layers, and the published top-1 accuracy
    (with --json, where it is published). The figures are those each model computed when they
    were stored with the package; a model whose code changed since is built and traced now (a
    few seconds per ImageNet model), and a note says which."""
    import sys

    from bnnexport.models import list_models
    from bnnexport.stages.progress import Steps
    from bnnexport.stages.zoo import matching, zoo_entries

    if not matching(pattern):
        raise ConfigError(f"no model matches {pattern!r}; known: {', '.join(list_models())}")
    steps = Steps("zoo list", enabled=False if as_json else None)
    entries, computed = zoo_entries(pattern, progress=lambda name: steps(f"summarising {name}"))
    if computed:
        print(f"bnnexport: note: summarised {', '.join(computed)} now: their code changed since "
              "the stored figures were made (python scripts/zoo_figures.py stores them anew)",
              file=sys.stderr)  # fmt: skip
    if as_json:
        click.echo(json.dumps({"models": [e.to_json() for e in entries]}))
        return
    header = (
        f"{'model':20} {'input':10} {'classes':>7} {'params':>11} {'binary':>7} "
        f"{'bin MACs':>8} {'layers':>6} {'top-1':>6}"
    )
    click.echo(header)
    for e in entries:
        shape = "x".join(str(v) for v in e.input_shape)
        top1 = f"{e.top1:.1f}%" if e.top1 is not None else "-"
        click.echo(
            f"{e.name:20} {shape:10} {e.num_classes:>7} {e.parameters:>11,} "
            f"{e.binary_share:>7.2%} {e.binary_mac_share:>8.2%} {e.binary_layers:>6} {top1:>6}"
        )
