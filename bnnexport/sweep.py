"""`sweep(base, gammas, thresholds) -> SweepReport`: the paper's γ/τ analysis (Fig. 2, §5.1).

One training run per (γ, τ) setting, in OUT/gamma=G,threshold=T, then OUT/sweep.png (test
accuracy per epoch and flip rate π_t over steps, one curve per setting) and OUT/sweep.json (the
table of final accuracies and flip rates). The flip rate of a setting is counted over all binary
weights: π = log(flips / (weights · steps) + e^-9), as in the paper's Eq. 6.

The paper's claim to check: a higher γ and a lower τ give more flips. `SweepReport.ordering`
says, for every pair of settings that differ in one of the two, whether the run agrees.

Example:
    >>> from bnnexport.sweep import sweep
    >>> from bnnexport.train import TrainConfig
    >>> report = sweep(TrainConfig(epochs=2), [1e-2, 1e-3], [1e-6, 0.0], out="runs/sweep")
    ...                                                                      # doctest: +SKIP
    >>> report.ordering["agrees"]                                            # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnnexport.errors import ConfigError
from bnnexport.reports import Report, save_figure_atomic
from bnnexport.runs import RunDir, load_checkpoint, lock_run, read_jsonl
from bnnexport.train import TrainConfig, train, validate_config


@dataclass
class SweepSetting:
    """One row of the sweep's table."""

    gamma: float
    threshold: float
    run_dir: str
    test_accuracy: float
    train_accuracy: float
    flip_rate: float  # π over the whole run, all binary weights
    last_epoch_flip_rate: float  # π over the last epoch
    seconds: float


@dataclass
class SweepReport(Report):
    """What `bnnexport sweep` prints and writes to OUT/sweep.json."""

    out: str
    model: str
    dataset: str
    optimizer: str
    epochs: int
    settings: list[SweepSetting]
    ordering: dict[str, Any]
    figure: str
    seconds: float
    notes: list[str] = field(default_factory=list)


def setting_dir(out: str | Path, gamma: float, threshold: float) -> Path:
    """OUT/gamma=G,threshold=T with numbers in their shortest form."""
    return Path(out) / f"gamma={gamma:g},threshold={threshold:g}"


def _pi(fraction: float) -> float:
    return math.log(fraction + math.exp(-9))


def _flip_curve(run: RunDir) -> tuple[list[int], list[float], float, float]:
    """(steps, π per logged interval, π over the run, π over the last epoch)."""
    state = load_checkpoint(run.checkpoint)["model"]
    records = read_jsonl(run.metrics)
    step_records = [r for r in records if r.get("kind") == "step"]
    sizes = {name: state[f"{name}.weight"].numel() for name in step_records[0]["flips"]}
    weights = sum(sizes.values())
    steps, rates, previous = [], [], 0
    flips_total, last_epoch = 0, max(r["epoch"] for r in step_records)
    last_flips, last_steps, last_start = 0, 0, None
    for record in step_records:
        flips = sum(record["flips"].values())
        interval = record["step"] - previous
        previous = record["step"]
        steps.append(record["step"])
        rates.append(_pi(flips / (weights * interval)))
        flips_total += flips
        if record["epoch"] == last_epoch:
            last_start = last_start if last_start is not None else record["step"] - interval
            last_flips += flips
            last_steps = record["step"] - last_start
    return (
        steps,
        rates,
        _pi(flips_total / (weights * max(previous, 1))),
        _pi(last_flips / (weights * max(last_steps, 1))),
    )


def flip_ordering(settings: list[SweepSetting]) -> dict[str, Any]:
    """Check the paper's claim pairwise: more flips for a higher γ (same τ) and for a lower τ
    (same γ). Returns the comparisons and whether all agree."""
    comparisons = []
    for a in settings:
        for b in settings:
            if a.threshold == b.threshold and a.gamma > b.gamma:
                kind = "higher gamma"
            elif a.gamma == b.gamma and a.threshold < b.threshold:
                kind = "lower threshold"
            else:
                continue
            comparisons.append(
                {
                    "more_flips_expected": {"gamma": a.gamma, "threshold": a.threshold},
                    "than": {"gamma": b.gamma, "threshold": b.threshold},
                    "because": kind,
                    "flip_rates": [a.flip_rate, b.flip_rate],
                    "agrees": a.flip_rate > b.flip_rate,
                }
            )
    return {"agrees": all(c["agrees"] for c in comparisons), "comparisons": comparisons}


