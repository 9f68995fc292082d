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

import dataclasses
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
from bnnexport.optim.composite import OPTIMIZERS, CaseOptimizer, OptimizerEntry
from bnnexport.run.checkpoint import binary_record, build_model, save_checkpoint
from bnnexport.run.directory import RunDir
from bnnexport.run.records import append_jsonl
from bnnexport.training.config import TrainConfig
from bnnexport.training.distributed import (
    DistributedContext,
    GlobalBatches,
    global_batchnorm,
    process_batch_size,
)
from bnnexport.training.flips import FlipCounter
from bnnexport.training.metrics import pi
from bnnexport.training.recipes import rescale_on_resume
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
    return evaluate_counts(model, dataset, batch_size, device).top1


@torch.no_grad()
def evaluate_counts(
    model: nn.Module, dataset: Any, batch_size: int = 500, device: str = "cpu"
) -> BatchCounts:
    """What `model` scores on a dataset in eval mode (top-1 and top-5 hits; no loss), training
    mode restored afterwards."""
    was_training = model.training
    model.eval()
    counts = BatchCounts()
    for inputs, labels in DataLoader(dataset, batch_size=batch_size):
        counts += BatchCounts.of(model(inputs.to(device)).cpu(), labels, 0.0)
    model.train(was_training)
    return counts


def first_and_last_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights of the model's first and last convolution or dense layer (module order),
    which the XNOR-Net recipe regularises with L2."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return [layers[0].weight, layers[-1].weight] if layers else []


def _make_optimizer(model: nn.Module, config: TrainConfig, kernels: BinaryKernels) -> CaseOptimizer:
    """The run's optimizer over the kernels its record names (Bop) and everything else (Adam),
    with the values of the hyperparameters its registry entry declares."""
    entry = _entry(config)
    values = {name: config.value(name) for name in entry.names}
    return entry.build(model, values, kernels, init_sign=config.init_sign)


