"""`sweep(base, gammas, thresholds) -> SweepReport`: the paper's γ/τ analysis (Fig. 2, Section 5.1).

One training run per (γ, τ) setting, in OUT/gamma=G,threshold=T, then OUT/sweep.png (test
accuracy and flip rate π_t over steps, a column per hyperparameter the sweep varies, as the
paper's Fig. 2: `bnnexport.stages.plots.plot_sweep`) and OUT/sweep.json (the table of final
accuracies and flip rates, over all binary weights and per layer, and each setting's colour,
which `bnnexport compare` of its runs keeps). The flip rate of a setting is counted over all
binary weights: π = log(flips / (weights · steps) + e^-9), as in the paper's Eq. 6, over the
whole run and over the last epoch (`metrics.last_epoch_flip_rate`, as compare and train.json);
`seconds` is each run's training time (`metrics.training_seconds`), `wall_seconds` the sweep's.

`optimizers` adds other optimizers to compare with: the latent-weight baseline
(`adam-latent`, which has no γ or τ) runs once, in OUT/optimizer=adam-latent, and with more
than one optimizer every Bop setting's folder starts with `optimizer=NAME,`. `seeds=N` trains
every setting N times (seeds base.seed ... base.seed+N-1, in SETTING/seed=S): the table gives
mean ± sample standard deviation (n - 1) and the figure error bars (with 2 seeds, the figure
and the report's `notes` say the spread says little).

The paper's claim to check: a higher γ and a lower τ give more flips. `SweepReport.ordering`
says, for every pair of settings of one optimizer that differ in one of the two, whether the
runs agree (on the mean over seeds).

Example:
    >>> from bnnexport.stages.sweep import sweep
    >>> from bnnexport.training.config import TrainConfig
    >>> report = sweep(TrainConfig(epochs=2), [1e-2, 1e-3], [1e-6, 0.0], out="runs/sweep",
    ...                optimizers=["bop", "adam-latent"], seeds=3)   # doctest: +SKIP
    >>> report.ordering["agrees"]                                            # doctest: +SKIP
    True
    >>> setting_dir("runs/sweep", 1e-3, 1e-6)
    PosixPath('runs/sweep/gamma=0.001,threshold=1e-06')
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnnexport.errors import ConfigError
from bnnexport.optim.composite import OPTIMIZERS
from bnnexport.run.checkpoint import open_run_model
from bnnexport.run.directory import RunDir, lock_run
from bnnexport.run.records import read_jsonl
from bnnexport.stages.report import Report
from bnnexport.stages.train import train
from bnnexport.training.config import TrainConfig, validate_config
from bnnexport.training.metrics import pi, step_rows


@dataclass
class SweepSetting:
    """One row of the sweep's table (means over its seeds; `*_std` their spread)."""

    gamma: float | None  # None for adam-latent, which has no γ or τ
    threshold: float | None
    run_dir: str  # the first seed's run
    test_accuracy: float
    train_accuracy: float
    flip_rate: float  # π over the whole run, all binary weights
    last_epoch_flip_rate: float  # π over the last epoch (metrics.last_epoch_flip_rate)
    seconds: float  # training seconds per run (metrics.training_seconds), mean over seeds
    optimizer: str = "bop"
    run_dirs: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    test_accuracy_std: float = 0.0  # sample standard deviations (n - 1) over the seeds
    flip_rate_std: float = 0.0
    last_epoch_flip_rate_std: float = 0.0
    seconds_std: float = 0.0
    model: str = ""
    color: str = ""  # its colour in sweep.png's first column, which compare gives it too
    setting: str = ""  # compare.setting_id: how compare finds this setting's colour
    # π over the last epoch per binary layer (as train.json's flip_rate), mean and std
    layer_flip_rate: dict[str, float] = field(default_factory=dict)
    layer_flip_rate_std: dict[str, float] = field(default_factory=dict)


@dataclass
class SweepReport(Report):
    """What `bnnexport sweep` prints and writes to OUT/sweep.json."""

    out: str
    model: str
    dataset: str
    optimizer: str  # the optimizers, comma-separated
    epochs: int
    settings: list[SweepSetting]
    ordering: dict[str, Any]
    figure: str
    wall_seconds: float  # the whole sweep, wall clock (each setting's `seconds`: its training)
    notes: list[str] = field(default_factory=list)
    seeds: int = 1


