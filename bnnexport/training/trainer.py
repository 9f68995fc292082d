"""The `Trainer`: one training job's model, optimizer and data, and one epoch of its steps.

It decides the run's record of binary kernels (`decide_kernels`: the one discovery,
`bnnexport.nn.discover`), builds the composite optimizer over it, and trains an epoch with its
progress bars, flip counts and metrics rows; BatchNorm statistics are recalibrated before every
evaluation.

Example:
    >>> from bnnexport.models import create_model
    >>> [w.shape[1] for w in first_and_last_weights(create_model("mnist-bnn"))]
    [1, 128]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from bnnexport.datasets import load_dataset
from bnnexport.errors import ConfigError, DataError
from bnnexport.imports import source_of
from bnnexport.models import create_model
from bnnexport.nn.discover import BinaryKernels, find_binary_kernels
from bnnexport.nn.int8 import prepare_int8
from bnnexport.nn.layers import (
    batch_norms,
    init_latent_weights,
    set_precision,
)
from bnnexport.nn.precision import resolve_precision
from bnnexport.run.checkpoint import binary_record, build_model, save_checkpoint
from bnnexport.run.directory import RunDir
from bnnexport.run.records import append_jsonl
from bnnexport.training.composite import OPTIMIZERS, CaseOptimizer
from bnnexport.training.config import TrainConfig
from bnnexport.training.distributed import DistributedContext, GlobalBatches, global_batchnorm
from bnnexport.training.flips import FlipCounter
from bnnexport.training.metrics import pi
from bnnexport.training.resume import apply_schedules


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: Any, device: str = "cpu") -> None:
    """Replace BatchNorm running statistics by exact averages over `batches` (inputs, labels).

    A binary network's pre-activations jump whenever weights flip, so exponential running
    averages lag behind the current weights and eval-mode accuracy swings; the exported model
    uses these statistics, so they must describe the weights being saved.
    """
    norms = batch_norms(model)
    if not norms:
        return
    saved = [(m.momentum, m.training) for m in norms]
    was_training = model.training
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
        m.train()
    try:
        for inputs, _ in batches:
            model(inputs.to(device))
    finally:
        for m, (momentum, training) in zip(norms, saved, strict=True):
            m.momentum = momentum
            m.train(training)
        model.train(was_training)


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


def first_and_last_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights of the model's first and last convolution or dense layer (module order),
    which the XNOR-Net recipe regularises with L2."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return [layers[0].weight, layers[-1].weight] if layers else []


def _make_optimizer(model: nn.Module, config: TrainConfig, kernels: BinaryKernels) -> CaseOptimizer:
    """The run's optimizer over the kernels its record names (Bop) and everything else (Adam)."""
    if config.optimizer not in OPTIMIZERS:
        raise DataError(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if config.optimizer == "adam-latent":
        return OPTIMIZERS["adam-latent"](model, lr=config.lr, binary=kernels)
    hyper = {"gamma": config.gamma, "threshold": config.threshold, "lr": config.lr}
    if config.optimizer == "bop2":
        hyper["sigma"] = config.sigma
    return OPTIMIZERS[config.optimizer](model, **hyper, binary=kernels, init_sign=config.init_sign)


def decide_kernels(
    model: nn.Module, config: TrainConfig, input_shape: tuple[int, ...]
) -> BinaryKernels:
    """The record of a new run's binary kernels (`bnnexport.nn.discover.find_binary_kernels`):
    named by `config.binary`, else found by tracing one seeded input of the data's shape, which
    also shows, before any training, whether the model takes the data (InputShapeError, one
    line, naming the model, the data set and its shape)."""
    from bnnexport.errors import InputShapeError

    generator = torch.Generator().manual_seed(config.seed)
    example = torch.randn(1, *input_shape, generator=generator)
    try:
        return find_binary_kernels(model, example, binary=config.binary or None)
    except InputShapeError as error:
        shape = "x".join(str(v) for v in input_shape)
        raise InputShapeError(
            f"--model {config.model} cannot take --dataset {config.dataset}'s input {shape}: "
            f"{str(error).partition(': ')[2]}"
        ) from None


def _binary_state(model: nn.Module, kernels: list[str]) -> dict[str, torch.Tensor]:
    """state_dict with every recorded binary kernel binarized (what leaves training)."""
    from bnnexport.nn.quantizers import binarize

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name in kernels:
        state[name] = binarize(state[name])
    return state


# The metrics go on a second line: beside the bar (tqdm's default, with its rate) they left the
# bar one character wide in a 60-column terminal.
BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} <{remaining}"


def progress_bars(
    iterable: Any, epoch: int, epochs: int, show: bool, file: Any = None, ncols: int | None = None
) -> tuple[tqdm, tqdm]:
    """The per-epoch progress bar on stderr and, below it, a status line for the metrics."""
    options = dict(disable=not show, leave=False, dynamic_ncols=ncols is None, ncols=ncols,
                   file=file)  # fmt: skip
    bar = tqdm(iterable, desc=f"epoch {epoch + 1}/{epochs}", bar_format=BAR_FORMAT, **options)
    status = tqdm(total=0, position=bar.pos + 1, bar_format="{desc}", **options)
    return bar, status


