"""`init_run(model) -> InitReport`: an initialised, untrained run directory for any model: a
zoo name or your own `module:factory`.

The checkpoint has the format `bnnexport train` writes (docs/ARCHITECTURE.md), record of binary
kernels included (decided by `bnnexport.nn.discover.find_binary_kernels`, as training decides it),
so summary, verify, pack, export, convert and bench take it as they take a trained run. Kernels
are strictly ±1 (bnnexport's binary layers start that way; a model of your own's recorded
kernels are set to sign(w), ties to +1). BatchNorm statistics and affine parameters are
drawn at random around their defaults: a fresh BatchNorm (β = 0, mean 0, variance 1) passes a
binary conv's integer sums through unchanged, so exact zeros reach the next sign, where torch
says +1 and LCE may say -1 (docs/LCE_NOTES.md "Running flatbuffers", "Exact zeros before a
sign"). With non-integer statistics a tie has probability zero, and the converted model
agrees with PyTorch as a trained one does.

Example:
    >>> from bnnexport.stages.init import init_run
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

from bnnexport.errors import CheckpointError, ConfigError
from bnnexport.imports import import_object, is_import_string, source_of
from bnnexport.models import create_model, model_info
from bnnexport.nn.discover import BinaryKernels, find_binary_kernels
from bnnexport.nn.layers import batch_norms
from bnnexport.nn.quantizers import binarize
from bnnexport.run import files
from bnnexport.run.checkpoint import save_checkpoint
from bnnexport.run.directory import RunDir, clear_run, lock_run
from bnnexport.stages.report import Report, write_json_atomic


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


def save_untrained_checkpoint(
    path: str | Path,
    name: str,
    model: nn.Module,
    config: dict,
    kernels: BinaryKernels | None = None,
) -> None:
    """Write `model` as a checkpoint of epoch 0 in the format `bnnexport train` writes, with
    its record of binary kernels (None: decided now) and those kernels binarized."""
    kernels = kernels if kernels is not None else find_binary_kernels(model)
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    for kernel in kernels.names:
        state[kernel] = binarize(state[kernel])
    save_checkpoint(
        path,
        {
            "model_name": name,
            "model_kwargs": {k: v for k, v in model.bnnexport_config.items() if k != "name"},
            "model_source": source_of(name),
            "model": state,
            "binary_kernels": kernels.to_json(),
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
    """A model (zoo name or `module:factory`) with randomised BatchNorm, in eval mode; a zoo
    model's kernels are ±1 already."""
    torch.manual_seed(seed)
    if is_import_string(name):
        input_shape = input_shape or _factory_input_shape(name)
    model = create_model(name, num_classes=num_classes, input_shape=input_shape)
    randomize_batchnorm(model, seed)
    return model.eval()


def _factory_input_shape(name: str) -> tuple[int, int, int]:
    """The default of a factory's `input_shape` argument; ConfigError asking for --input-shape
    when it has none (a run needs the shape for its record, export and bench)."""
    import inspect

    factory = import_object(name, "--model")
    try:
        parameter = inspect.signature(factory).parameters.get("input_shape")
    except (TypeError, ValueError):
        parameter = None
    default = None if parameter is None else parameter.default
    if default is None or default is inspect.Parameter.empty:
        raise ConfigError(f"--model {name}: give its input with --input-shape C,H,W")
    return tuple(int(v) for v in default)  # type: ignore[return-value]


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
    if not is_import_string(name):
        model_info(name)  # an unknown name fails here, before anything else
    run = RunDir(out or Path("runs") / f"{name.rpartition(':')[2]}-init")
    if run.checkpoint.is_file() and not force:
        raise CheckpointError(f"{run.root} already holds a run: use --force or another --out")
    try:  # the model first: a bad size must leave an existing run as it was, even with --force
        model = init_model(name, input_shape, num_classes, seed)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    kernels = find_binary_kernels(model)
    files.require_run_directory(run.root)  # with or without --force: the user's files stay
    with lock_run(run.root, create=True):
        if run.checkpoint.is_file() and not force:  # another command may have written one since
            raise CheckpointError(f"{run.root} already holds a run: use --force or another --out")
        files.require_run_directory(run.root)
        clear_run(run.root)
        return _write_init_run(run, name, model, kernels, (seed, dataset, data_dir), start)


def _write_init_run(
    run: RunDir,
    name: str,
    model: nn.Module,
    kernels: BinaryKernels,
    origin: tuple[int, str | None, str | None],
    start: float,
) -> InitReport:
    """checkpoint.pt and config.json of the run; `origin` is (seed, dataset, data_dir)."""
    seed, dataset, data_dir = origin
    kwargs = {k: v for k, v in model.bnnexport_config.items() if k != "name"}
    num_classes = int(kwargs.get("num_classes") or _output_width(model, kwargs["input_shape"]))
    config = {
        "model": name,
        "model_kwargs": {
            k: v for k, v in kwargs.items() if k not in ("num_classes", "input_shape")
        },
        "input_shape": kwargs["input_shape"],
        "num_classes": num_classes,
        "seed": seed,
        "epochs": 0,
        "initialised_only": True,
        "binary_kernels": kernels.to_json(),
        "model_source": source_of(name),
    }
    if dataset is not None:
        config.update(dataset=dataset, data_dir=data_dir)
    save_untrained_checkpoint(run.checkpoint, name, model, config, kernels)
    write_json_atomic(run.config, config)
    return InitReport(
        run_dir=str(run.root),
        model=name,
        input_shape=list(kwargs["input_shape"]),
        num_classes=num_classes,
        parameters=sum(p.numel() for p in model.parameters()),
        binary_parameters=kernels.parameters,
        binary_layers=len(kernels),
        seconds=time.perf_counter() - start,
    )


@torch.no_grad()
def _output_width(model: nn.Module, input_shape: list[int]) -> int:
    """The number of outputs (classes) of a model whose factory chose it itself."""
    return int(model(torch.zeros(1, *input_shape)).shape[-1])
