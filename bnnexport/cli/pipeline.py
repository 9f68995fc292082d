"""`bnnexport pipeline`: train -> verify -> pack -> export -> convert -> bench in one command.

The options are those of `bnnexport train` (its --torch-device too; --train-device is the
deprecated spelling here, and train's deprecated --device is left out) and of
`bnnexport bench` (whose --device is the SSH device), taken from those commands themselves so
they never drift apart.
"""

from __future__ import annotations

from typing import Any

import click

from bnnexport.cli.bench import bench_command, bench_options, device_target
from bnnexport.cli.common import emit, given_options, handle_errors
from bnnexport.cli.train import resumed_out, train_command, train_config

_TRAIN = [p for p in train_command.params if p.name not in ("device", "as_json")]
_BENCH = [
    p
    for p in bench_command.params
    if isinstance(p, click.Option) and p.name not in ("as_json", "samples_file")
]


@handle_errors
def _pipeline(**options: Any) -> None:
    """Train a BNN and take it all the way: verify, pack, export to ONNX, convert to an LCE
    flatbuffer (and a float TFLite model), and bench every backend on the host (and, with
    --device, the LCE flatbuffer on that device).

    Ends by printing the bench table and the path of RUN_DIR/report.md. The first stage that
    fails stops the chain with its own one-line error and exit code.
    """
    from bnnexport.stages.pipeline import pipeline

    as_json = options.pop("as_json")
    resume = options["resume"]  # `--resume RUN` is `--resume --out RUN`, as for train
    options.update(resume=resume is not None, out=resumed_out(resume, options["out"]))
    ctx = click.get_current_context()
    given = {"device" if name == "train_device" else name for name in given_options(ctx)}
    config, explicit = train_config({**options, "device": options["train_device"]}, given)
    report = pipeline(
        config,
        bench_options(options),
        resume=options["resume"],
        force=options["force"],
        progress=None if not as_json else False,
        log=lambda line: click.echo(line, err=True),
        explicit=explicit,
        device=device_target(options),
    )
    emit(report, as_json)


pipeline_command = click.Command(
    "pipeline",
    callback=_pipeline,
    help=_pipeline.__doc__,
    short_help="Train -> verify -> pack -> export -> convert -> bench, in one command.",
    params=[
        *_TRAIN,
        click.Option(
            ["--torch-device", "--train-device", "train_device"],
            default="cpu",
            show_default=True,
            help="Torch device to train on (cpu, cuda, cuda:1), as train's --torch-device. "
            "(--train-device is the deprecated spelling; --device is the SSH device.)",
        ),
        *_BENCH,
        click.Option(
            ["--json", "as_json"],
            is_flag=True,
            help="Print exactly one JSON object on stdout (every stage's report).",
        ),
    ],
)