def plot_sweep(settings: list[SweepSetting], path: str | Path) -> Path:
    """Test accuracy per epoch and π_t over steps, one curve per setting, in one figure."""
    from bnnexport.reports import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for setting in settings:
        run = RunDir(setting.run_dir)
        label = f"γ={setting.gamma:g}, τ={setting.threshold:g}"
        epochs = [r for r in read_jsonl(run.metrics) if r.get("kind") == "epoch"]
        left.plot([r["epoch"] for r in epochs], [r["test_accuracy"] for r in epochs],
                  marker="o", label=label)  # fmt: skip
        steps, rates, _, _ = _flip_curve(run)
        right.plot(steps, rates, label=label, linewidth=1)
    left.set(xlabel="epoch", ylabel="test accuracy", title="Test accuracy")
    right.set(xlabel="step", ylabel="π_t = log(flips / weights + e^-9)",
              title="Flip rate (all binary weights)")  # fmt: skip
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)


def sweep(
    base: TrainConfig,
    gammas: list[float],
    thresholds: list[float],
    out: str | Path,
    force: bool = False,
    progress: bool = False,
) -> SweepReport:
    """Train `base` once per (γ, τ) into OUT/gamma=G,threshold=T; write sweep.png, sweep.json.

    Every run keeps base's model, data, optimizer, epochs, batch size and seed, so settings
    differ only in γ and τ. Raises what `train` raises (e.g. CheckpointError when a setting's
    directory already holds a run and `force` is off).
    """
    if not gammas or not thresholds:
        raise ConfigError("a sweep needs at least one gamma and one threshold")
    for option, values in (("--gamma", gammas), ("--threshold", thresholds)):
        repeated = sorted({float(v) for v in values if [float(w) for w in values].count(v) > 1})
        if repeated:  # 1e-3 and 0.001 are one setting: two runs would share a directory
            raise ConfigError(f"{option} lists {', '.join(f'{v:g}' for v in repeated)} twice")
    configs = [
        dataclasses.replace(base, gamma=float(gamma), threshold=float(threshold),
                            out=str(setting_dir(out, gamma, threshold)))
        for gamma in gammas for threshold in thresholds
    ]  # fmt: skip
    for config in configs:  # every setting is checked before the first one trains
        validate_config(config)
    with lock_run(out, create=True):
        return _sweep(base, configs, Path(out), force, progress)


def _sweep(
    base: TrainConfig, configs: list[TrainConfig], out: Path, force: bool, progress: bool
) -> SweepReport:
    start = time.perf_counter()
    settings = []
    for config in configs:
        gamma, threshold, directory = config.gamma, config.threshold, Path(config.out)
        report = train(config, force=force, progress=progress)
        _, _, pi_run, pi_last = _flip_curve(RunDir(directory))
        settings.append(
            SweepSetting(
                gamma=float(gamma), threshold=float(threshold), run_dir=str(directory),
                test_accuracy=report.test_accuracy, train_accuracy=report.train_accuracy,
                flip_rate=pi_run, last_epoch_flip_rate=pi_last, seconds=report.seconds,
            )
        )  # fmt: skip
    figure = plot_sweep(settings, out / "sweep.png")
    report = SweepReport(
        out=str(out),
        model=base.model,
        dataset=base.dataset,
        optimizer=base.optimizer,
        epochs=int(base.epochs or 0),
        settings=settings,
        ordering=flip_ordering(settings),
        figure=str(figure),
        seconds=time.perf_counter() - start,
    )
    report.save(out / "sweep.json")
    return report
