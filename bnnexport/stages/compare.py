"""`compare(run_dirs, out) -> CompareReport`: training runs side by side, in one figure and one
table.

Runs that differ only in their seed form one *group* (e.g. `bnnexport sweep --seeds 3`): the
table gives the mean ± sample standard deviation over the group's runs (n - 1 in the
denominator, n in `runs`), and the figure draws the mean with error bars (test accuracy) or a
shaded ±1 std band (π_t), and says so. For each group:

- test accuracy over optimizer steps (`kind: "eval"` rows from `train --eval-every`, and the
  epoch rows), and π_t over steps over all binary weights (`mean_flip_rate`,
  `bnnexport.training.metrics`);
- the final test accuracy, the flips over the whole run (all binary layers), the training
  seconds (`metrics.training_seconds`, as train.json and sweep.json count them), π over the
  last epoch (`metrics.last_epoch_flip_rate`, as sweep.json), the model, the optimizer and its
  hyperparameters (config.json).

Each setting keeps one colour in every figure: the one `bnnexport sweep` gave it (recorded in
its sweep.json, found above the runs), else the first colour no other setting of the figure has.

OUT/compare.png, OUT/compare.json (the report) and OUT/compare.csv (the table) are written
through bnnexport's manifest, so OUT may be a folder of earlier comparisons but not a folder of
the user's own files.

Example:
    >>> from bnnexport.stages.compare import compare
    >>> report = compare(["runs/bop", "runs/latent"], out="runs/compare")  # doctest: +SKIP
    >>> [row.optimizer for row in report.rows]  # doctest: +SKIP
    ['bop', 'adam-latent']
    >>> mean_std([0.9, 0.92])  # the sample standard deviation: n - 1 in the denominator
    (0.91, 0.014142135624)
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnnexport.errors import DataError
from bnnexport.optim.composite import OPTIMIZERS, OptimizerEntry, all_hyperparameters
from bnnexport.run.directory import RunDir, lock_run
from bnnexport.run.files import require_run_directory, write_bytes_atomic
from bnnexport.run.records import read_jsonl
from bnnexport.stages.report import Report, save_figure_atomic
from bnnexport.training.metrics import (
    accuracy_curve,
    last_epoch_flip_rate,
    last_epoch_layer_flip_rates,
    mean_flip_rate,
    step_rows,
    training_seconds,
)

# config.json keys that say where and how a run was computed, not what was trained: runs that
# differ only in these (and the seed) are repetitions of one setting. (`precision` is part of
# the setting: bf16 and amp train otherwise than float32; the processes that shared a global
# batch are not: N processes train as one.)
NOT_THE_SETTING = ("seed", "out", "device", "num_workers", "log_every", "eval_every",
                   "metrics_csv", "data_dir", "recipe", "recipe_overrides", "world_size",
                   "batch_size_per_process", "binary_kernels")  # fmt: skip
# what every label shows (`label`): the model, the optimizer and the hyperparameters its
# registry entry declares (`composite.all_hyperparameters`); any other setting is added where
# the runs differ in it
LABELLED = ("model", "optimizer")
# settings config.json gained later, with the value of runs from before them
ADDED_SETTINGS = {"bn_eval": "recalibrate", "float_layers": "float32", "precision": "float32"}


# matplotlib's default colour cycle (tab10), a setting's colour when no sweep gave it one
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
STD_NOTE = "error bars and bands: ±1 sample standard deviation (n - 1) over the seeds"
# below this many seeds a spread says little: the figure and the report say so
FEW_SEEDS = 3
# a line style per curve beside its colour, so that more curves than colours stay apart
LINE_STYLES = ("-", "--", ":", "-.", (0, (8, 2)), (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)),
               (0, (3, 3, 1, 3)))  # fmt: skip


def seeds_note(groups: list[list[Any]]) -> str | None:
    """One line when a spread comes from fewer than FEW_SEEDS runs, else None."""
    counts = sorted({len(group) for group in groups if len(group) > 1})
    if not counts or counts[0] >= FEW_SEEDS:
        return None
    return (f"error bars from {counts[0]} seeds: fewer than {FEW_SEEDS} give a spread that "
            "says little (run more with --seeds)")  # fmt: skip


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1: n - 1 in the denominator; 0 for one
    value), rounded to 12 digits."""
    mean = sum(values) / len(values)
    spread = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return round(mean, 12), round(math.sqrt(spread), 12)


