"""A run's metrics.jsonl read back: flip rates, curves, and exports to CSV and TensorBoard.

Each `{"kind": "step"}` row covers `steps` optimizer steps (`train --log-every`; the last row
of an epoch may cover fewer) and holds, per binary layer, the flips summed over those steps
and π_t, the paper's flip rate (Eq. 6) *per step*:

    π_t = log(flips / (weights · steps) + e^-9)          (-9: no flip at all)

so rows logged every 1 or every 50 steps give comparable curves. `mean_flip_rate` is the same
over all binary weights together. `{"kind": "epoch"}` rows hold the epoch's accuracies and
its π (per layer and `mean_flip_rate`): the mean per-step flip fraction over the epoch, in
the same log form, and top-5 beside top-1 (`train_top5_accuracy`, `test_top5_accuracy`).
`{"kind": "eval"}` rows (`train --eval-every N`) hold a test accuracy, top-1 and top-5.

Example:
    >>> rows = [{"kind": "step", "step": 4, "epoch": 1, "steps": 4, "flips": {"fc": 8},
    ...          "flip_rate": {"fc": -3.906}},
    ...         {"kind": "epoch", "step": 4, "epoch": 1, "test_accuracy": 0.5}]
    >>> print(metrics_csv(rows).decode().splitlines()[0])
    kind,step,epoch,steps,test_accuracy,flips.fc,flip_rate.fc
    >>> round(pi(8 / (100 * 4)), 3)  # 8 flips of 100 weights over 4 steps
    -3.906
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bnnexport.run.files import write_bytes_atomic

TENSORBOARD_FILE = "events.out.tfevents.bnnexport"  # TensorBoard reads any *tfevents* file


def pi(fraction: float) -> float:
    """The paper's π = log(fraction + e^-9) of a per-step flip fraction."""
    return math.log(fraction + math.exp(-9))


def step_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step rows, each with `steps` (rows of runs from before the field: the step
    difference to the previous row)."""
    rows, previous = [], 0
    for record in records:
        if record.get("kind") != "step":
            continue
        row = dict(record)
        row.setdefault("steps", max(1, record["step"] - previous))
        previous = record["step"]
        rows.append(row)
    return rows


def mean_flip_rate(row: dict[str, Any]) -> float:
    """A row's π over all binary weights; for rows from before `mean_flip_rate`, the mean of
    its layers' π."""
    if "mean_flip_rate" in row:
        return float(row["mean_flip_rate"])
    rates = list(row.get("flip_rate", {}).values())
    return sum(rates) / len(rates) if rates else -9.0


def training_seconds(records: Iterable[dict[str, Any]]) -> float:
    """A run's training time: the sum of its epoch rows' `seconds`, each the time of that
    epoch's optimizer steps (evaluation, checkpoints and plots excluded), over every epoch a
    resumed run kept too. What train.json, sweep.json and compare call `seconds`."""
    return sum(float(r.get("seconds", 0.0)) for r in records if r.get("kind") == "epoch")


def last_epoch_flip_rate(records: Iterable[dict[str, Any]]) -> float:
    """π over the run's last epoch, all binary weights together: its per-step flip fraction
    in the paper's log form, the last epoch row's `mean_flip_rate`; for runs from before
    epoch rows held it, computed from that epoch's step rows. What train.json, sweep.json and
    compare call π (last epoch). -9.0 (no flip) for a run with no step row."""
    records = list(records)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    if epochs and "mean_flip_rate" in epochs[-1]:
        return float(epochs[-1]["mean_flip_rate"])
    rows = step_rows(records)
    if not rows:
        return -9.0
    last = [r for r in rows if r["epoch"] == rows[-1]["epoch"]]
    steps = sum(int(r["steps"]) for r in last)
    # π is log(fraction + e^-9): undo it per row to add the flips up (weights cancel out)
    fractions = [(math.exp(mean_flip_rate(r)) - math.exp(-9)) * int(r["steps"]) for r in last]
    return pi(max(sum(fractions), 0.0) / max(steps, 1))