def on_grid(optimizer: str) -> bool:
    """Whether a sweep runs `optimizer` over its (γ, τ) grid: its registry entry declares
    both; one that does not (adam-latent) runs once, with the base's other settings.

    Example:
        >>> on_grid("bop2"), on_grid("adam-latent")
        (True, False)
    """
    return {"gamma", "threshold"} <= set(OPTIMIZERS[optimizer].names)


def setting_dir(out: str | Path, gamma: float, threshold: float) -> Path:
    """OUT/gamma=G,threshold=T with numbers in their shortest form."""
    return Path(out) / f"gamma={gamma:g},threshold={threshold:g}"


def _run_flip_rate(run: RunDir) -> float:
    """π over the whole run, all binary weights: every flip over weights x steps."""
    weights = open_run_model(run.root).kernels.parameters  # every binary weight of the record
    rows = step_rows(read_jsonl(run.metrics))
    flips = sum(sum(r["flips"].values()) for r in rows)
    return pi(flips / (weights * max(sum(int(r["steps"]) for r in rows), 1)))


def flip_ordering(settings: list[SweepSetting]) -> dict[str, Any]:
    """Check the paper's claim pairwise: more flips for a higher γ (same τ) and for a lower τ
    (same γ). Returns the comparisons and whether all agree."""
    comparisons = []
    bop = [s for s in settings if s.gamma is not None and s.threshold is not None]
    for a in bop:
        for b in bop:
            if a.optimizer != b.optimizer:
                continue
            if a.threshold == b.threshold and a.gamma > b.gamma:  # type: ignore[operator]
                kind = "higher gamma"
            elif a.gamma == b.gamma and a.threshold < b.threshold:  # type: ignore[operator]
                kind = "lower threshold"
            else:
                continue
            comparisons.append(
                {
                    "optimizer": a.optimizer,
                    "more_flips_expected": {"gamma": a.gamma, "threshold": a.threshold},
                    "than": {"gamma": b.gamma, "threshold": b.threshold},
                    "because": kind,
                    "flip_rates": [a.flip_rate, b.flip_rate],
                    "agrees": a.flip_rate > b.flip_rate,
                }
            )
    return {"agrees": all(c["agrees"] for c in comparisons), "comparisons": comparisons}


def sweep(
    base: TrainConfig,
    gammas: list[float],
    thresholds: list[float],
    out: str | Path,
    force: bool = False,
    progress: bool = False,
    optimizers: list[str] | None = None,
    seeds: int = 1,
) -> SweepReport:
    """Train `base` once per (optimizer, γ, τ, seed); write OUT/sweep.png and OUT/sweep.json.

    Every run keeps base's model, data, epochs, batch size and lr, so Bop settings differ
    only in γ and τ (and the seed). Every setting is checked before the first one trains.
    Raises what `train` raises (e.g. CheckpointError when a setting's directory already holds
    a run and `force` is off).
    """
    optimizers = list(optimizers or [base.optimizer])
    if not gammas or not thresholds:
        raise ConfigError("a sweep needs at least one gamma and one threshold")
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be at least 1")
    unknown = [o for o in optimizers if o not in OPTIMIZERS]
    if unknown or len(set(optimizers)) != len(optimizers):
        raise ConfigError(f"--optimizer {','.join(optimizers)}: each of {', '.join(OPTIMIZERS)}, "
                          "at most once")  # fmt: skip
    for option, values in (("--gamma", gammas), ("--threshold", thresholds)):
        repeated = sorted({float(v) for v in values if [float(w) for w in values].count(v) > 1})
        if repeated:  # 1e-3 and 0.001 are one setting: two runs would share a directory
            raise ConfigError(f"{option} lists {', '.join(f'{v:g}' for v in repeated)} twice")
    plan = plan_runs(base, gammas, thresholds, Path(out), optimizers, seeds)
    for configs in plan.values():  # every setting is checked before the first one trains
        for config in configs:
            validate_config(config)
    with lock_run(out, create=True):
        return _sweep(base, plan, Path(out), force, progress, optimizers, seeds)


