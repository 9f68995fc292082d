"""`TrainConfig`: everything that defines a training run, and the checks of its values.

Saved in config.json and the checkpoint; `validate_config` refuses, in one line, a value no
training could use before anything is written.

Example:
    >>> TrainConfig().gamma, TrainConfig().epochs
    (0.001, 5)
    >>> default_out("mynets:small_bnn", "mnist5k")
    'runs/small_bnn-mnist5k'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bnnexport.converters.choices import LAYER_PRECISIONS
from bnnexport.datasets.imagefolder import parse_image_size
from bnnexport.errors import ConfigError
from bnnexport.nn.precision import PRECISIONS
from bnnexport.optim.composite import (
    GAMMA_OPTION,
    LR_OPTION,
    THRESHOLD_OPTION,
    all_hyperparameters,
)

DEFAULT_EPOCHS = 5
BN_EVAL = ("recalibrate", "moving")  # TrainConfig.bn_eval


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in config.json and the checkpoint).

    `gamma`, `threshold` and `lr` accept a number or a schedule in text form
    (`bnnexport.optim.schedules`, counted in optimizer steps).
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
    # model (bnnexport.nn.discover). The decision itself is the checkpoint's `binary_kernels`.
    binary: list[str] = field(default_factory=list)
    # every Bop variant's γ and τ and Adam's lr, as their optimizers declare them
    # (bnnexport.optim.composite: the registry), one set for all
    gamma: float | str = GAMMA_OPTION.default
    threshold: float | str = THRESHOLD_OPTION.default
    lr: float | str = LR_OPTION.default
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
    # the hyperparameters besides γ, τ and lr that registered optimizers declare (bop2's
    # sigma), each at its declared default unless given: config.json holds them flat, here
    hyperparameters: dict[str, float | str] = field(default_factory=lambda: own_defaults())
    # L2 penalty λ·Σw² on the first and last weight layers (the paper's XNOR-Net recipe)
    l2_first_last: float = 0.0
    recipe: str | None = None  # the recipe this run started from (bnnexport.training.recipes)
    recipe_overrides: dict[str, Any] = field(default_factory=dict)  # what the user changed
    # bnnexport.nn.precision: "auto" = bf16 for the binary layers' forward where that is exact
    # (training identical to float32 bit for bit) on bf16 hardware, float32 elsewhere
    precision: str = "auto"
    # How evaluation and the checkpoint get BatchNorm's statistics: "recalibrate" re-estimates
    # them on `bn_recalibration_batches` training batches before each (flips shift
    # pre-activations faster than running averages follow); "moving": the running averages
    # training kept, as Keras evaluates (the recipes' default: the authors' protocol)
    bn_eval: str = "recalibrate"
    bn_recalibration_batches: int = 20
    # BatchNorm statistics over the global batch (all processes' samples under torchrun),
    # computed alike in one process and in N (training.distributed.AllReduceBatchNorm);
    # False: torch's own BatchNorm, each process over its own share
    sync_batchnorm: bool = True
    # "int8": quantization-aware training of the float layers (bnnexport.nn.int8: fake
    # quantization around every float conv and dense layer), for `convert --float-layers int8`
    float_layers: str = "float32"

    def to_json(self) -> dict[str, Any]:
        """The fields, with `hyperparameters` flat among them (config.json's form)."""
        flat: dict[str, Any] = {}
        for key, value in dataclasses.asdict(self).items():
            flat.update(value if key == "hyperparameters" else {key: value})
        return flat

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> TrainConfig:
        """A TrainConfig from `to_json`'s form (or any part of it): a registered optimizer's
        hyperparameter goes into `hyperparameters`. TypeError naming a key it has no place for."""
        unknown = set(values) - set(config_keys())
        if unknown:
            raise TypeError(f"not TrainConfig fields: {', '.join(sorted(unknown))}")
        own = {k: v for k, v in values.items() if k not in FIELDS}
        fields = {k: v for k, v in values.items() if k in FIELDS}
        return cls(**fields, hyperparameters={**own_defaults(), **own})

    def value(self, name: str) -> Any:
        """A field's value or a registered hyperparameter's (`config_keys`)."""
        return getattr(self, name) if name in FIELDS else self.hyperparameters[name]

    def set_value(self, name: str, value: Any) -> None:
        """Set a field or a registered hyperparameter (a new dict: copies share the old)."""
        if name in FIELDS:
            setattr(self, name, value)
        else:
            self.hyperparameters = {**self.hyperparameters, name: value}

    @property
    def recalibration_batches(self) -> int:
        """Training batches BatchNorm's statistics are re-estimated on before an evaluation or
        a checkpoint: 0 with `bn_eval` "moving"."""
        return self.bn_recalibration_batches if self.bn_eval == "recalibrate" else 0


FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "hyperparameters")


