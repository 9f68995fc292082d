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
import itertools
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from bnnexport import files
from bnnexport.datasets import load_dataset, recorded_options
from bnnexport.datasets.imagefolder import parse_image_size
from bnnexport.discover import BinaryKernels, find_binary_kernels
from bnnexport.distributed import DistributedContext, setup
from bnnexport.errors import CheckpointError, ConfigError, DataError, TrainingInterrupted
from bnnexport.layers import (
    batch_norms,
    bf16_counts,
    init_latent_weights,
    set_latent,
    set_precision,
)
from bnnexport.metrics import TENSORBOARD_FILE, metrics_csv, pi, write_tensorboard
from bnnexport.models import create_model
from bnnexport.optimizers import GAMMA, LR, OPTIMIZERS, THRESHOLD, CaseOptimizer, FlipCounter
from bnnexport.precision import PRECISIONS, resolve_precision
from bnnexport.provenance import remove_derived
from bnnexport.reports import Report, write_bytes_atomic, write_json_atomic
from bnnexport.runs import (
    RunDir,
    append_jsonl,
    binary_record,
    build_model,
    clear_run,
    load_checkpoint,
    lock_run,
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
    # the data set loader's own options (imagefolder: image_size, mean, std, val_split)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "bop"
    # Bop: set binary kernels that are not ±1 to sign(w), ties to +1 (a model of your own
    # initialised with real weights); without it such a kernel is refused
    init_sign: bool = False
    # the binary kernels by parameter name or shell-style glob; empty: found by tracing the
    # model (bnnexport.discover). The decision itself is the checkpoint's `binary_kernels`.
    binary: list[str] = field(default_factory=list)
    # the optimizers' own defaults (bnnexport.optimizers: GAMMA, THRESHOLD, LR), one set for both
    gamma: float | str = GAMMA
    threshold: float | str = THRESHOLD
    lr: float | str = LR
    epochs: int | None = DEFAULT_EPOCHS  # None: 5 for a new run, the saved value on resume
    batch_size: int = 50
    seed: int = 0
    out: str = "runs/mnist-bnn"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    num_workers: int = 0
    log_every: int = 0  # steps between step records; 0 = about 100 records per epoch
    eval_every: int = 0  # steps between test-accuracy records (kind "eval"); 0 = per epoch only
    metrics_csv: bool = False  # also write metrics.csv (every row of metrics.jsonl) each epoch
    sigma: float | str = 1e-2  # bop2's σ (second-moment rate); other optimizers have none
    # L2 penalty λ·Σw² on the first and last weight layers (the paper's XNOR-Net recipe)
    l2_first_last: float = 0.0
    recipe: str | None = None  # the recipe this run started from (bnnexport.recipes)
    recipe_overrides: dict[str, Any] = field(default_factory=dict)  # what the user changed
    # bnnexport.precision: "auto" = bf16 for the binary layers' forward where that is exact
    # (training identical to float32 bit for bit) on bf16 hardware, float32 elsewhere
    precision: str = "auto"
    # Before each evaluation and checkpoint, re-estimate BatchNorm statistics on this many
    # training batches (0 = off): flips shift pre-activations faster than running averages follow.
    bn_recalibration_batches: int = 20

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
    # π of the last epoch per binary layer: log(mean per-step flip fraction + e^-9)
    flip_rate: dict[str, float]
    resumed_from_epoch: int = 0
    world_size: int = 1  # processes that trained (torchrun); the effective batch is batch x this
    rank_mismatched_weights: int = 0  # binary weights differing from rank 0's; must stay 0
    strict: bool = False  # the saved checkpoint verified strictly binary (bnnexport.verify)
    resume_changes: dict[str, list] = field(default_factory=dict)  # option: [old, new]
    # what --resume removed because it was made from the checkpoint training replaces
    resume_removed: list[str] = field(default_factory=list)
    precision: str = "float32"  # how the binary layers computed (--precision, auto resolved)
    bf16_fallbacks: int = 0  # bf16-exact forward calls recomputed in float32 (sums too large)
    bf16_calls: int = 0
    mean_flip_rate: float = -9.0  # the same over all binary weights together
    notes: list[str] = field(default_factory=list)  # choices made for the user (the data's size)


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
    """The record of a new run's binary kernels (`bnnexport.discover.find_binary_kernels`):
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
    from bnnexport.quantizers import binarize

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name in kernels:
        state[name] = binarize(state[name])
    return state


# What a resumed run may change (recorded in config.json and metrics.jsonl); every other option
# that differs from the run's own is refused by name rather than silently ignored.
RESUMABLE = ("lr", "gamma", "threshold", "sigma", "batch_size", "epochs", "data_dir", "device",
             "precision", "num_workers", "log_every", "eval_every", "metrics_csv")  # fmt: skip
TRAIN_OWNED = ("config.json", "metrics.jsonl", "train.json", "accuracy.png", "flip_rate.png",
               "metrics.csv", TENSORBOARD_FILE)  # fmt: skip


def validate_config(config: TrainConfig) -> None:
    """Raise ConfigError for a value no training could use, before anything is written."""
    _check_hyperparameter("--lr", config.lr, lambda v: v > 0, "must be > 0")
    _check_hyperparameter("--gamma", config.gamma, lambda v: 0 < v <= 1, "must be in (0, 1]")
    _check_hyperparameter("--threshold", config.threshold, lambda v: v >= 0, "must be >= 0")
    _check_hyperparameter("--sigma", config.sigma, lambda v: 0 < v <= 1, "must be in (0, 1]")
    if not config.l2_first_last >= 0:
        raise ConfigError(f"l2_first_last {config.l2_first_last}: must be >= 0")
    if config.log_every < 0 or config.eval_every < 0:
        raise ConfigError("--log-every and --eval-every must be >= 0 (0: the default)")
    if config.precision not in PRECISIONS:
        raise ConfigError(f"--precision {config.precision!r} is not one of {', '.join(PRECISIONS)}")
    if config.batch_size < 1 or (config.epochs is not None and config.epochs < 1):
        raise ConfigError("--batch-size and --epochs must be at least 1")
    try:
        kind = torch.device(config.device).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"unknown torch device {config.device!r}: use cpu, cuda or cuda:N")


IMAGEFOLDER_OPTIONS = ("image_size", "mean", "std", "val_split")


def _check_dataset_options(dataset: str, options: dict[str, Any]) -> None:
    """Options of the imagefolder loader only, each in range (the loader checks the layout)."""
    if not options:
        return
    names = ", ".join("--" + key.replace("_", "-") for key in options)
    if dataset != "imagefolder":
        raise ConfigError(f"{names}: options of --dataset imagefolder, not of {dataset}")
    unknown = set(options) - set(IMAGEFOLDER_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown imagefolder option(s): {', '.join(sorted(unknown))}")
    if options.get("image_size") is not None:
        parse_image_size(options["image_size"])  # DataError, one line, for a bad size
    split = options.get("val_split")
    if split is not None and not 0.0 < split < 1.0:
        raise ConfigError(f"--val-split {split}: must be between 0 and 1 (exclusive)")


def _check_hyperparameter(option: str, value: float | str, ok: Any, rule: str) -> None:
    from bnnexport.schedules import as_schedule, schedule_to_dict

    try:
        schedule = as_schedule(value)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{option} {value}: {error}") from None
    numbers = [v for v in schedule_to_dict(schedule).values() if isinstance(v, (int, float))]
    if not all(np.isfinite(numbers)):
        raise ConfigError(f"{option} {value}: not a finite number")
    if not ok(schedule(0)):
        raise ConfigError(f"{option} {value}: {rule}")


def _check_run(run: RunDir, resume: bool, force: bool) -> dict | None:
    """The checkpoint to resume from, or None; refuses before anything is changed."""
    if resume:
        if not run.checkpoint.is_file():
            raise CheckpointError(f"nothing to resume: {run.checkpoint} does not exist")
        return load_checkpoint(run.checkpoint)  # its folder: checked in _train, once known
    files.require_run_directory(run.root)  # with or without --force: the user's files stay
    if run.checkpoint.is_file() and not force:
        raise CheckpointError(
            f"{run.root} already holds a trained run: use --resume to continue it, "
            "--force to start over, or another --out"
        )
    return None


def resumed_config(
    checkpoint: dict, config: TrainConfig, explicit: set[str] | None, source: Path
) -> tuple[TrainConfig, dict[str, list]]:
    """The run's own configuration with the options given explicitly applied, and the changes.

    Options in RESUMABLE are applied (and returned as {name: [old, new]}); a different model,
    data set, optimizer or seed is refused naming the option. `explicit=None` (library callers)
    applies only `epochs` and `device`.
    """
    saved_json = checkpoint.get("config")
    if not isinstance(saved_json, dict) or saved_json.get("initialised_only"):
        raise CheckpointError(
            f"{source} was written by `bnnexport init` (an untrained model), not by train: "
            "there is nothing to resume; train a new run with another --out or --force"
        )
    saved_json = dict(saved_json)
    if "amp" in saved_json:  # runs from before --precision: --amp was the only other mode
        saved_json.setdefault("precision", "amp" if saved_json.pop("amp") else "float32")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(saved_json) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown configuration key(s) {', '.join(unknown)}: written by another "
            "version of bnnexport"
        )
    saved = TrainConfig(**saved_json)
    saved.dataset_options = recorded_options(saved.dataset, saved.dataset_options)
    done = int(checkpoint.get("epoch", 0))
    saved.out = config.out  # the run may have been moved or copied since
    names = {"epochs", "device"} if explicit is None else set(explicit) - {"out"} | {"device"}
    changes: dict[str, list] = {}
    for name in sorted(names):
        new, old = getattr(config, name), getattr(saved, name)
        if name == "dataset_options":  # each option given is checked against the run's own
            new = {**old, **new}
        if new is None or new == old:
            continue
        if name not in RESUMABLE:
            option, new, old = _differing(name, new, old)
            raise ConfigError(
                f"--{option.replace('_', '-')} {new} differs from the run's {old}: a resumed run "
                f"keeps its {option}; drop the option, or start over with --force or another --out"
            )
        if name == "epochs" and new < done:
            raise ConfigError(
                f"--epochs {new} is below the {done} epoch(s) this run has already trained"
            )
        if name != "device":  # where to train is not part of the run's record
            changes[name] = [old, new]
        setattr(saved, name, new)
    return saved, changes


def _differing(name: str, new: Any, old: Any) -> tuple[str, Any, Any]:
    """The option that differs, with its new and old values: a data set option by its name."""
    if name == "dataset_options":
        key = next(k for k in sorted(new) if new[k] != old.get(k))
        return key, new[key], old.get(key)
    return name, new, old


def _apply_schedules(optimizer: CaseOptimizer, config: TrainConfig, changes: dict) -> None:
    """Loading the optimizer state restored the old schedules: put the changed ones back."""
    for key in ("gamma", "threshold", "sigma", "lr"):
        if key in changes:
            optimizer.set_schedule(key, getattr(config, key))


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
class _EpochResult:
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


class _Trainer:
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
            _apply_schedules(self.optimizer, config, resume_changes)
            self.start_epoch, self.step = int(checkpoint["epoch"]), int(checkpoint["step"])
        # DDP all-reduces gradients before the step, so every rank's Bop flips the same weights.
        self.forward: nn.Module = (
            nn.parallel.DistributedDataParallel(self.model) if context.enabled else self.model
        )
        self.counter = FlipCounter(self.model, self.optimizer.binary_kernels)
        self.l2_weights = first_and_last_weights(self.model) if config.l2_first_last else []
        per_rank = -(-len(self.data.train) // context.world_size)
        # a last batch of one sample is dropped: BatchNorm cannot train on one value a channel
        full, rest = divmod(per_rank, config.batch_size)
        self.drop_last = rest == 1 and full > 0
        self.steps_per_epoch = max(1, full + (rest > 0 and not self.drop_last))
        self.log_every = config.log_every or max(1, self.steps_per_epoch // 100)

    def loader(self, epoch: int) -> DataLoader:
        # Seeded per epoch, so a resumed run sees the same batches as an uninterrupted one.
        np.random.seed(self.config.seed + epoch + 1000 * self.context.rank)
        if self.context.enabled:
            sampler = DistributedSampler(
                self.data.train,
                num_replicas=self.context.world_size,
                rank=self.context.rank,
                shuffle=True,
                seed=self.config.seed,
            )
            sampler.set_epoch(epoch)
            return DataLoader(
                self.data.train,
                batch_size=self.config.batch_size,
                sampler=sampler,
                num_workers=self.config.num_workers,
                drop_last=self.drop_last,
            )
        return DataLoader(
            self.data.train,
            batch_size=self.config.batch_size,
            shuffle=True,
            num_workers=self.config.num_workers,
            generator=torch.Generator().manual_seed(self.config.seed + epoch),
            drop_last=self.drop_last,
        )

    def train_epoch(self, epoch: int, show: bool) -> _EpochResult:
        config, device = self.config, self.context.device
        self.model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        # {layer: [flips, weights]}: since the last step row, and over the epoch
        interval: dict[str, list[int]] = {}
        whole: dict[str, list[int]] = {}
        interval_steps = epoch_steps = 0
        loader = self.loader(epoch)
        last_batch = len(loader) - 1
        bar, status = progress_bars(loader, epoch, config.epochs, show)
        for index, (inputs, labels) in enumerate(bar):
            inputs = inputs.to(device, memory_format=self.memory_format)
            labels = labels.to(device)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=self.amp):
                logits = self.forward(inputs)
                loss = F.cross_entropy(logits.float(), labels)
                for weight in self.l2_weights:
                    loss = loss + config.l2_first_last * weight.float().pow(2).sum()
            self.optimizer.zero_grad()
            loss.backward()
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
        return _EpochResult(
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
                # the record every later stage reads (bnnexport.discover.BinaryKernels)
                "binary_kernels": self.kernels.to_json(),
                "latent": self.model.state_dict() if config.optimizer == "adam-latent" else None,
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
                "step": self.step,
                "config": config.to_json(),
            },
        )


def train(
    config: TrainConfig,
    resume: bool = False,
    force: bool = False,
    progress: bool | None = None,
    explicit: set[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainReport:
    """Train, checkpointing every epoch; with `resume`, continue from the run's checkpoint.

    On resume the saved configuration is used; `explicit` names the options the user gave,
    which are applied when a resumed run can take them (RESUMABLE) and refused otherwise (see
    `resumed_config`). `force` replaces a finished run, deleting only bnnexport's own files,
    and only once the configuration, the data and the model have been checked. The run
    directory is locked for the whole run (`bnnexport.runs.lock_run`).
    `progress=None` shows progress bars only when stderr is a terminal; what the data set's
    loader chose for the user (imagefolder: the images' own size) is one `bnnexport: note:`
    line on stderr unless `progress=False`, and in the report's `notes`. `log` is called with
    one line per epoch (epoch k/N, loss, accuracies, seconds) and, unless `progress=False`, with
    a note naming what `resume` removed (always in the report's `resume_removed`); without it
    the epoch line shows only under the progress bars. Under
    `torchrun`, every process trains on its share of each batch (`batch_size` is per process)
    and only rank 0 writes files, reports and logs.
    Ctrl-C raises TrainingInterrupted, saying which checkpoint `--resume` continues from.
    """
    validate_config(config)
    context = setup(config.device)
    run = RunDir(config.out)
    found = _file_identity(run.checkpoint)
    try:
        if not context.is_main:  # only rank 0 writes, so only rank 0 locks
            report = _train(config, resume, force, progress, context, explicit, log)
        else:
            with lock_run(config.out, create=True):
                report = _train(config, resume, force, progress, context, explicit, log)
        # rank 0 still writes the run directory after the last collective; a rank that tears
        # its gloo group down meanwhile was once seen to abort (SIGABRT) in CI. Only on success:
        # after an error, the other rank may be in another collective and a barrier would hang
        context.barrier()
        return report
    except KeyboardInterrupt as interrupt:
        saved_now = _file_identity(run.checkpoint) != found  # a save of this call replaced it
        raise _interrupted(run, resume, saved_now, config.device) from interrupt
    finally:
        context.shutdown()


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time) of a file, None when there is none: every checkpoint save
    renames a new file into place, so a saved checkpoint never has the identity of the old."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _interrupted(run: RunDir, resume: bool, saved_now: bool, device: str) -> TrainingInterrupted:
    """What a user who stopped training needs: which epoch the run's last checkpoint holds and
    the command that continues from it, or that no checkpoint of this run was saved."""
    epoch, epochs = _saved_epochs(run.checkpoint) if resume or saved_now else (0, 0)
    if epoch < 1:  # an `init` checkpoint (epoch 0) holds no training either
        return TrainingInterrupted(
            f"interrupted before the first checkpoint: no epoch of this run was saved in {run.root}"
        )
    if not saved_now:  # a resumed run: the options it was given are not in the checkpoint yet
        return TrainingInterrupted(
            f"interrupted before the next checkpoint: the last one (epoch {epoch}) is in "
            f"{run.root}; continue with the same command"
        )
    command = f"bnnexport train --out {shlex.quote(str(run.root))} --resume"
    if device != "cpu":  # --resume trains on the CPU unless told otherwise
        command += f" --torch-device {shlex.quote(device)}"
    return TrainingInterrupted(
        f"interrupted: the last checkpoint (epoch {epoch} of {epochs}) is in {run.root}; "
        f"continue with {command}"
    )


def _saved_epochs(path: Path) -> tuple[int, int]:
    """(epochs trained, epochs planned) of the checkpoint at `path`; (0, 0) without one."""
    try:
        checkpoint = load_checkpoint(path)
        return int(checkpoint["epoch"]), int(checkpoint["config"]["epochs"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return 0, 0


def _train(
    config: TrainConfig,
    resume: bool,
    force: bool,
    progress: bool | None,
    context: DistributedContext,
    explicit: set[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainReport:
    log = log if context.is_main else None  # under torchrun only rank 0 speaks
    run = RunDir(config.out)
    checkpoint = _check_run(run, resume, force)
    changes: dict[str, list] = {}
    if checkpoint is not None:
        config, changes = resumed_config(checkpoint, config, explicit, run.checkpoint)
        stored = _finished_report(run, checkpoint, config, changes)
        if stored is not None:
            return stored
        files.require_run_directory(run.root)  # what training on will rewrite is bnnexport's
    config.epochs = config.epochs or DEFAULT_EPOCHS
    # here, not in validate_config: on --resume the data set is the run's own, known only now
    _check_dataset_options(config.dataset, config.dataset_options)
    # Data and model are loaded before anything in the run directory changes: a bad option
    # must leave an existing run as it was, even with --force.
    trainer = _Trainer(config, run, checkpoint, context, changes)
    if trainer.data.note and context.is_main and progress is not False:
        print(f"bnnexport: note: {trainer.data.note}", file=sys.stderr)
    context.barrier()  # every rank has checked before rank 0 changes anything
    removed: list[str] = []
    if context.is_main:
        removed = _prepare_run(run, trainer, checkpoint is not None, force, changes)
    if removed and log is not None and progress is not False:  # --json: resume_removed
        names = ", ".join(removed)
        log(f"bnnexport: note: --resume: removed {names} (made from the old checkpoint)")
    context.barrier()

    show = context.is_main and (sys.stderr.isatty() if progress is None else progress)
    started = time.perf_counter()
    result, test_acc, epoch_seconds = _run_epochs(trainer, run, context, show, log)
    if checkpoint is not None and not epoch_seconds:
        test_acc = _stored_results(run, result)  # nothing left to train: the stored state
    if config.optimizer == "adam-latent":
        set_latent(trainer.model, False)
    mismatched = context.count_mismatches(list(trainer.optimizer.binary_kernels.values()))
    report = _report(trainer, run, result, test_acc, epoch_seconds, changes)
    report.seconds = time.perf_counter() - started
    report.resume_removed = removed
    report.rank_mismatched_weights = mismatched
    if context.is_main:
        from bnnexport.plots import plot_training
        from bnnexport.verify import require_strict, verify_run

        # no non-binary model leaves training silently: recorded in train.json, then raised
        verified = verify_run(run.root)
        report.strict = verified.strict
        plot_training(run)
        report.save(run.train_report)
        require_strict(verified)
    return report


def _finished_report(
    run: RunDir, checkpoint: dict, config: TrainConfig, changes: dict[str, list]
) -> TrainReport | None:
    """A run that has trained all its epochs: its stored report (nothing is rewritten)."""
    done = int(checkpoint.get("epoch", 0))
    if done < config.epochs:  # type: ignore[operator]
        return None
    if changes:
        raise ConfigError(
            f"{run.root} has finished its {done} epoch(s), so "
            f"{', '.join('--' + n.replace('_', '-') for n in changes)} would change "
            "nothing: raise --epochs to train on with them"
        )
    return _stored_report(run)


def _report(
    trainer: _Trainer,
    run: RunDir,
    result: _EpochResult,
    test_acc: float,
    epoch_seconds: list[float],
    changes: dict[str, list],
) -> TrainReport:
    config, context = trainer.config, trainer.context
    return TrainReport(
        run_dir=str(run.root),
        model=config.model,
        dataset=config.dataset,
        optimizer=config.optimizer,
        epochs=config.epochs,
        train_accuracy=result.accuracy,
        test_accuracy=test_acc,
        train_loss=result.loss,
        seconds=0.0,  # the caller's wall clock
        seconds_per_epoch=sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else 0.0,
        binary_parameters=trainer.kernels.parameters,
        flip_rate=result.flip_rate,
        mean_flip_rate=result.mean_flip_rate,
        resumed_from_epoch=trainer.start_epoch,
        world_size=context.world_size,
        resume_changes=changes,
        precision=trainer.precision,
        notes=[trainer.data.note] if trainer.data.note else [],
        **bf16_counts(trainer.model),
    )


def _prepare_run(
    run: RunDir, trainer: _Trainer, resuming: bool, force: bool, changes: dict[str, list]
) -> list[str]:
    """Rank 0, once every input is checked: make the run directory ready for training.
    Returns the names of the files a resumed run removed as made from its old checkpoint."""
    config = trainer.config
    removed: list[str] = []
    if not resuming:
        # --force: every file of the old run, whatever its name; else leftovers of a run
        # interrupted before its first checkpoint, whose metrics would otherwise be appended to.
        clear_run(run.root) if force else files.remove(run.root / n for n in TRAIN_OWNED)
        write_bytes_atomic(run.metrics, b"", append=True)
    else:
        if trainer.start_epoch < config.epochs:  # the checkpoint will change: what was made
            removed = remove_derived(run.root, "checkpoint.pt")  # from it would be stale
        # Work after the last checkpoint is redone: drop its metrics so curves do not double.
        kept = [r for r in read_jsonl(run.metrics) if r.get("step", 0) <= trainer.step]
        if changes:
            kept.append({"kind": "resume", "step": trainer.step,
                         "epoch": trainer.start_epoch, "changed": changes})  # fmt: skip
        payload = "".join(_json_line(r) for r in kept).encode()
        write_bytes_atomic(run.metrics, payload, append=True)
    # the options, and the record of binary kernels they led to (the checkpoint holds it too)
    write_json_atomic(run.config, {**config.to_json(), "binary_kernels": trainer.kernels.to_json()})
    return removed


def _run_epochs(
    trainer: _Trainer,
    run: RunDir,
    context: DistributedContext,
    show: bool,
    log: Callable[[str], None] | None = None,
) -> tuple[_EpochResult, float, list[float]]:
    """Train the remaining epochs: (last epoch's result, test accuracy, seconds per epoch).
    Each epoch ends with one line to `log` (rank 0), else under the progress bars (`show`)."""
    config = trainer.config
    epoch_seconds: list[float] = []
    result = _EpochResult(float("nan"), float("nan"), {}, trainer.step)
    test_acc = float("nan")
    for epoch in range(trainer.start_epoch, config.epochs):
        epoch_start = time.perf_counter()
        result = trainer.train_epoch(epoch, show)
        epoch_seconds.append(time.perf_counter() - epoch_start)
        if config.bn_recalibration_batches:
            # Every rank does it on its own shard, then DDP's buffer broadcast keeps rank 0's.
            batches = itertools.islice(trainer.loader(epoch), config.bn_recalibration_batches)
            recalibrate_batchnorm(trainer.model, batches, device=context.device)
        if context.is_main:
            test_acc = evaluate(trainer.model, trainer.data.test, device=context.device)
            append_jsonl(
                run.metrics,
                [
                    {
                        "kind": "epoch",
                        "step": trainer.step,
                        "epoch": epoch + 1,
                        "train_loss": result.loss,
                        "train_accuracy": result.accuracy,
                        "test_accuracy": test_acc,
                        "seconds": epoch_seconds[-1],
                        "flip_rate": result.flip_rate,
                        "mean_flip_rate": result.mean_flip_rate,
                    }
                ],
            )
            trainer.save(epoch + 1)
            files.record(run.metrics, append=True)  # what this epoch appended is ours too
            _export_metrics(run, config)
        context.barrier()
        line = (
            f"epoch {epoch + 1}/{config.epochs}: loss {result.loss:.4f} "
            f"train {result.accuracy:.4f} test {test_acc:.4f} ({epoch_seconds[-1]:.1f} s)"
        )
        if log is not None:  # a terminal, a CI log, `| tee`: one plain line each
            log(line)
        elif show:
            tqdm.write(line, file=sys.stderr)
    return result, test_acc, epoch_seconds


def _export_metrics(run: RunDir, config: TrainConfig) -> None:
    """metrics.csv (with `metrics_csv`) and TensorBoard scalars (when tensorboard is
    installed), each rewritten whole from metrics.jsonl."""
    records = read_jsonl(run.metrics)
    if config.metrics_csv:
        write_bytes_atomic(run.root / "metrics.csv", metrics_csv(records))
    write_tensorboard(run.root, records)


def _stored_results(run: RunDir, result: _EpochResult) -> float:
    """A resumed run with nothing left to train: its last recorded loss, accuracies and flip
    rates (into `result`); returns the stored test accuracy."""
    records = read_jsonl(run.metrics)
    test_acc = float("nan")
    last = [r for r in records if r.get("kind") == "epoch"]
    if last:
        result.loss, result.accuracy = last[-1]["train_loss"], last[-1]["train_accuracy"]
        test_acc = last[-1]["test_accuracy"]
    steps = [r for r in records if r.get("kind") == "step"]
    if last and "flip_rate" in last[-1]:
        result.flip_rate = last[-1]["flip_rate"]
        result.mean_flip_rate = last[-1]["mean_flip_rate"]
    elif steps:  # runs from before epoch rows held π: never record emptied flip rates
        result.flip_rate = steps[-1].get("flip_rate", {})
    return test_acc


def _stored_report(run: RunDir) -> TrainReport | None:
    """The train.json of a finished run, or None when it is missing or from another version."""
    try:
        return TrainReport(**json.loads(run.train_report.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def default_out(model: str, dataset: str) -> str:
    """Default run directory for a model and data set (an import string by its attribute:
    `mynets:small_bnn` -> small_bnn).

    Example:
        >>> default_out("mynets:small_bnn", "mnist5k")
        'runs/small_bnn-mnist5k'
    """
    model, dataset = (name.rpartition(":")[2] for name in (model, dataset))
    return str(Path("runs") / f"{model}-{dataset}")