def _entry(config: TrainConfig) -> OptimizerEntry:
    if config.optimizer not in OPTIMIZERS:
        raise DataError(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[config.optimizer]


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
    top5_accuracy: float = float("nan")


def _rates(counts: dict[str, list[int]], steps: int) -> tuple[dict[str, float], float]:
    """π per layer and over all weights from {layer: [flips, weights]} summed over `steps`."""
    steps = max(steps, 1)
    rates = {n: pi(f / (t * steps)) for n, (f, t) in counts.items()}
    flips, weights = sum(f for f, _ in counts.values()), sum(t for _, t in counts.values())
    return rates, pi(flips / (max(weights, 1) * steps))


TOP_K = 5  # the second accuracy training logs (the authors' Keras `top_k_categorical_accuracy`)


@dataclass(frozen=True)
class BatchCounts:
    """What a batch (or several) scored: the loss summed over its samples, the samples whose
    label is the top prediction and among the top TOP_K, and the samples. Sums of these are
    what processes add up, so that N processes report what one process at the global batch
    does (up to the rounding of the loss).

    Example:
        >>> logits = torch.tensor([[5.0, 4, 3, 2, 1, 0]] * 3)  # class 0 first, 5 last
        >>> counts = BatchCounts.of(logits, torch.tensor([0, 4, 5]), loss=1.5)
        >>> counts.top1_hits, counts.top5_hits, counts.loss
        (1, 2, 1.5)
    """

    loss_sum: float = 0.0
    top1_hits: int = 0
    top5_hits: int = 0
    samples: int = 0

    @classmethod
    def of(cls, logits: torch.Tensor, labels: torch.Tensor, loss: float) -> BatchCounts:
        """A batch's counts from its logits, labels and mean loss (TOP_K capped at the
        number of classes)."""
        top = logits.topk(min(TOP_K, logits.shape[1]), dim=1).indices
        top1 = int((logits.argmax(1) == labels).sum())
        top5 = int((top == labels[:, None]).any(1).sum())
        return cls(loss * len(labels), top1, top5, len(labels))

    def __add__(self, other: BatchCounts) -> BatchCounts:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
        return BatchCounts(*(a + b for a, b in pairs))

    def all_reduced(self, context: DistributedContext) -> BatchCounts:
        """These counts summed over every process (themselves in a single process)."""
        total = context.all_reduce_sum(
            [self.loss_sum, self.top1_hits, self.top5_hits, self.samples]
        )
        return BatchCounts(total[0], *(round(v) for v in total[1:]))

    loss = property(lambda self: self.loss_sum / max(self.samples, 1))
    top1 = property(lambda self: self.top1_hits / max(self.samples, 1))
    top5 = property(lambda self: self.top5_hits / max(self.samples, 1))


class EpochTally:
    """One epoch's scores and flips, over the epoch and since the last step row."""

    def __init__(self) -> None:
        self.whole = self.last = BatchCounts()
        # {layer: [flips, weights]}: since the last step row, and over the epoch
        self.interval: dict[str, list[int]] = {}
        self.flips: dict[str, list[int]] = {}
        self.interval_steps = self.steps = 0
        self.mean_rate = -9.0  # π of the last step row

    def add_step(self, flips: dict[str, tuple[int, int]], batch: BatchCounts) -> None:
        self.last, self.whole = batch, self.whole + batch
        self.interval_steps += 1
        self.steps += 1
        for name, (count, total) in flips.items():
            self.interval.setdefault(name, [0, total])[0] += count
            self.flips.setdefault(name, [0, total])[0] += count

    def end_interval(self, mean_rate: float) -> None:
        self.interval, self.interval_steps, self.mean_rate = {}, 0, mean_rate

    def status(self) -> str:
        """The progress bar's status line: this process's running means."""
        return f"loss {self.whole.loss:.4f}  acc {self.whole.top1:.4f}  π {self.mean_rate:.2f}"

    def epoch_result(self, context: DistributedContext, step: int) -> EpochResult:
        """The epoch's loss and accuracies over every process's samples, and its π."""
        whole = self.whole.all_reduced(context)
        rates, mean_rate = _rates(self.flips, self.steps)
        return EpochResult(whole.loss, whole.top1, rates, step, mean_rate, whole.top5)


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
        """`resume_changes` (a resumed run's {option: [old, new]}) gets what the run changes
        itself: a recipe's schedules rescaled to a new --epochs (`resume_note` says so)."""
        self.config, self.run, self.context = config, run, context
        self.model_source = source_of(config.model)  # the file that trains: recorded in the run
        torch.manual_seed(config.seed)
        self.data = load_dataset(config.dataset, config.data_dir, **config.dataset_options)
        if self.data.options:  # with what the loader chose (the images' own size): export
            config.dataset_options = dict(self.data.options)  # and --resume rebuild the same
        # --batch-size is the global batch: each process takes its share of it, and the steps
        # per epoch are one process's (known before a resumed run's schedules are applied)
        self.synced_batchnorm = context.enabled and config.sync_batchnorm
        self.process_batch = process_batch_size(config.batch_size, context.world_size)
        self.steps_per_epoch = max(1, len(self.batches(0)))
        self.log_every = config.log_every or max(1, self.steps_per_epoch // 100)
        model = self._new_model(checkpoint)
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
        if _entry(config).latent and checkpoint is None:
            init_latent_weights(self.model, kernels=self.optimizer.binary_kernels)
        self.start_epoch = self.step = 0
        self.resume_note: str | None = None
        if checkpoint is not None:
            self._restore(checkpoint, {} if resume_changes is None else resume_changes)
        # The same experiment as one process at the global batch: BatchNorm over the global
        # batch, computed alike in one process and in N (distributed.global_batchnorm, in a
        # single process too); DDP all-reduces gradients before the step, so every rank's Bop
        # flips the same weights.
        if config.sync_batchnorm:
            global_batchnorm(self.model)
        self.forward: nn.Module = (
            nn.parallel.DistributedDataParallel(self.model) if context.enabled else self.model
        )
        self.counter = FlipCounter(self.model, self.optimizer.binary_kernels)
        self.l2_weights = first_and_last_weights(self.model) if config.l2_first_last else []

    def _new_model(self, checkpoint: dict | None) -> nn.Module:
        """The checkpoint's model (in training mode), or a new one of the configuration's."""
        config = self.config
        if checkpoint is not None:
            return build_model(checkpoint, self.run.checkpoint).train()
        try:
            return create_model(
                config.model,
                num_classes=self.data.num_classes,
                input_shape=self.data.input_shape,
                **config.model_kwargs,
            )
        except ValueError as error:  # e.g. an input too small for the model
            raise ConfigError(f"--model {config.model} on {config.dataset}: {error}") from None

    def _restore(self, checkpoint: dict, changes: dict) -> None:
        """A resumed run's weights, optimizer state and step, then the schedules it changed
        (given on the command line, or a recipe's rescaled to a new --epochs)."""
        if checkpoint.get("latent") is not None:
            self.model.load_state_dict(checkpoint["latent"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.start_epoch, self.step = int(checkpoint["epoch"]), int(checkpoint["step"])
        self.resume_note = rescale_on_resume(self.config, changes, self.steps_per_epoch, self.step)
        apply_schedules(self.optimizer, self.config, changes)

    def batches(self, epoch: int) -> GlobalBatches:
        """This process's batches of `epoch`: its shares of the global batches every process
        draws alike (`bnnexport.training.distributed.GlobalBatches`), seeded per epoch, so a
        resumed run sees the batches of an uninterrupted one. A short last global batch is
        dropped where a process's BatchNorm would see one value per channel."""
        world = self.context.world_size
        smallest = max(2, world) if self.synced_batchnorm else 2 * world
        return GlobalBatches(
            len(self.data.train), self.process_batch, self.config.seed, epoch,
            self.context.rank, world, smallest_last=smallest,
        )  # fmt: skip

    def data_parallel(self) -> dict[str, int]:
        """How the global batch was shared, for config.json: the processes (torchrun's
        WORLD_SIZE) and each one's images per step (--batch-size is the global batch)."""
        return {"world_size": self.context.world_size, "batch_size_per_process": self.process_batch}

    def sharing_note(self) -> str | None:
        """Under torchrun, one line saying how each batch is shared; None in one process."""
        world = self.context.world_size
        if world == 1:
            return None
        return (
            f"{world} processes share each batch of {self.config.batch_size} (--batch-size is "
            f"the global batch): {self.process_batch} images each, {self.steps_per_epoch} "
            "steps per epoch, as one process at this batch"
        )

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
        config = self.config
        self.model.train()
        tally = EpochTally()
        loader = self.loader(epoch)
        last_batch = len(loader) - 1
        batches: GlobalBatches = loader.batch_sampler  # type: ignore[assignment]
        bar, status = progress_bars(loader, epoch, config.epochs, show)
        for index, (inputs, labels) in enumerate(bar):
            batch = self._step(inputs, labels, batches.shares(index))
            tally.add_step(self.counter.after_step(), batch)
            # the epoch's last row may cover fewer steps: no flip goes unrecorded
            if self.step % self.log_every == 0 or index == last_batch:
                self._log_step(epoch, tally)
                status.set_description_str(tally.status())
            if config.eval_every and self.step % config.eval_every == 0:
                self.evaluate_now(epoch)
        status.close()
        return tally.epoch_result(self.context, self.step)

    def _step(self, inputs: torch.Tensor, labels: torch.Tensor, share: float) -> BatchCounts:
        """One optimizer step on this process's share of a global batch; returns what the
        share scored. `share` weighs the loss where a short last batch is shared unevenly."""
        config, device = self.config, self.context.device
        inputs = inputs.to(device, memory_format=self.memory_format)
        labels = labels.to(device)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=self.amp):
            logits = self.forward(inputs)
            loss = F.cross_entropy(logits.float(), labels)
            for weight in self.l2_weights:
                loss = loss + config.l2_first_last * weight.float().pow(2).sum()
        self.optimizer.zero_grad()
        (loss * share if share != 1.0 else loss).backward()
        self.counter.before_step()
        self.optimizer.step()
        self.step += 1
        return BatchCounts.of(logits.detach(), labels, float(loss.item()))

    def _log_step(self, epoch: int, tally: EpochTally) -> None:
        """A step row for the steps since the last one; its loss and accuracies are the
        global batch's (every process's share, weighed by its samples: the same numbers one
        process at the global batch logs). Every process takes part in the all-reduce."""
        batch = tally.last.all_reduced(self.context)
        rates, mean_rate = _rates(tally.interval, tally.interval_steps)
        if self.context.is_main:
            record = {
                "kind": "step",
                "step": self.step,
                "epoch": epoch + 1,
                "steps": tally.interval_steps,
                "loss": batch.loss,
                "accuracy": batch.top1,
                "top5_accuracy": batch.top5,
                "flips": {n: f for n, (f, _) in tally.interval.items()},
                "flip_rate": rates,
                "mean_flip_rate": mean_rate,
                **self.optimizer.hyperparameters(),
            }
            append_jsonl(self.run.metrics, [record])
        tally.end_interval(mean_rate)

    def evaluate_now(self, epoch: int) -> None:
        """A test-accuracy row mid-epoch (`eval_every`), measured as at an epoch's end
        (BatchNorm recalibrated first), leaving training exactly as it was: the BatchNorm
        buffers and the random states are restored afterwards."""
        buffers = {k: v.clone() for k, v in self.model.state_dict().items() if "running" in k}
        numpy_state, torch_state = np.random.get_state(), torch.get_rng_state()
        try:
            if self.config.recalibration_batches:
                batches = itertools.islice(self.loader(epoch), self.config.recalibration_batches)
                recalibrate_batchnorm(self.model, batches, device=self.context.device)
            if self.context.is_main:
                test = evaluate_counts(self.model, self.data.test, device=self.context.device)
                record = {"kind": "eval", "step": self.step, "epoch": epoch + 1,
                          "test_accuracy": test.top1, "test_top5_accuracy": test.top5}  # fmt: skip
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
                "latent": self.model.state_dict() if _entry(config).latent else None,
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
                "step": self.step,
                "config": config.to_json(),
                # for later stages: the classes' names (outputs' order), the model's source
                "class_names": self.data.class_names,
                "model_source": self.model_source,
                # config's batch_size is the global batch (before, it was each process's)
                "global_batch": True,
                # how the float layers trained: "int8" rebuilds the model with its fake
                # quantization before the state loads (bnnexport.run.checkpoint.build_model)
                "float_layers": config.float_layers,
            },
        )
