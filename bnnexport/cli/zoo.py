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
    """Registered models (matching PATTERN): parameters, binary share, native input size."""
    from bnnexport.zoo import zoo_entries

    entries = zoo_entries(pattern)
    if not entries:
        from bnnexport.models import list_models

        raise ConfigError(f"no model matches {pattern!r}; known: {', '.join(list_models())}")
    if as_json:
        click.echo(json.dumps({"models": [e.to_json() for e in entries]}))
        return
    header = f"{'model':16} {'input':12} {'classes':>7} {'params':>12} {'binary':>7} {'layers':>6}"
    click.echo(header)
    for e in entries:
        shape = "x".join(str(v) for v in e.input_shape)
        click.echo(
            f"{e.name:16} {shape:12} {e.num_classes:>7} {e.parameters:>12,} "
            f"{e.binary_share:>7.2%} {e.binary_layers:>6}"
        )