def setting(config: dict[str, Any]) -> dict[str, Any]:
    """What a run's config.json says was trained: less NOT_THE_SETTING, with the values runs
    from before a setting existed had (`ADDED_SETTINGS`)."""
    kept = {k: v for k, v in config.items() if k not in NOT_THE_SETTING}
    return {**ADDED_SETTINGS, **kept}


def setting_id(config: dict[str, Any]) -> str:
    """A short name for a run's setting (`setting`): the same for every seed of it, in a sweep
    and in a comparison."""
    return hashlib.sha256(json.dumps(setting(config), sort_keys=True).encode()).hexdigest()[:12]


def differing_settings(configs: list[dict[str, Any]]) -> list[str]:
    """The settings besides the labelled ones (model, optimizer, its hyperparameters) in
    which the runs differ, e.g. float_layers, batch_size, precision.

    Example:
        >>> differing_settings([{"batch_size": 50, "seed": 0}, {"batch_size": 100, "seed": 1}])
        ['batch_size']
    """
    settings = [setting(config) for config in configs]
    labelled = {*LABELLED, *all_hyperparameters()}
    keys = sorted({key for s in settings for key in s} - labelled)
    return [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1]


def optimizer_of(config: dict[str, Any]) -> OptimizerEntry:
    """The registry entry of a run's optimizer; Bop's for a run of one not registered here."""
    return OPTIMIZERS.get(config.get("optimizer", "bop"), OPTIMIZERS["bop"])


def hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """The optimizer's own settings from a run's config.json, those its registry entry
    declares: lr for adam-latent, γ, τ and lr for Bop (σ too for bop2)."""
    return {k: config[k] for k in optimizer_of(config).names if k in config}


@dataclass
class RunCurves:
    """One run read back from its directory."""

    run_dir: str
    config: dict[str, Any]
    test_accuracy: float
    flips: int
    seconds: float  # metrics.training_seconds
    last_flip_rate: float  # metrics.last_epoch_flip_rate
    layer_flip_rate: dict[str, float]  # the same per binary layer (last_epoch_layer_flip_rates)
    accuracy_steps: list[int]
    accuracy: list[float]
    flip_steps: list[int]
    flip_rate: list[float]


def read_run(run_dir: str | Path) -> RunCurves:
    """A finished (or interrupted) training run's numbers; DataError when it is not one."""
    run = RunDir(run_dir)
    try:
        config = json.loads(run.config.read_text())
        records = read_jsonl(run.metrics)
    except (OSError, ValueError) as error:
        raise DataError(
            f"{run_dir} is not a training run (config.json, metrics.jsonl): {error}"
        ) from None
    epochs = [r for r in records if r.get("kind") == "epoch"]
    if not epochs:
        raise DataError(f"{run_dir} has no finished epoch to compare")
    rows = step_rows(records)
    accuracy_steps, accuracy = accuracy_curve(records)
    return RunCurves(
        run_dir=str(run_dir),
        config=config,
        test_accuracy=float(epochs[-1]["test_accuracy"]),
        flips=sum(sum(r.get("flips", {}).values()) for r in rows),
        seconds=training_seconds(records),
        last_flip_rate=last_epoch_flip_rate(records),
        layer_flip_rate=last_epoch_layer_flip_rates(records),
        accuracy_steps=accuracy_steps,
        accuracy=accuracy,
        flip_steps=[int(r["step"]) for r in rows],
        flip_rate=[mean_flip_rate(r) for r in rows],
    )


