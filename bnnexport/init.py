"""`init_run(model) -> InitReport`: an initialised, untrained run directory for any zoo model.

The checkpoint has the format `bnnexport train` writes (docs/ARCHITECTURE.md), so export, convert
and bench take it as they take a trained run. Kernels are strictly ±1 (the binary layers start
that way). BatchNorm statistics and affine parameters are drawn at random around their defaults:
a fresh BatchNorm (β = 0, mean 0, variance 1) passes a binary conv's integer sums through
unchanged, so exact zeros reach the next sign, where torch says +1 and LCE may say -1
(docs/LCE_NOTES.md "Running flatbuffers", "Exact zeros before a sign"). With non-integer statistics
a tie has probability zero, and the converted model agrees with PyTorch as a trained one does.

Example:
    >>> from bnnexport.init import init_run
    >>> report = init_run("quicknet", input_shape=(3, 64, 64), out="runs/qn")  # doctest: +SKIP
    >>> report.binary_layers                                                    # doctest: +SKIP
    16
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bnnexport import files
from bnnexport.errors import CheckpointError, ConfigError
from bnnexport.layers import batch_norms, binary_layers
from bnnexport.models import create_model, model_info
from bnnexport.reports import Report, write_json_atomic
from bnnexport.runs import RunDir, clear_run, lock_run, save_checkpoint


@dataclass
class InitReport(Report):
    """What `bnnexport init` prints."""

    run_dir: str
    model: str
    input_shape: list[int]
    num_classes: int
    parameters: int
    binary_parameters: int
    binary_layers: int
    seconds: float


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> None:
    """Give every BatchNorm non-trivial statistics (and affine parameters where trainable).

    Means are drawn with spread 0.5 and variances in [0.5, 2]: small enough to leave the
    activations' scale as at initialisation, irrational enough that no binary conv's integer
    sum lands exactly on a sign's threshold. A frozen scale (`scale_free_bn`) stays 1.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in batch_norms(model):
            n = module.num_features
            if module.running_mean is not None:
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.5)
            if module.affine:
                if module.weight.requires_grad:
                    module.weight.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.1)


def save_untrained_checkpoint(path: str | Path, name: str, model: nn.Module, config: dict) -> None:
    """Write `model` as a checkpoint of epoch 0 in the format `bnnexport train` writes."""
    save_checkpoint(
        path,
        {
            "model_name": name,
            "model_kwargs": {k: v for k, v in model.bnnexport_config.items() if k != "name"},
            "model": model.state_dict(),
            "latent": None,
            "optimizer": {},
            "epoch": 0,
            "step": 0,
            "config": config,
        },
    )


def init_model(
    name: str,
    input_shape: tuple[int, int, int] | None = None,
    num_classes: int | None = None,
    seed: int = 0,
) -> nn.Module:
    """A zoo model with ±1 kernels and randomised BatchNorm, in eval mode."""
    torch.manual_seed(seed)
    model = create_model(name, num_classes=num_classes, input_shape=input_shape)
    randomize_batchnorm(model, seed)
    return model.eval()


def init_run(
    name: str,
    input_shape: tuple[int, int, int] | None = None,
    num_classes: int | None = None,
    out: str | Path | None = None,
    force: bool = False,
    seed: int = 0,
    dataset: str | None = None,
    data_dir: str | None = None,
) -> InitReport:
    """Write RUN_DIR/checkpoint.pt and config.json for an untrained `name`.

    `dataset` (optional) is recorded in the configuration so `bnnexport export` takes its test
    samples from it; without one, export falls back to its default data set.
    Raises CheckpointError when `out` already holds a checkpoint and `force` is off.
    """
    start = time.perf_counter()
    model_info(name)  # an unknown name fails here, before anything else
    run = RunDir(out or Path("runs") / f"{name}-init")
    if run.checkpoint.is_file() and not force:
        raise CheckpointError(f"{run.root} already holds a run: use --force or another --out")
    try:  # the model first: a bad size must leave an existing run as it was, even with --force
        model = init_model(name, input_shape, num_classes, seed)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    files.require_run_directory(run.root)  # with or without --force: the user's files stay
    with lock_run(run.root, create=True):
        if run.checkpoint.is_file() and not force:  # another command may have written one since
            raise CheckpointError(f"{run.root} already holds a run: use --force or another --out")
        files.require_run_directory(run.root)
        clear_run(run.root)
        return _write_init_run(run, name, model, seed, dataset, data_dir, start)


def _write_init_run(
    run: RunDir,
    name: str,
    model: nn.Module,
    seed: int,
    dataset: str | None,
    data_dir: str | None,
    start: float,
) -> InitReport:
    kwargs = {k: v for k, v in model.bnnexport_config.items() if k != "name"}
    config = {
        "model": name,
        "model_kwargs": {
            k: v for k, v in kwargs.items() if k not in ("num_classes", "input_shape")
        },
        "input_shape": kwargs["input_shape"],
        "num_classes": kwargs["num_classes"],
        "seed": seed,
        "epochs": 0,
        "initialised_only": True,
    }
    if dataset is not None:
        config.update(dataset=dataset, data_dir=data_dir)
    save_untrained_checkpoint(run.checkpoint, name, model, config)
    write_json_atomic(run.config, config)
    layers = binary_layers(model)
    report = InitReport(
        run_dir=str(run.root),
        model=model_info(name).name,
        input_shape=list(kwargs["input_shape"]),
        num_classes=int(kwargs["num_classes"]),
        parameters=sum(p.numel() for p in model.parameters()),
        binary_parameters=sum(layer.weight.numel() for _, layer in layers),
        binary_layers=len(layers),
        seconds=time.perf_counter() - start,
    )
    return report