def own_defaults() -> dict[str, float | str]:
    """{name: declared default} of every registered hyperparameter that is no field."""
    return {k: h.default for k, h in all_hyperparameters().items() if k not in FIELDS}


def config_keys() -> tuple[str, ...]:
    """What a TrainConfig holds by name: its fields and every registered optimizer's
    hyperparameters (config.json's keys, less the run's records)."""
    return (*FIELDS, *own_defaults())


def validate_config(config: TrainConfig) -> None:
    """Raise ConfigError for a value no training could use, before anything is written.
    Schedules are checked over their own course here (`check_schedules` checks them over the
    run's steps once the data fix how many there are)."""
    check_schedules(config)
    if not config.l2_first_last >= 0:
        raise ConfigError(f"l2_first_last {config.l2_first_last}: must be >= 0")
    if config.log_every < 0 or config.eval_every < 0:
        raise ConfigError("--log-every and --eval-every must be >= 0 (0: the default)")
    if config.precision not in PRECISIONS:
        raise ConfigError(f"--precision {config.precision!r} is not one of {', '.join(PRECISIONS)}")
    if config.bn_eval not in BN_EVAL:
        raise ConfigError(f"--bn-eval {config.bn_eval!r} is not one of {', '.join(BN_EVAL)}")
    if config.float_layers not in LAYER_PRECISIONS:
        raise ConfigError(
            f"--float-layers {config.float_layers!r} is not one of {', '.join(LAYER_PRECISIONS)}"
        )
    if config.batch_size < 1 or (config.epochs is not None and config.epochs < 1):
        raise ConfigError("--batch-size and --epochs must be at least 1")
    try:
        kind = torch.device(config.device).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"unknown torch device {config.device!r}: use cpu, cuda or cuda:N")


IMAGEFOLDER_OPTIONS = ("image_size", "mean", "std", "val_split")


def check_dataset_options(dataset: str, options: dict[str, Any]) -> None:
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


def check_schedules(config: TrainConfig, steps: int | None = None) -> None:
    """ConfigError, in one line naming the option and the first step whose value leaves its
    range, when a value of a registered optimizer's hyperparameter (`lr`, `gamma`, ...) does at
    any of the run's `steps` optimizer steps (None: over each schedule's own course,
    `horizon()`), or is a schedule where its optimizer takes a number only."""
    from bnnexport.optim.schedules import as_schedule, first_step_outside, schedule_to_dict

    for key, hyperparameter in all_hyperparameters().items():
        option, ok, rule = hyperparameter.flag, hyperparameter.ok, hyperparameter.rule
        value = config.value(key)
        if not hyperparameter.schedulable and not isinstance(value, (int, float)):
            raise ConfigError(f"{option} {value}: a number (it takes no schedule)")
        try:
            schedule = as_schedule(value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{option} {value}: {error}") from None
        numbers = [v for v in schedule_to_dict(schedule).values() if isinstance(v, (int, float))]
        if not all(np.isfinite(numbers)):
            raise ConfigError(f"{option} {value}: not a finite number")
        step = first_step_outside(schedule, ok, steps)
        if step is not None:
            where = (
                ""
                if step == 0
                else f" at step {step}" + (f" of the run's {steps}" if steps is not None else "")
            )
            raise ConfigError(f"{option} {value}: {schedule(step):g}{where}, {rule}")


def default_out(model: str, dataset: str) -> str:
    """Default run directory for a model and data set (an import string by its attribute:
    `mynets:small_bnn` -> small_bnn).

    Example:
        >>> default_out("mynets:small_bnn", "mnist5k")
        'runs/small_bnn-mnist5k'
    """
    model, dataset = (name.rpartition(":")[2] for name in (model, dataset))
    return str(Path("runs") / f"{model}-{dataset}")