@dataclass
class CompareRow:
    """One setting: its runs (one per seed) summarised."""

    label: str
    optimizer: str
    hyperparameters: dict[str, Any]
    model: str
    runs: list[str]
    seeds: list[int]
    test_accuracy: float  # mean over the runs
    test_accuracy_std: float
    flips: float
    flips_std: float
    seconds: float  # training seconds (metrics.training_seconds), mean
    seconds_std: float
    last_flip_rate: float  # π over the last epoch, all binary weights, mean
    last_flip_rate_std: float
    color: str = ""  # its colour in the figure (and in a sweep's, for the same setting)
    setting: str = ""  # setting_id
    # π over the last epoch per binary layer, mean and std over the runs
    layer_flip_rate: dict[str, float] = field(default_factory=dict)
    layer_flip_rate_std: dict[str, float] = field(default_factory=dict)
    # the other settings in which the compared runs differ (differing_settings): this row's
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompareReport(Report):
    """What `bnnexport compare` prints and writes to OUT/compare.json."""

    out: str
    rows: list[CompareRow]
    figure: str
    table: str
    notes: list[str] = field(default_factory=list)


def label(config: dict[str, Any]) -> str:
    """'mnist-bnn bop γ=0.001 τ=1e-06' / 'mnist-bnn adam-latent lr=0.001': the model, the
    optimizer and its settings (`unique_labels` adds the other settings runs differ in)."""
    symbols = {k: h.symbol for k, h in all_hyperparameters().items()}
    # those the entry labels (Adam's lr beside Bop is in the table, not every label)
    labelled = optimizer_of(config).labelled
    settings = {k: v for k, v in hyperparameters(config).items() if k in labelled}
    text = " ".join(f"{symbols[k]}={v:g}" if isinstance(v, float) else f"{symbols[k]}={v}"
                    for k, v in settings.items())  # fmt: skip
    model = str(config.get("model", "")).rpartition(":")[2]  # module:factory by its factory
    return f"{model} {config.get('optimizer', 'bop')} {text}".strip()


def group_runs(runs: list[RunCurves]) -> list[list[RunCurves]]:
    """Runs whose configurations differ only in NOT_THE_SETTING, in first-seen order."""
    groups: dict[str, list[RunCurves]] = {}
    for run in runs:
        groups.setdefault(setting_id(run.config), []).append(run)
    return list(groups.values())


def setting_colors(groups: list[list[RunCurves]], given: dict[str, str]) -> dict[int, str]:
    """Each group's colour: `given` {setting_id: colour} (a sweep's) unless an earlier group
    of the figure has that colour already, else the first palette colour no group has."""
    colors: dict[int, str] = {}
    for group in groups:  # a sweep's colours first, so no other setting takes them
        color = given.get(setting_id(group[0].config))
        if color is not None and color not in colors.values():
            colors[id(group[0])] = color
    for group in groups:
        if id(group[0]) not in colors:
            free = [c for c in PALETTE if c not in colors.values()]
            colors[id(group[0])] = free[0] if free else PALETTE[len(colors) % len(PALETTE)]
    return {id(group[0]): colors[id(group[0])] for group in groups}


