"""`bnnexport sweep`."""

from __future__ import annotations

import click

from bnnexport.cli.common import choice_option, count_option, emit, handle_errors, json_option
from bnnexport.cli.train import train_command
from bnnexport.optimizers import OPTIMIZERS
from bnnexport.train import TrainConfig

DEFAULTS = TrainConfig()


def _numbers(_ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    try:
        numbers = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        numbers = []
    if not numbers:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}")
    return numbers


@click.command("sweep")
@click.option(
    "--gamma",
    "gammas",
    required=True,
    callback=_numbers,
    help="Adaptivity rates γ, comma-separated (e.g. 1e-2,1e-3,1e-4).",
)
@click.option(
    "--threshold",
    "thresholds",
    required=True,
    callback=_numbers,
    help="Thresholds τ, comma-separated (e.g. 1e-6,0).",
)
@choice_option(
    "--optimizer",
    choices=sorted(k for k in OPTIMIZERS if k != "adam-latent"),
    default=DEFAULTS.optimizer,
    help="A Bop variant (γ and τ are its hyperparameters).",
)
@click.option(
    "--lr",
    type=float,
    default=DEFAULTS.lr,
    show_default=True,
    help="Adam learning rate for the real-valued parameters.",
)
@count_option("--epochs", default=DEFAULTS.epochs, help="Epochs per run.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="runs/sweep",
    show_default=True,
    help="Directory for the runs (OUT/gamma=G,threshold=T), sweep.png, sweep.json.",
)
@click.option("--force", is_flag=True, help="Replace runs already in OUT.")
@json_option
@handle_errors
def sweep_command(
    gammas,
    thresholds,
    model,
    dataset,
    data_dir,
    optimizer,
    lr,
    epochs,
    batch_size,
    seed,
    device,
    out,
    force,
    as_json,
) -> None:
    """Train once per (γ, τ) setting and compare: the paper's Fig. 2 analysis on any data set.

    Writes one run per setting, OUT/sweep.png (test accuracy and flip rate π_t per setting)
    and OUT/sweep.json (final accuracies, flip rates, and whether a higher γ and a lower τ gave
    more flips, as the paper says).
    """
    from bnnexport.sweep import sweep

    base = TrainConfig(
        model=model, dataset=dataset, data_dir=data_dir, optimizer=optimizer, lr=lr,
        epochs=epochs, batch_size=batch_size, seed=seed, device=device,
    )  # fmt: skip
    report = sweep(base, gammas, thresholds, out, force=force)
    if as_json:
        emit(report, True)
        return
    click.echo(f"sweep of {report.model} on {report.dataset} ({report.optimizer}, "
               f"{report.epochs} epochs) -> {report.out}")  # fmt: skip
    click.echo(f"{'gamma':>8} {'threshold':>9} {'test acc':>8} {'train acc':>9} "
               f"{'π (run)':>8} {'π (last)':>8}")  # fmt: skip
    for s in report.settings:
        click.echo(
            f"{s.gamma:>8g} {s.threshold:>9g} {s.test_accuracy:>8.4f} {s.train_accuracy:>9.4f} "
            f"{s.flip_rate:>8.3f} {s.last_epoch_flip_rate:>8.3f}"
        )
    verdict = "agrees" if report.ordering["agrees"] else "does NOT agree"
    click.echo(f"flip-rate ordering (higher γ, lower τ -> more flips) {verdict} with the paper; "
               f"figure: {report.figure}")  # fmt: skip


# The options a sweep shares with `bnnexport train` come from that command itself, so the two
# never drift apart (as in `bnnexport pipeline`).
_SHARED = ("model", "dataset", "data_dir", "batch_size", "seed", "device")
sweep_command.params[2:2] = [p for p in train_command.params if p.name in _SHARED]
