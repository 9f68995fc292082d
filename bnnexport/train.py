"""`train(config) -> TrainReport`: train a BNN with Bop (or the latent Adam baseline).

Writes into the run directory: `checkpoint.pt` (atomically, every epoch), `config.json`,
`metrics.jsonl` (step and epoch records: loss, accuracy, flips and π_t per binary layer),
`train.json`, and the plots `accuracy.png` and `flip_rate.png`.

Example:
    >>> from bnnexport.train import TrainConfig, train
    >>> report = train(TrainConfig(epochs=1, out="runs/quick"))  # doctest: +SKIP
    >>> report.test_accuracy  # doctest: +SKIP
    0.93
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from bnnexport.datasets import load_dataset
from bnnexport.errors import CheckpointError, DataError
from bnnexport.layers import set_latent
from bnnexport.models import create_model
from bnnexport.optimizers import OPTIMIZERS, CaseOptimizer, FlipCounter, flip_rate
from bnnexport.reports import Report, write_json_atomic
from bnnexport.runs import (
    RunDir,
    append_jsonl,
    build_model,
    load_checkpoint,
    read_jsonl,
    save_checkpoint,
)

DEFAULT_EPOCHS = 5


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in config.json and the checkpoint).

    `gamma`, `threshold` and `lr` accept a number or a schedule in text form
    (`bnnexport.schedules`, counted in optimizer steps).
    """

    model: str = "mnist-bnn"
    dataset: str = "mnist5k"
    data_dir: str | None = None
    optimizer: str = "bop"
    gamma: float | str = 1e-3
    threshold: float | str = 1e-6
    lr: float | str = 1e-2
    epochs: int | None = DEFAULT_EPOCHS  # None: 5 for a new run, the saved value on resume
    batch_size: int = 50
    seed: int = 0
    out: str = "runs/mnist-bnn"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    num_workers: int = 0
    log_every: int = 0  # steps between step records; 0 = about 100 records per epoch

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainReport(Report):
    """What `bnnexport train` prints."""

    run_dir: str
    model: str
    dataset: str
    optimizer: str
    epochs: int
    train_accuracy: float
    test_accuracy: float
    train_loss: float
    seconds: float
    seconds_per_epoch: float
    binary_parameters: int
    flip_rate: dict[str, float]  # π_t of the last logged interval per binary layer
    resumed_from_epoch: int = 0


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Any, batch_size: int = 500, device: str = "cpu") -> float:
    """Top-1 accuracy of `model` on a dataset (eval mode; training mode is restored)."""
    was_training = model.training
    model.eval()
    correct = total = 0
    for inputs, labels in DataLoader(dataset, batch_size=batch_size):
        predictions = model(inputs.to(device)).argmax(dim=1).cpu()
        correct += int((predictions == labels).sum())
        total += len(labels)
    model.train(was_training)
    return correct / max(total, 1)