def sweep_colors(run_dirs: list[str | Path]) -> dict[str, str]:
    """{setting_id: colour} from the sweep.json of every sweep the runs belong to (in the
    folder above a run, or above its seed's folder)."""
    found: dict[str, str] = {}
    folders = {Path(d).resolve().parent for d in run_dirs}
    for folder in sorted(folders | {f.parent for f in folders}):
        try:
            settings = json.loads((folder / "sweep.json").read_text())["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for setting in settings:
            if isinstance(setting, dict) and setting.get("setting") and setting.get("color"):
                found.setdefault(setting["setting"], setting["color"])
    return found


def layer_mean_std(group: list[RunCurves]) -> tuple[dict[str, float], dict[str, float]]:
    """Per binary layer, the mean and std over the group's runs of π over the last epoch."""
    layers = [layer for layer in group[0].layer_flip_rate if all(
        layer in r.layer_flip_rate for r in group)]  # fmt: skip
    stats = {layer: mean_std([r.layer_flip_rate[layer] for r in group]) for layer in layers}
    return {k: m for k, (m, _) in stats.items()}, {k: s for k, (_, s) in stats.items()}


def summarise(
    group: list[RunCurves], labels: dict[int, str], color: str = "", differing: list[str] = ()
) -> CompareRow:
    """One row: the group's runs summarised, with its values of the `differing` settings."""
    config = group[0].config
    acc = mean_std([r.test_accuracy for r in group])
    flips = mean_std([float(r.flips) for r in group])
    seconds = mean_std([r.seconds for r in group])
    last = mean_std([r.last_flip_rate for r in group])
    layers, layers_std = layer_mean_std(group)
    return CompareRow(
        label=labels[id(group[0])], optimizer=config.get("optimizer", "bop"),
        hyperparameters=hyperparameters(config), model=str(config.get("model", "")),
        runs=[r.run_dir for r in group], seeds=[int(r.config.get("seed", 0)) for r in group],
        test_accuracy=acc[0], test_accuracy_std=acc[1], flips=flips[0], flips_std=flips[1],
        seconds=seconds[0], seconds_std=seconds[1],
        last_flip_rate=last[0], last_flip_rate_std=last[1], color=color,
        setting=setting_id(config), layer_flip_rate=layers, layer_flip_rate_std=layers_std,
        settings={key: setting(config).get(key) for key in differing},
    )  # fmt: skip


def _value(value: Any) -> str:
    """A setting's value in a label: numbers in their shortest form, dicts as compact JSON."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def unique_labels(groups: list[list[RunCurves]]) -> dict[int, str]:
    """Each group's label: `label` and every other setting the groups differ in
    (`differing_settings`: 'float_layers=int8 batch_size=100'); groups that would still share
    one (they differ in nothing a label shows) get their first run's folder name added."""
    differing = differing_settings([g[0].config for g in groups])
    labels = {}
    for g in groups:
        shown = setting(g[0].config)
        extra = " ".join(f"{key}={_value(shown.get(key))}" for key in differing)
        labels[id(g[0])] = f"{label(g[0].config)} {extra}".strip()
    for g in groups:
        if sum(v == labels[id(g[0])] for v in labels.values()) > 1:
            labels[id(g[0])] += f" ({Path(g[0].run_dir).name})"
    return labels


def mean_curve(
    curves: list[tuple[list[int], list[float]]],
) -> tuple[list[int], list[float], list[float]]:
    """Mean and std at the steps every run of the group has."""
    common = sorted(set.intersection(*(set(steps) for steps, _ in curves)))
    values = [dict(zip(steps, ys, strict=True)) for steps, ys in curves]
    stats = [mean_std([v[s] for v in values]) for s in common]
    return common, [m for m, _ in stats], [s for _, s in stats]


def plot_compare(
    groups: list[list[RunCurves]],
    labels: dict[int, str],
    path: str | Path,
    colors: dict[int, str] | None = None,
) -> Path:
    """Test accuracy (error bars over seeds) and π_t over all binary weights (±1 std band)
    over optimizer steps, one curve per setting in its colour (`setting_colors`) and a line
    style of its own, the legend below the panels, in one figure that says what its error
    bars are (`STD_NOTE`) and when they come from fewer than FEW_SEEDS seeds."""
    from matplotlib.ticker import MaxNLocator

    from bnnexport.stages.report import pyplot

    plt = pyplot()
    colors = colors or setting_colors(groups, {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for index, group in enumerate(groups):
        style = {"color": colors[id(group[0])], "linestyle": LINE_STYLES[index % len(LINE_STYLES)]}
        name = labels[id(group[0])]
        name += f" (mean ± std of {len(group)} seeds)" if len(group) > 1 else ""
        draw_curves(left, right, group, style, name)
    left.set(xlabel="optimizer step", ylabel="test accuracy (top-1)", title="Test accuracy")
    right.set(xlabel="optimizer step", ylabel=PI_LABEL, title="Flip rate, all binary weights",
              ylim=(-9.5, 0.5))  # fmt: skip
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    rows = -(-len(groups) // 2)
    fig.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8,
               frameon=False)  # fmt: skip
    notes = [STD_NOTE] * any(len(g) > 1 for g in groups) + [n for n in [seeds_note(groups)] if n]
    if notes:
        fig.text(0.5, 0.005, "; ".join(notes), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 + 0.045 * rows, 1, 1))
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)


PI_LABEL = r"$\pi_t = \log(\mathrm{flips}/(\mathrm{weights} \cdot \mathrm{steps}) + e^{-9})$"


def draw_curves(accuracy: Any, flips: Any, group: list[RunCurves], style: dict, name: str) -> None:
    """One setting's curves: its mean test accuracy (error bars over its runs) on `accuracy`,
    its mean π_t (a ±1 std band) on `flips`."""
    steps, mean, std = mean_curve([(r.accuracy_steps, r.accuracy) for r in group])
    accuracy.errorbar(steps, mean, yerr=std if len(group) > 1 else None, marker="o",
                      markersize=3, capsize=3, label=name, **style)  # fmt: skip
    steps, mean, std = mean_curve([(r.flip_steps, r.flip_rate) for r in group])
    flips.plot(steps, mean, linewidth=1, label=name, **style)
    if len(group) > 1:
        low = [m - s for m, s in zip(mean, std, strict=True)]
        high = [m + s for m, s in zip(mean, std, strict=True)]
        flips.fill_between(steps, low, high, color=style["color"], alpha=0.2, linewidth=0)


def table_csv(rows: list[CompareRow]) -> bytes:
    """The table as CSV: one line per setting, hyperparameters and every other setting the
    runs differ in as columns, and π over the last epoch per layer (`last_flip_rate.LAYER`)."""
    keys = [k for k in all_hyperparameters() if any(k in r.hyperparameters for r in rows)]
    settings = [k for k in (rows[0].settings if rows else {}) if k not in keys]
    layers = list(dict.fromkeys(layer for r in rows for layer in r.layer_flip_rate))
    columns = ["label", "model", "optimizer", *keys, *settings, "runs", "test_accuracy",
               "test_accuracy_std", "flips", "flips_std", "seconds", "seconds_std",
               "last_flip_rate", "last_flip_rate_std",
               *(f"last_flip_rate.{layer}" for layer in layers),
               *(f"last_flip_rate_std.{layer}" for layer in layers)]  # fmt: skip
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        per_layer = {f"last_flip_rate.{k}": v for k, v in r.layer_flip_rate.items()}
        per_layer.update({f"last_flip_rate_std.{k}": v for k, v in r.layer_flip_rate_std.items()})
        values = {**{k: _value(v) for k, v in r.settings.items()}, **r.hyperparameters,
                  **r.__dict__, "runs": len(r.runs), **per_layer}  # fmt: skip
        writer.writerow([values.get(c, "") for c in columns])
    return text.getvalue().encode()


def compare(run_dirs: list[str | Path], out: str | Path) -> CompareReport:
    """Read every run (DataError naming one that is not a run, before anything is written),
    group repetitions, write OUT/compare.png, compare.json and compare.csv."""
    if not run_dirs:
        raise DataError("compare needs at least one run directory")
    runs = [read_run(d) for d in run_dirs]
    groups = group_runs(runs)
    labels = unique_labels(groups)
    colors = setting_colors(groups, sweep_colors(run_dirs))
    out = Path(out)
    with lock_run(out, create=True):
        require_run_directory(out)
        differing = differing_settings([g[0].config for g in groups])
        rows = [summarise(g, labels, colors[id(g[0])], differing) for g in groups]
        figure = plot_compare(groups, labels, out / "compare.png", colors)
        table = write_bytes_atomic(out / "compare.csv", table_csv(rows))
        notes = [n for n in [seeds_note(groups)] if n]
        report = CompareReport(out=str(out), rows=rows, figure=str(figure), table=str(table),
                               notes=notes)  # fmt: skip
        report.save(out / "compare.json")
    return report


def format_table(rows: list[CompareRow]) -> str:
    """The table as aligned text: value ± sample std where a setting has several runs."""

    def pm(value: float, std: float, n: int, digits: int) -> str:
        return f"{value:.{digits}f}" + (f" ± {std:.{digits}f}" if n > 1 else "")

    lines = [f"{'setting':<34} {'n':>2} {'test acc':>15} {'flips':>19} {'seconds':>13} "
             f"{'π last epoch':>13}"]  # fmt: skip
    for r in rows:
        n = len(r.runs)
        lines.append(
            f"{r.label:<34} {n:>2} {pm(r.test_accuracy, r.test_accuracy_std, n, 4):>15} "
            f"{pm(r.flips, r.flips_std, n, 0):>19} {pm(r.seconds, r.seconds_std, n, 1):>13} "
            f"{pm(r.last_flip_rate, r.last_flip_rate_std, n, 2):>13}"
        )
    return "\n".join(lines)
