"""The `bnnexport` command line: a thin layer over the library's stage functions.

Each command lives in its own module here and only parses options, calls the library and prints
the report (a table, or one JSON object with `--json`). It may import everything below it;
nothing imports it but `bnnexport.__main__`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bnnexport import __version__
from bnnexport.cli.bench import bench_command
from bnnexport.cli.common import fail
from bnnexport.cli.compare import compare_command
from bnnexport.cli.convert import convert_command
from bnnexport.cli.device import device_command
from bnnexport.cli.export import export_command
from bnnexport.cli.init import init_command
from bnnexport.cli.pack import pack_command
from bnnexport.cli.pipeline import pipeline_command
from bnnexport.cli.recipes import recipes_command
from bnnexport.cli.summary import summary_command
from bnnexport.cli.sweep import sweep_command
from bnnexport.cli.train import train_command
from bnnexport.cli.verify import verify_command
from bnnexport.cli.zoo import zoo_command

_DEFAULT_FORMAT = warnings.formatwarning
_PACKAGE = Path(__file__).resolve().parents[1]


def _format_warning(
    message: Any, category: type, filename: str, lineno: int, line: Any = None
) -> str:
    """bnnexport's own warnings (`init_sign` setting kernels to sign(w), say) as one line on
    stderr, like its notes; anyone else's as Python prints them."""
    if Path(filename).resolve().is_relative_to(_PACKAGE):
        return f"bnnexport: warning: {message}\n"
    return _DEFAULT_FORMAT(message, category, filename, lineno, line)


class BnnExportGroup(click.Group):
    """The command group, with click's own usage errors turned into bnnexport's one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        # tf-keras 2 instead of Keras 3 would change how TensorFlow loads; bnnexport needs neither
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
        warnings.formatwarning = _format_warning
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as error:  # plain `bnnexport`: the help
            click.echo(error.format_message())
            code = 0
        except click.ClickException as error:
            fail(error.format_message(), 2, "--json" in argv)
        except click.Abort:
            fail("interrupted", 130, "--json" in argv)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(
    cls=BnnExportGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="bnnexport")
def main() -> None:
    """Train binarized neural networks in PyTorch with Bop and take them to Larq Compute Engine.

    The pipeline: train -> verify -> pack -> export -> convert -> bench. Every command takes a
    run directory (RUN_DIR) that holds the artifacts of one model.
    """


main.add_command(train_command)
main.add_command(summary_command)
main.add_command(verify_command)
main.add_command(pack_command)
main.add_command(export_command)
main.add_command(convert_command)
main.add_command(bench_command)
main.add_command(pipeline_command)
main.add_command(zoo_command)
main.add_command(init_command)
main.add_command(compare_command)
main.add_command(recipes_command)
main.add_command(sweep_command)
main.add_command(device_command)
