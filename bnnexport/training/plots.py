"""Training plots: accuracy curves, and flip rate π_t per binary layer as in the paper's Fig. 2.

Matplotlib runs with the Agg backend (no display needed).

Example:
    >>> from bnnexport.training.plots import plot_training
    >>> plot_training("runs/mnist-bnn")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

from bnnexport.run.directory import RunDir
from bnnexport.run.records import read_jsonl
from bnnexport.run.reports import pyplot, save_figure_atomic


def plot_training(run: RunDir | str | os.PathLike) -> list[Path]:
    """Write accuracy.png and flip_rate.png from the run's metrics.jsonl; returns the paths."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    records = read_jsonl(run.metrics)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    steps = [r for r in records if r.get("kind") == "step"]
    plt = pyplot()
    written = []
    if epochs:
        fig, ax = plt.subplots(figsize=(6, 4))
        x = [r["epoch"] for r in epochs]
        ax.plot(x, [r["train_accuracy"] for r in epochs], marker="o", label="train")
        ax.plot(x, [r["test_accuracy"] for r in epochs], marker="o", label="test")
        ax.set_xlabel("epoch")
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
