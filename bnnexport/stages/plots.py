"""Training plots: accuracy curves, flip rate π_t per binary layer as in the paper's Fig. 2,
and a sweep's figure: one column per hyperparameter it varies, as the paper's Fig. 2 has.

Matplotlib runs with the Agg backend (no display needed).

Example:
    >>> from bnnexport.stages.plots import plot_training
    >>> plot_training("runs/mnist-bnn")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bnnexport.run.directory import RunDir
from bnnexport.run.records import read_jsonl
from bnnexport.stages.report import pyplot, save_figure_atomic


def plot_training(run: RunDir | str | os.PathLike) -> list[Path]:
    """Write accuracy.png and flip_rate.png from the run's metrics.jsonl; returns the paths."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    records = read_jsonl(run.metrics)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    steps = [r for r in records if r.get("kind") == "step"]
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    written = []
    if epochs:
        fig, ax = plt.subplots(figsize=(6, 4))
        x = [r["epoch"] for r in epochs]
        ax.plot(x, [r["train_accuracy"] for r in epochs], marker="o", label="train")
        ax.plot(x, [r["test_accuracy"] for r in epochs], marker="o", label="test")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
        ax.set_ylabel("top-1 accuracy")
        ax.set_title("Accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        save_figure_atomic(fig, run.accuracy_plot, dpi=100)
        plt.close(fig)
        written.append(run.accuracy_plot)
    if steps and steps[0].get("flip_rate"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for layer in steps[0]["flip_rate"]:
            ax.plot(
                [r["step"] for r in steps],
                [r["flip_rate"].get(layer) for r in steps],
                label=layer,
                linewidth=1,
            )
        ax.set_xlabel("step")
        ax.set_ylabel(r"$\pi_t = \log(\mathrm{flips}/\mathrm{total} + e^{-9})$")
        ax.set_ylim(-9.5, 0.5)
        ax.set_title("Flip rate per binary layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        save_figure_atomic(fig, run.flip_rate_plot, dpi=100)
        plt.close(fig)
        written.append(run.flip_rate_plot)
    return written


# a sweep setting: (optimizer, γ, τ) with γ = τ = None for adam-latent, which has neither
SweepKey = tuple[str, float | None, float | None]
NAMES = {"gamma": "γ", "threshold": "τ"}


def varied(keys: list[SweepKey]) -> list[str]:
    """The hyperparameters a sweep varies ("gamma", "threshold"), each one a figure column;
    one column ("gamma") when it varies neither.

    Example:
        >>> varied([("bop", 1e-3, 0.0), ("bop", 1e-4, 0.0), ("adam-latent", None, None)])
        ['gamma']
    """
    bop = [k for k in keys if k[1] is not None]
    names = [name for i, name in ((1, "gamma"), (2, "threshold")) if len({k[i] for k in bop}) > 1]
    return names or ["gamma"]


def plot_sweep(groups: list[list[Any]], keys: list[SweepKey], path: str | Path) -> dict[int, str]:
    """OUT/sweep.png: per varied hyperparameter a column of two panels, test accuracy and π_t
    over steps. In a column a curve's colour is the value of that hyperparameter (a sequential
    map, low to high) and its line style the other's (and the optimizer's), so ten settings
    stay apart; adam-latent is black. Legends sit below the panels; error bars are ±1 sample
    std over seeds, said in the figure, with a warning under FEW_SEEDS seeds. Returns each
    group's colour in the first column (what sweep.json records for compare)."""
    from matplotlib.colors import to_hex
    from matplotlib.ticker import MaxNLocator

    from bnnexport.stages.compare import PI_LABEL, STD_NOTE, draw_curves, seeds_note
    from bnnexport.stages.report import pyplot

    plt, columns = pyplot(), varied(keys)
    fig, axes = plt.subplots(2, len(columns), figsize=(6.5 * len(columns), 8), squeeze=False)
    first: dict[int, str] = {}
    for column, name in enumerate(columns):
        styles = _sweep_styles(keys, name, plt)
        for group, key in zip(groups, keys, strict=True):
            style, label = styles[key]
            draw_curves(axes[0][column], axes[1][column], group, style, label)
            if column == 0:
                first[id(group[0])] = to_hex(style["color"])
        other = NAMES["threshold" if name == "gamma" else "gamma"]
        axes[0][column].set(title=f"{NAMES[name]} varies (colour); {other}: line style",
                            xlabel="optimizer step", ylabel="test accuracy (top-1)")  # fmt: skip
        axes[1][column].set(xlabel="optimizer step", ylabel=PI_LABEL, ylim=(-9.5, 0.5))
        axes[1][column].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                               fontsize=8, frameon=False)  # fmt: skip
        for ax in axes[:, column]:
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    notes = [STD_NOTE] * any(len(g) > 1 for g in groups) + [n for n in [seeds_note(groups)] if n]
    if notes:
        fig.text(0.5, 0.005, "; ".join(notes), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return first


def _sweep_styles(keys: list[SweepKey], name: str, plt: Any) -> dict[SweepKey, tuple[dict, str]]:
    """{setting: (line style, legend label)} for the column of hyperparameter `name`."""
    from bnnexport.stages.compare import LINE_STYLES

    index = 1 if name == "gamma" else 2
    values = sorted({k[index] for k in keys if k[index] is not None})
    others = sorted({(k[0], k[3 - index]) for k in keys if k[index] is not None}, key=str)
    colormap = plt.get_cmap("viridis")
    styles = {}
    for key in keys:
        if key[index] is None:  # adam-latent
            styles[key] = ({"color": "black", "linestyle": "-"}, key[0])
            continue
        shade = (
            values.index(key[index]) / max(len(values) - 1, 1) * 0.85
        )  # viridis' yellow end is faint
        style = {
            "color": colormap(shade),
            "linestyle": LINE_STYLES[others.index((key[0], key[3 - index])) % len(LINE_STYLES)],
        }
        other = "threshold" if name == "gamma" else "gamma"
        label = f"{key[0]} {NAMES[name]}={key[index]:g} {NAMES[other]}={key[3 - index]:g}"
        styles[key] = (style, label)
    return styles