@dataclass
class EpochResult:
    loss: float
    accuracy: float
    flip_rate: dict[str, float]  # per layer, the epoch's mean per-step flip fraction as π
    step: int
    mean_flip_rate: float = -9.0  # the same over all binary weights


def _rates(counts: dict[str, list[int]], steps: int) -> tuple[dict[str, float], float]:
    """π per layer and over all weights from {layer: [flips, weights]} summed over `steps`."""
    steps = max(steps, 1)
    rates = {n: pi(f / (t * steps)) for n, (f, t) in counts.items()}
    flips, weights = sum(f for f, _ in counts.values()), sum(t for _, t in counts.values())
    return rates, pi(flips / (max(weights, 1) * steps))


class Trainer:
    """One training job: model, optimizer and data of one process (of possibly several)."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        checkpoint: dict | None,
        context: DistributedContext,
        resume_changes: dict | None = None,
    ) -> None:
        resume_changes = resume_changes or {}
        self.config, self.run, self.context = config, run, context
        self.model_source = source_of(config.model)  # the file that trains: recorded in the run
        torch.manual_seed(config.seed)
        self.data = load_dataset(config.dataset, config.data_dir, **config.dataset_options)
        if self.data.options:  # with what the loader chose (the images' own size): export
            config.dataset_options = dict(self.data.options)  # and --resume rebuild the same
        if checkpoint is not None:
            model = build_model(checkpoint, run.checkpoint).train()
        else:
            try:
                model = create_model(
                    config.model,
                    num_classes=self.data.num_classes,
                    input_shape=self.data.input_shape,
                    **config.model_kwargs,
                )
            except ValueError as error:  # e.g. an input too small for the model
                raise ConfigError(f"--model {config.model} on {config.dataset}: {error}") from None
        # channels_last (NHWC) lets oneDNN's CPU convolutions skip a layout conversion per call
        # (benchmarks/train_throughput.py: ~6 % more images/s on BinaryNet).
        self.memory_format = (
            torch.channels_last if len(self.data.input_shape) == 3 else torch.contiguous_format
        )
        # the one record of the binary kernels: decided once, when the run starts
        self.kernels = (
            binary_record(checkpoint, model, run.checkpoint)
            if checkpoint is not None
            else decide_kernels(model, config, tuple(self.data.input_shape))
        )
        if config.float_layers == "int8" and checkpoint is None:  # (a checkpoint's model has it)
            example = torch.zeros(1, *self.data.input_shape)
            prepare_int8(model, example, self.kernels.names)
        self.model = model.to(context.device, memory_format=self.memory_format)
        self.precision = resolve_precision(config.precision, context.device)
        set_precision(self.model, self.precision)
        # autocast computes on bf16 copies; the parameters themselves stay float32
        self.amp = self.precision == "amp"
        self.optimizer = _make_optimizer(self.model, config, self.kernels)
        if config.optimizer == "adam-latent" and checkpoint is None:
            init_latent_weights(self.model, kernels=self.optimizer.binary_kernels)
        self.start_epoch = self.step = 0
        if checkpoint is not None:
            if checkpoint.get("latent") is not None:
                self.model.load_state_dict(checkpoint["latent"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            apply_schedules(self.optimizer, config, resume_changes)
            self.start_epoch, self.step = int(checkpoint["epoch"]), int(checkpoint["step"])
        # The same experiment as one process at the global batch: BatchNorm over the global
        # batch, computed alike in one process and in N (distributed.global_batchnorm, in a
        # single process too); DDP all-reduces gradients before the step, so every rank's Bop
        # flips the same weights.
        self.synced_batchnorm = context.enabled and config.sync_batchnorm
        if config.sync_batchnorm:
            global_batchnorm(self.model)
        self.forward: nn.Module = (
            nn.parallel.DistributedDataParallel(self.model) if context.enabled else self.model
        )
        self.counter = FlipCounter(self.model, self.optimizer.binary_kernels)
        self.l2_weights = first_and_last_weights(self.model) if config.l2_first_last else []
        self.steps_per_epoch = max(1, len(self.batches(0)))
        self.log_every = config.log_every or max(1, self.steps_per_epoch // 100)

    def batches(self, epoch: int) -> GlobalBatches:
        """This process's batches of `epoch`: its shares of the global batches every process
        draws alike (`bnnexport.training.distributed.GlobalBatches`), seeded per epoch, so a
        resumed run sees the batches of an uninterrupted one. A short last global batch is
        dropped where a process's BatchNorm would see one value per channel."""
        world = self.context.world_size
        smallest = max(2, world) if self.synced_batchnorm else 2 * world
        return GlobalBatches(
            len(self.data.train), self.config.batch_size, self.config.seed, epoch,
            self.context.rank, world, smallest_last=smallest,
        )  # fmt: skip

    def loader(self, epoch: int) -> DataLoader:
        # augmentation draws from numpy's generator: its own stream per process
        np.random.seed(self.config.seed + epoch + 1000 * self.context.rank)
        return DataLoader(
            self.data.train,
            batch_sampler=self.batches(epoch),
            num_workers=self.config.num_workers,
            # seeds the workers (not the order); leaves torch's global generator alone
            generator=torch.Generator().manual_seed(self.config.seed + epoch),
        )

    def train_epoch(self, epoch: int, show: bool) -> EpochResult:
        config, device = self.config, self.context.device
        self.model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        # {layer: [flips, weights]}: since the last step row, and over the epoch
        interval: dict[str, list[int]] = {}
        whole: dict[str, list[int]] = {}
        interval_steps = epoch_steps = 0
        loader = self.loader(epoch)
        last_batch = len(loader) - 1
        batches: GlobalBatches = loader.batch_sampler  # type: ignore[assignment]
        bar, status = progress_bars(loader, epoch, config.epochs, show)
        for index, (inputs, labels) in enumerate(bar):
            inputs = inputs.to(device, memory_format=self.memory_format)
            labels = labels.to(device)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=self.amp):
                logits = self.forward(inputs)
                loss = F.cross_entropy(logits.float(), labels)
                for weight in self.l2_weights:
                    loss = loss + config.l2_first_last * weight.float().pow(2).sum()
            share = batches.shares(index)  # 1.0 unless a short last batch is shared unevenly
            self.optimizer.zero_grad()
            (loss * share if share != 1.0 else loss).backward()
            self.counter.before_step()
            self.optimizer.step()
            self.step += 1
            interval_steps += 1
            epoch_steps += 1
            for name, (flips, total) in self.counter.after_step().items():
                interval.setdefault(name, [0, total])[0] += flips
                whole.setdefault(name, [0, total])[0] += flips
            batch_correct = int((logits.argmax(1) == labels).sum())
            loss_sum += loss.item() * len(labels)
            correct += batch_correct
            seen += len(labels)
            # the epoch's last row may cover fewer steps: no flip goes unrecorded
            if self.step % self.log_every == 0 or index == last_batch:
                rates, mean_rate = _rates(interval, interval_steps)
                if self.context.is_main:
                    record = {
                        "kind": "step",
                        "step": self.step,
                        "epoch": epoch + 1,
                        "steps": interval_steps,
                        "loss": loss.item(),
                        "accuracy": batch_correct / len(labels),
                        "flips": {n: f for n, (f, _) in interval.items()},
                        "flip_rate": rates,
                        "mean_flip_rate": mean_rate,
                        **self.optimizer.hyperparameters(),
                    }
                    append_jsonl(self.run.metrics, [record])
                interval, interval_steps = {}, 0
                status.set_description_str(
                    f"loss {loss_sum / seen:.4f}  acc {correct / seen:.4f}  π {mean_rate:.2f}"
                )
            if config.eval_every and self.step % config.eval_every == 0:
                self.evaluate_now(epoch)
        status.close()
        loss_sum, correct, seen = self.context.all_reduce_sum([loss_sum, correct, seen])
        rates, mean_rate = _rates(whole, epoch_steps)
        return EpochResult(
            loss_sum / max(seen, 1), correct / max(seen, 1), rates, self.step, mean_rate
        )

    def evaluate_now(self, epoch: int) -> None:
        """A test-accuracy row mid-epoch (`eval_every`), measured as at an epoch's end
        (BatchNorm recalibrated first), leaving training exactly as it was: the BatchNorm
        buffers and the random states are restored afterwards."""
        buffers = {k: v.clone() for k, v in self.model.state_dict().items() if "running" in k}
        numpy_state, torch_state = np.random.get_state(), torch.get_rng_state()
        try:
            if self.config.bn_recalibration_batches:
                batches = itertools.islice(self.loader(epoch), self.config.bn_recalibration_batches)
                recalibrate_batchnorm(self.model, batches, device=self.context.device)
            if self.context.is_main:
                accuracy = evaluate(self.model, self.data.test, device=self.context.device)
                record = {"kind": "eval", "step": self.step, "epoch": epoch + 1,
                          "test_accuracy": accuracy}  # fmt: skip
                append_jsonl(self.run.metrics, [record])
        finally:
            self.model.load_state_dict(buffers, strict=False)
            np.random.set_state(numpy_state)
            torch.set_rng_state(torch_state)

    def save(self, epoch: int) -> None:
        config = self.config
        save_checkpoint(
            self.run.checkpoint,
            {
                "model_name": config.model,
                "model_kwargs": {
                    k: v for k, v in self.model.bnnexport_config.items() if k != "name"
                },
                "model": _binary_state(self.model, self.kernels.names),
                # the record every later stage reads (bnnexport.nn.discover.BinaryKernels)
                "binary_kernels": self.kernels.to_json(),
                "latent": self.model.state_dict() if config.optimizer == "adam-latent" else None,
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
                "step": self.step,
                "config": config.to_json(),
                # for later stages: the classes' names (outputs' order), the model's source
                "class_names": self.data.class_names,
                "model_source": self.model_source,
                # how the float layers trained: "int8" rebuilds the model with its fake
                # quantization before the state loads (bnnexport.run.checkpoint.build_model)
                "float_layers": config.float_layers,
            },
        )