def last_epoch_layer_flip_rates(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """π per binary layer over the run's last epoch (what train.json calls `flip_rate`): the
    last epoch row's `flip_rate`; for runs from before epoch rows held it, computed from that
    epoch's step rows. {} for a run with no step row."""
    records = list(records)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    if epochs and "flip_rate" in epochs[-1]:
        return {layer: float(rate) for layer, rate in epochs[-1]["flip_rate"].items()}
    rows = step_rows(records)
    last = [r for r in rows if r["epoch"] == rows[-1]["epoch"]] if rows else []
    steps = max(sum(int(r["steps"]) for r in last), 1)
    rates: dict[str, float] = {}
    for layer in last[-1].get("flip_rate", {}) if last else {}:
        fractions = [(math.exp(r["flip_rate"][layer]) - math.exp(-9)) * int(r["steps"])
                     for r in last if layer in r.get("flip_rate", {})]  # fmt: skip
        rates[layer] = pi(max(sum(fractions), 0.0) / steps)
    return rates


def accuracy_curve(records: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, test accuracy): the eval rows (`--eval-every`) and the epoch rows, by step."""
    points = {
        int(r["step"]): float(r["test_accuracy"])
        for r in records
        if r.get("kind") in ("eval", "epoch") and r.get("test_accuracy") is not None
    }
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        elif not isinstance(value, list):
            flat[key] = value
    return flat


def metrics_csv(records: Iterable[dict[str, Any]]) -> bytes:
    """Every step, epoch and eval row as one CSV table; per-layer values become columns
    `flips.LAYER`, `flip_rate.LAYER`; a row lacking a column leaves it empty."""
    rows = [_flat(r) for r in records if r.get("kind") in ("step", "epoch", "eval")]
    first = ["kind", "step", "epoch", "steps"]
    columns = [c for c in first if any(c in r for r in rows)]
    for row in rows:
        columns += [c for c in row if c not in columns and "." not in c]
    for row in rows:
        columns += [c for c in row if c not in columns]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


# what train says, once, when it cannot write TensorBoard scalars (never silently)
NO_TENSORBOARD = ("the tensorboard package is missing (a dependency of bnnexport: pip install "
                  "tensorboard): this run writes no TensorBoard scalars")  # fmt: skip


def tensorboard_available() -> bool:
    """Whether the `tensorboard` package (a dependency; an install with --no-deps may lack it)
    is installed; torch's SummaryWriter needs it."""
    return importlib.util.find_spec("tensorboard") is not None


def tensorboard_events(records: Iterable[dict[str, Any]]) -> bytes:
    """The rows as TensorBoard scalars (one event file's bytes), by optimizer step: loss,
    top-1 and top-5 accuracy, flips and π_t per layer and over all weights, hyperparameters;
    train and test accuracy (top-1 and top-5)."""
    from bnnexport.converters.runtimes import tf

    # torch's writer imports TensorFlow when it is installed (it is: the converter's), whose
    # native start-up lines would land on stderr beside train's own lines; `tf` imports it
    # with them discarded
    tf()
    from torch.utils.tensorboard import SummaryWriter

    records = list(records)
    with tempfile.TemporaryDirectory() as folder:
        writer = SummaryWriter(log_dir=folder)
        for row in step_rows(records):
            step = int(row["step"])
            for key in ("loss", "accuracy", "top5_accuracy"):
                if key in row:
                    writer.add_scalar(f"train/{key}", row[key], step)
            for layer, rate in row.get("flip_rate", {}).items():
                writer.add_scalar(f"flip_rate/{layer}", rate, step)
            writer.add_scalar("flip_rate/all", mean_flip_rate(row), step)
            # the flips themselves, summed over the row's steps (π_t is their per-step rate)
            for layer, flips in row.get("flips", {}).items():
                writer.add_scalar(f"flips/{layer}", flips, step)
            if "flips" in row:
                writer.add_scalar("flips/all", sum(row["flips"].values()), step)
            for key, value in row.items():
                if "." in key and isinstance(value, (int, float)):  # 'bop.gamma', 'adam.lr'
                    writer.add_scalar(f"hyperparameters/{key}", value, step)
        for row in records:
            _epoch_scalars(writer, row)
        writer.close()
        (event_file,) = Path(folder).glob("*tfevents*")
        return event_file.read_bytes()


def _epoch_scalars(writer: Any, row: dict[str, Any]) -> None:
    """An epoch or eval row's scalars: train loss and accuracies, test accuracies (top-5 in
    rows from runs that logged it)."""
    step = row.get("step")
    if row.get("kind") == "epoch":
        for key in ("train_accuracy", "train_loss", "train_top5_accuracy"):
            if row.get(key) is not None:
                writer.add_scalar(f"epoch/{key}", row[key], step)
    if row.get("kind") in ("epoch", "eval"):
        for key, tag in (("test_accuracy", "test/accuracy"), ("test_top5_accuracy", "test/top5")):
            if row.get(key) is not None:
                writer.add_scalar(tag, row[key], step)


def write_tensorboard(run_dir: str | Path, records: Iterable[dict[str, Any]]) -> Path | None:
    """RUN_DIR/events.out.tfevents.bnnexport from the rows (rewritten whole, so a resumed run
    holds no duplicate points), or None when tensorboard is not installed (train says so
    once, `NO_TENSORBOARD`).
    `tensorboard --logdir runs/` then shows every run."""
    if not tensorboard_available():
        return None
    return write_bytes_atomic(Path(run_dir) / TENSORBOARD_FILE, tensorboard_events(records))
