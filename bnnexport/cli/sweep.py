"""`bnnexport sweep`."""

from __future__ import annotations

import click

from bnnexport.cli.common import count_option, emit, given_options, handle_errors, json_option
from bnnexport.cli.train import train_command, train_config
from bnnexport.optim.composite import OPTIMIZERS
from bnnexport.stages.sweep import on_grid
from bnnexport.training.config import TrainConfig

DEFAULTS = TrainConfig()


def _optimizers(_ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in OPTIMIZERS]
    if not names or unknown or len(set(names)) != len(names):
        raise click.BadParameter(
            f"expected distinct names of {', '.join(OPTIMIZERS)}, comma-separated; got {value!r}"
        )
    return names


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
@click.option(
    "--optimizer",
    "optimizers",
    default=DEFAULTS.optimizer,
    show_default=True,
    callback=_optimizers,
    help=f"Optimizers, comma-separated ({', '.join(OPTIMIZERS)}): each Bop variant runs every "
    f"(γ, τ); one that has no γ or τ ({', '.join(n for n in OPTIMIZERS if not on_grid(n))}) "
    "runs once.",
)
@count_option(
    "--seeds",
    default=1,
    help="Runs per setting (seeds --seed, --seed+1, ...): mean ± sample std (n - 1) in the "
    "table, error bars in the figure.",
)
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
def sweep_command(gammas, thresholds, optimizers, seeds, out, force, as_json, **options) -> None:
    """Train once per (γ, τ) setting and compare: the paper's Fig. 2 analysis on any data set.

    Writes one run per setting, OUT/sweep.png (test accuracy and flip rate π_t per setting, a
    column per hyperparameter the sweep varies, its value the curve's colour) and
    OUT/sweep.json (final accuracies, flip rates over all binary weights and per layer, and
    whether a higher γ and a lower τ gave more flips, as the paper says). Every option of
    `bnnexport train` but those a sweep sets itself applies to every run.
    """
    from bnnexport.stages.sweep import sweep

    values = {**options, "optimizer": optimizers[0], "optimizers": optimizers, "out": None,
              "gamma": str(DEFAULTS.gamma), "threshold": str(DEFAULTS.threshold),
              "resume": False, "recipe": None}  # fmt: skip
    base, _ = train_config(values, given_options(click.get_current_context()))
    report = sweep(base, gammas, thresholds, out, force=force, optimizers=optimizers, seeds=seeds)
    if as_json:
        emit(report, True)
        return
    click.echo(f"sweep of {report.model} on {report.dataset} ({report.optimizer}, "
               f"{report.epochs} epochs, {report.seeds} seed(s)) -> {report.out}")  # fmt: skip
    click.echo(f"{'optimizer':<14} {'gamma':>8} {'threshold':>9} {'test acc':>17} "
               f"{'π (run)':>15} {'π (last epoch)':>14}")  # fmt: skip
    several = report.seeds > 1
    for s in report.settings:
        gamma = "-" if s.gamma is None else f"{s.gamma:g}"
        threshold = "-" if s.threshold is None else f"{s.threshold:g}"
        accuracy = f"{s.test_accuracy:.4f}" + (f" ± {s.test_accuracy_std:.4f}" if several else "")
        rate = f"{s.flip_rate:.3f}" + (f" ± {s.flip_rate_std:.3f}" if several else "")
        click.echo(
            f"{s.optimizer:<14} {gamma:>8} {threshold:>9} {accuracy:>17} {rate:>15} "
            f"{s.last_epoch_flip_rate:>14.3f}"
        )
    verdict = "agrees" if report.ordering["agrees"] else "does NOT agree"
    click.echo(f"flip-rate ordering (higher γ, lower τ -> more flips) {verdict} with the paper; "
               f"figure: {report.figure}")  # fmt: skip
    for note in report.notes:
        click.echo(f"bnnexport: note: {note}", err=True)


# Every option a sweep shares with `bnnexport train` comes from that command itself, so the two
# never drift apart (as in `bnnexport pipeline`); the ones below the sweep sets itself.
_OWN = ("gamma", "threshold", "optimizer", "out", "resume", "force", "recipe", "as_json")
sweep_command.params[3:3] = [p for p in train_command.params if p.name not in _OWN]