def _make_optimizer(model: nn.Module, config: TrainConfig) -> CaseOptimizer:
    if config.optimizer not in OPTIMIZERS:
        raise DataError(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if config.optimizer == "adam-latent":
        return OPTIMIZERS["adam-latent"](model, lr=config.lr)
    return OPTIMIZERS[config.optimizer](
        model, gamma=config.gamma, threshold=config.threshold, lr=config.lr
    )


def _binary_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """state_dict with every binary kernel binarized (what leaves training)."""
    from bnnexport.layers import binary_layers
    from bnnexport.quantizers import binarize

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, layer in binary_layers(model):
        state[f"{name}.weight" if name else "weight"] = binarize(layer.weight.detach())
    return state


def _prepare_run(config: TrainConfig, resume: bool, force: bool) -> tuple[RunDir, dict | None]:
    run = RunDir(config.out)
    if resume:
        if not run.checkpoint.is_file():
            raise CheckpointError(f"nothing to resume: {run.checkpoint} does not exist")
        return run, load_checkpoint(run.checkpoint)
    if run.checkpoint.is_file() and not force:
        raise CheckpointError(
            f"{run.root} already holds a trained run: use --resume to continue it, "
            "--force to start over, or another --out"
        )
    if force and run.root.is_dir():
        shutil.rmtree(run.root)
    run.root.mkdir(parents=True, exist_ok=True)
    return run, None


def train(
    config: TrainConfig, resume: bool = False, force: bool = False, progress: bool | None = None
) -> TrainReport:
    """Train, checkpointing every epoch; with `resume`, continue from the run's checkpoint.

    On resume the saved configuration is used, except `epochs`, which may be raised.
    `progress=None` shows progress bars only when stderr is a terminal.
    """
    run, checkpoint = _prepare_run(config, resume, force)
    if checkpoint is not None:
        saved = TrainConfig(**checkpoint["config"])
        saved.epochs = config.epochs or saved.epochs
        config = saved
    config.epochs = config.epochs or DEFAULT_EPOCHS
    torch.manual_seed(config.seed)
    data = load_dataset(config.dataset, config.data_dir)
    if checkpoint is not None:
        model = build_model(checkpoint, run.checkpoint).train()
    else:
        model = create_model(
            config.model,
            num_classes=data.num_classes,
            input_shape=data.input_shape,
            **config.model_kwargs,
        )
    model.to(config.device)
    optimizer = _make_optimizer(model, config)
    start_epoch, step = 0, 0
    if checkpoint is not None:
        if checkpoint.get("latent") is not None:
            model.load_state_dict(checkpoint["latent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch, step = int(checkpoint["epoch"]), int(checkpoint["step"])
        # Work after the last checkpoint is redone: drop its metrics so curves do not double.
        kept = [r for r in read_jsonl(run.metrics) if r.get("step", 0) <= step]
        run.metrics.write_text("".join(_json_line(r) for r in kept))
    write_json_atomic(run.config, config.to_json())

    show = sys.stderr.isatty() if progress is None else progress
    counter = FlipCounter(model)
    steps_per_epoch = max(1, -(-len(data.train) // config.batch_size))
    log_every = config.log_every or max(1, steps_per_epoch // 100)
    started = time.perf_counter()
    epoch_seconds: list[float] = []
    last_rates: dict[str, float] = {}
    train_loss = train_acc = test_acc = float("nan")

    for epoch in range(start_epoch, config.epochs):
        epoch_start = time.perf_counter()
        # Seeded per epoch, so a resumed run sees the same batches as an uninterrupted one.
        np.random.seed(config.seed + epoch)
        loader = DataLoader(
            data.train,
            batch_size=config.batch_size,
            shuffle=True,
            num_workers=config.num_workers,
            generator=torch.Generator().manual_seed(config.seed + epoch),
        )
        model.train()
        totals = {"loss": 0.0, "correct": 0, "seen": 0}
        interval: dict[str, list[int]] = {}
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not show, leave=False)
        for inputs, labels in bar:
            inputs, labels = inputs.to(config.device), labels.to(config.device)
            logits = model(inputs)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            counter.before_step()
            optimizer.step()
            step += 1
            for name, (flips, total) in counter.after_step().items():
                acc = interval.setdefault(name, [0, 0])
                acc[0] += flips
                acc[1] += total
            batch_correct = int((logits.argmax(1) == labels).sum())
            totals["loss"] += loss.item() * len(labels)
            totals["correct"] += batch_correct
            totals["seen"] += len(labels)
            if step % log_every == 0:
                last_rates = {n: flip_rate(f, t) for n, (f, t) in interval.items()}
                record = {
                    "kind": "step",
                    "step": step,
                    "epoch": epoch + 1,
                    "loss": loss.item(),
                    "accuracy": batch_correct / len(labels),
                    "flips": {n: f for n, (f, _) in interval.items()},
                    "flip_rate": last_rates,
                    **optimizer.hyperparameters(),
                }
                append_jsonl(run.metrics, [record])
                interval = {}
                mean_rate = sum(last_rates.values()) / max(len(last_rates), 1)
                bar.set_postfix(
                    loss=f"{totals['loss'] / totals['seen']:.3f}",
                    acc=f"{totals['correct'] / totals['seen']:.3f}",
                    pi=f"{mean_rate:.2f}",
                )
        train_loss = totals["loss"] / max(totals["seen"], 1)
        train_acc = totals["correct"] / max(totals["seen"], 1)
        test_acc = evaluate(model, data.test, device=config.device)
        epoch_seconds.append(time.perf_counter() - epoch_start)
        append_jsonl(
            run.metrics,
            [
                {
                    "kind": "epoch",
                    "step": step,
                    "epoch": epoch + 1,
                    "train_loss": train_loss,
                    "train_accuracy": train_acc,
                    "test_accuracy": test_acc,
                    "seconds": epoch_seconds[-1],
                }
            ],
        )
        save_checkpoint(
            run.checkpoint,
            {
                "model_name": config.model,
                "model_kwargs": {
                    k: v for k, v in model.bnnexport_config.items() if k != "name"
                },
                "model": _binary_state(model),
                "latent": model.state_dict() if config.optimizer == "adam-latent" else None,
                "optimizer": optimizer.state_dict(),
                "epoch": epoch + 1,
                "step": step,
                "config": config.to_json(),
            },
        )
        if show:
            tqdm.write(
                f"epoch {epoch + 1}/{config.epochs}: loss {train_loss:.4f} "
                f"train {train_acc:.4f} test {test_acc:.4f} ({epoch_seconds[-1]:.1f} s)",
                file=sys.stderr,
            )

    if checkpoint is not None and not epoch_seconds:
        # Nothing left to train: report the stored state.
        last = [r for r in read_jsonl(run.metrics) if r.get("kind") == "epoch"]
        if last:
            train_loss = last[-1]["train_loss"]
            train_acc = last[-1]["train_accuracy"]
            test_acc = last[-1]["test_accuracy"]
    if config.optimizer == "adam-latent":
        set_latent(model, False)

    from bnnexport.plots import plot_training

    plot_training(run)
    report = TrainReport(
        run_dir=str(run.root),
        model=config.model,
        dataset=config.dataset,
        optimizer=config.optimizer,
        epochs=config.epochs,
        train_accuracy=train_acc,
        test_accuracy=test_acc,
        train_loss=train_loss,
        seconds=time.perf_counter() - started,
        seconds_per_epoch=sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else 0.0,
        binary_parameters=sum(layer.weight.numel() for _, layer in counter.layers),
        flip_rate=last_rates,
        resumed_from_epoch=start_epoch,
    )
    report.save(run.train_report)
    return report


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def default_out(model: str, dataset: str) -> str:
    """Default run directory for a model and data set."""
    return str(Path("runs") / f"{model}-{dataset}")