def plan_runs(
    base: TrainConfig,
    gammas: list[float],
    thresholds: list[float],
    out: Path,
    optimizers: list[str],
    seeds: int,
) -> dict[tuple[str, float | None, float | None], list[TrainConfig]]:
    """{(optimizer, γ, τ): one config per seed}; an optimizer without γ or τ (adam-latent)
    has one setting (γ = τ = None)."""
    plan: dict[tuple[str, float | None, float | None], list[TrainConfig]] = {}
    for optimizer in optimizers:
        prefix = f"optimizer={optimizer}" if len(optimizers) > 1 else ""
        if not on_grid(optimizer):
            grid: list[tuple[float | None, float | None, Path]] = [
                (None, None, out / f"optimizer={optimizer}")
            ]
        else:
            grid = [
                (float(g), float(t), setting_dir(out, g, t)) for g in gammas for t in thresholds
            ]
            if prefix:
                grid = [(g, t, out / f"{prefix},{d.name}") for g, t, d in grid]
        for gamma, threshold, directory in grid:
            plan[(optimizer, gamma, threshold)] = [
                dataclasses.replace(
                    base, optimizer=optimizer, seed=base.seed + i,
                    gamma=base.gamma if gamma is None else gamma,
                    threshold=base.threshold if threshold is None else threshold,
                    out=str(directory / f"seed={base.seed + i}" if seeds > 1 else directory),
                )
                for i in range(seeds)
            ]  # fmt: skip
    return plan


def _summary(key: tuple[str, float | None, float | None], configs: list[TrainConfig],
             reports: list, curves: list) -> SweepSetting:  # fmt: skip
    """One setting's row from its runs (one per seed): means and sample stds."""
    from bnnexport.stages.compare import layer_mean_std, mean_std, setting_id

    optimizer, gamma, threshold = key
    layers, layers_std = layer_mean_std(curves)
    accuracy = mean_std([r.test_accuracy for r in reports])
    pi_run = mean_std([_run_flip_rate(RunDir(config.out)) for config in configs])
    pi_last = mean_std([c.last_flip_rate for c in curves])
    seconds = mean_std([c.seconds for c in curves])
    return SweepSetting(
        gamma=gamma, threshold=threshold, run_dir=configs[0].out,
        test_accuracy=accuracy[0],
        train_accuracy=mean_std([r.train_accuracy for r in reports])[0],
        flip_rate=pi_run[0], last_epoch_flip_rate=pi_last[0],
        seconds=seconds[0], seconds_std=seconds[1], optimizer=optimizer,
        run_dirs=[c.out for c in configs], seeds=[c.seed for c in configs],
        test_accuracy_std=accuracy[1], flip_rate_std=pi_run[1],
        last_epoch_flip_rate_std=pi_last[1], model=configs[0].model,
        setting=setting_id(curves[0].config), layer_flip_rate=layers,
        layer_flip_rate_std=layers_std,
    )  # fmt: skip


def _sweep(
    base: TrainConfig,
    plan: dict[tuple[str, float | None, float | None], list[TrainConfig]],
    out: Path,
    force: bool,
    progress: bool,
    optimizers: list[str],
    seeds: int,
) -> SweepReport:
    from bnnexport.stages.compare import read_run, seeds_note
    from bnnexport.stages.plots import plot_sweep

    start = time.perf_counter()
    settings, groups = [], []
    for key, configs in plan.items():
        reports = [train(config, force=force, progress=progress) for config in configs]
        curves = [read_run(config.out) for config in configs]
        groups.append(curves)
        settings.append(_summary(key, configs, reports, curves))
    figure = out / "sweep.png"
    colors = plot_sweep(groups, list(plan), figure)  # recorded for compare
    for setting, group in zip(settings, groups, strict=True):
        setting.color = colors[id(group[0])]
    report = SweepReport(
        out=str(out),
        model=base.model,
        dataset=base.dataset,
        optimizer=",".join(optimizers),
        epochs=int(base.epochs or 0),
        settings=settings,
        ordering=flip_ordering(settings),
        figure=str(figure),
        wall_seconds=time.perf_counter() - start,
        seeds=seeds,
        notes=[n for n in [seeds_note(groups)] if n],
    )
    report.save(out / "sweep.json")
    return report
