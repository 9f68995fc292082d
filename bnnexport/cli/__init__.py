"""The `bnnexport` command line: a thin layer over the library's stage functions.

Each command lives in its own module here and only parses options, calls the library and prints
the report (a table, or one JSON object with `--json`).
"""

from __future__ import annotations

import click

from bnnexport import __version__
from bnnexport.cli.bench import bench_command
from bnnexport.cli.convert import convert_command
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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
main.add_command(recipes_command)
main.add_command(sweep_command)
