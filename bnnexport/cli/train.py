"""`bnnexport train`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from bnnexport.cli.common import (
    FloatList,
    ImageSize,
    NameList,
    choice_option,
    count_option,
    emit,
    given_options,
    handle_errors,
    json_option,
    name_or_import_option,
    number_or_schedule,
)
from bnnexport.converters.choices import LAYER_PRECISIONS
from bnnexport.datasets import list_datasets
from bnnexport.errors import ConfigError
from bnnexport.models import list_models
from bnnexport.nn.precision import PRECISIONS
from bnnexport.optim.composite import OPTIMIZERS, Hyperparameter, all_hyperparameters
from bnnexport.stages.train import train
from bnnexport.training.config import (
    BN_EVAL,
    DEFAULT_EPOCHS,
    TrainConfig,
    config_keys,
    default_out,
)

DEFAULTS = TrainConfig()


def dataset_options(
    image_size: int | list[int] | str | None,
    mean: list[float] | None,
    std: list[float] | None,
    val_split: float | None,
) -> dict:
    """The data set options given (config.json's `dataset_options`)."""
    given = {"image_size": image_size, "mean": mean, "std": std, "val_split": val_split}
    return {key: value for key, value in given.items() if value is not None}


RESUME_OUT = "\0out"  # `--resume` without a value: the run in --out


def resumed_out(resume: str | None, out: str | None) -> str | None:
    """The --out of `--resume RUN` (how it is often typed first): RUN, unless --out names
    another run (ConfigError)."""
    if resume is None or resume == RESUME_OUT:
        return out
    if out is not None and os.path.abspath(out) != os.path.abspath(resume):
        raise ConfigError(f"--resume {resume} --out {out}: two runs; give one (--resume RUN)")
    return resume


DATASET_OPTIONS = ("image_size", "mean", "std", "val_split")
# train's options that are no part of a TrainConfig: how the command runs, not what it trains
NOT_CONFIG = ("resume", "force", "as_json", "amp", "recipe")


def train_config(values: dict[str, Any], given: set[str]) -> tuple[TrainConfig, set[str]]:
    """The one way from `bnnexport train`'s options to a `TrainConfig`, for train, pipeline
    and sweep (and the names of the config fields the user gave: what a recipe or a resumed
    run takes from the command line).

    `values` holds every option of train by its parameter name (as click parsed it; `device`
    is the torch device), `given` the names the user typed. With `--recipe`, the recipe's
    settings with every given option applied over them (`bnnexport.training.recipes.recipe_config`).
    An optional `optimizers` entry (sweep's list) is what a hyperparameter given is checked
    against (`refuse_unused`).
    """
    resume = bool(values.get("resume"))
    epochs = values["epochs"]
    own = all_hyperparameters()
    config = TrainConfig.from_json({
        "model": values["model"], "dataset": values["dataset"], "data_dir": values["data_dir"],
        "dataset_options": dataset_options(*(values[k] for k in DATASET_OPTIONS)),
        "optimizer": values["optimizer"], "init_sign": values["init_sign"],
        "binary": list(values["binary"] or []),
        **{name: _hyperparameter_value(h, values[name]) for name, h in own.items()},
        "epochs": epochs if epochs is not None or resume else DEFAULT_EPOCHS,
        "batch_size": values["batch_size"], "seed": values["seed"],
        "out": values["out"] or default_out(values["model"], values["dataset"]),
        "device": values["device"],
        "precision": "amp" if values["amp"] else values["precision"],
        "log_every": values["log_every"], "eval_every": values["eval_every"],
        "metrics_csv": values["metrics_csv"],
        "sync_batchnorm": not values["per_process_batchnorm"],
        "bn_eval": values["bn_eval"], "float_layers": values["float_layers"],
    })  # fmt: skip
    explicit = {name for name in given if name in config_keys()}
    explicit |= {"precision"} if "amp" in given else set()
    explicit |= {"sync_batchnorm"} if "per_process_batchnorm" in given else set()
    if given & set(DATASET_OPTIONS):  # each is checked against the run's own on --resume
        explicit.add("dataset_options")
    if not resume:
        refuse_unused(given, values.get("optimizers") or [config.optimizer])
    if values.get("recipe") is not None:
        config = _from_recipe(values["recipe"], config, explicit, resume, values["out"])
    return config, explicit


def refuse_unused(given: set[str], optimizers: list[str]) -> None:
    """ConfigError when a hyperparameter given belongs to none of `optimizers` (unless it is
    declared `refused_elsewhere=False`): `--sigma` with `--optimizer bop` would do nothing."""
    for name, hyperparameter in all_hyperparameters().items():
        if name not in given or not hyperparameter.refused_elsewhere:
            continue
        if not any(name in OPTIMIZERS[o].names for o in optimizers):
            owners = " and ".join(n for n, e in OPTIMIZERS.items() if name in e.names)
            raise ConfigError(f"{hyperparameter.flag} is {owners}'s {hyperparameter.what}; "
                              f"--optimizer {','.join(optimizers)} has none")  # fmt: skip


def _hyperparameter_value(hyperparameter: Hyperparameter, text: str) -> float | str:
    """The option's text as a number or, where the optimizer takes one, a schedule."""
    if hyperparameter.schedulable:
        return number_or_schedule(text)
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{hyperparameter.flag} {text!r}: not a number") from None


def hyperparameter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per registered optimizer hyperparameter (`composite.OPTIMIZERS`), its flag,
    default and help as its optimizer declares them, in `all_hyperparameters`' order."""
    for hyperparameter in reversed(all_hyperparameters().values()):
        command = click.option(
            hyperparameter.flag,
            hyperparameter.name,
            default=str(hyperparameter.default),
            show_default=True,
            help=hyperparameter.help,
        )(command)
    return command


def _from_recipe(
    recipe: str, options: TrainConfig, explicit: set[str], resume: bool, out: str | None
) -> TrainConfig:
    """Recipe `recipe` with every option the user gave applied over it."""
    from bnnexport.training.recipes import recipe_config

    if resume:
        raise ConfigError("--recipe with --resume: a resumed run keeps its own configuration")
    given = {name: options.value(name) for name in explicit if name != "out"}
    return recipe_config(recipe, **given, out=out)


@click.command("train")
@name_or_import_option(
    "--model",
    choices=list_models(),
    what="factory",
    default=DEFAULTS.model,
    help="Model from the registry (`bnnexport zoo list`), or your own as module:factory "
    "(imported with the current directory on the path; called with num_classes and "
    "input_shape as far as it takes them; recorded in the run for export, convert, bench "
    "and --resume).",
)
@name_or_import_option(
    "--dataset",
    choices=list_datasets(),
    what="loader",
    default=DEFAULTS.dataset,
    help="mnist5k ships inside the package; cifar10 reads a local cifar-10-batches-py; "
    "imagefolder reads ROOT/train/CLASS/ and ROOT/val/CLASS/, or ROOT/CLASS/ with "
    "--val-split; module:loader is your own: loader(data_dir, augment) returning a "
    "bnnexport.datasets.splits.DatasetSplits.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of the data set (cifar10: the cifar-10-batches-py folder; imagefolder: ROOT).",
)
@click.option(
    "--image-size",
    type=ImageSize(),
    default=None,
    metavar="N|HxW|imagenet",
    help="imagefolder: N, HxW or H,W (height x width, e.g. 40x48) resizes every image whole "
    "to that size; imagenet takes ImageNet's random-resized 224 crops (the ImageNet recipes "
    "set it). Training adds a horizontal flip. The run records the size used. [default: the "
    "images' own size when they all share one (said in one line); else an error asking for "
    "this option]",
)
@click.option(
    "--mean",
    type=FloatList(),
    default=None,
    help="imagefolder: per-channel mean (1 or 3 values, pixels in [0, 1]) subtracted before "
    "dividing by --std. [default: pixels scaled to [-1, 1]]",
)
@click.option(
    "--std",
    type=FloatList(),
    default=None,
    help="imagefolder: per-channel standard deviation (1 or 3 values > 0), with --mean.",
)
@click.option(
    "--val-split",
    type=float,
    default=None,
    metavar="FRACTION",
    help="imagefolder with a plain ROOT/CLASS/ folder: the fraction of each class (drawn "
    "with a fixed seed) held out for validation.",
)
@choice_option(
    "--optimizer",
    choices=sorted(OPTIMIZERS),
    default=DEFAULTS.optimizer,
    help="; ".join(f"{name}: {entry.summary}" for name, entry in OPTIMIZERS.items()) + ".",
)
@click.option(
    "--init-sign",
    is_flag=True,
    help="Bop: set binary kernels that are not exactly ±1 (a model of your own initialised "
    "with real weights) to sign(w), ties to +1, and say so; without it they are refused.",
)
@click.option(
    "--binary",
    type=NameList(),
    default=None,
    help="The binary kernels Bop trains, by parameter name or shell-style glob "
    "(`w1,blocks.*.conv.weight`), when tracing the model cannot tell (it asks for this); "
    "recorded in config.json. [default: found by tracing one forward pass]",
)
@hyperparameter_options
@count_option(
    "--epochs",
    default=None,
    help="Epochs to train [default: 5]; with --resume, the total to reach "
    "[default: the run's own].",
)
@count_option(
    "--batch-size",
    default=DEFAULTS.batch_size,
    help="Images per optimizer step, all processes together (a recipe's batch is one too): "
    "under torchrun each of N processes takes batch-size / N, so schedules, steps per epoch "
    "and every step's γ, τ and lr are those of one process; a batch N does not divide is "
    "refused. config.json records it and batch_size_per_process.",
)
@click.option(
    "--seed",
    type=int,
    default=DEFAULTS.seed,
    show_default=True,
    help="Seed for initialisation, shuffling and augmentation.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Run directory to write. [default: runs/MODEL-DATASET]",
)
@click.option(
    "--log-every",
    type=click.IntRange(min=0),
    default=DEFAULTS.log_every,
    help="Optimizer steps per metrics row (each row says how many steps it covers; π_t stays "
    "a per-step rate). [default: 0, about 100 rows per epoch]",
)
@click.option(
    "--eval-every",
    type=click.IntRange(min=0),
    default=DEFAULTS.eval_every,
    help="Also measure test accuracy every N optimizer steps (rows of kind 'eval'). "
    "[default: 0, once per epoch]",
)
@click.option(
    "--metrics-csv",
    is_flag=True,
    help="Also write metrics.csv (every metrics row, one column per layer value) each epoch.",
)
@click.option(
    "--resume",
    is_flag=False,
    flag_value=RESUME_OUT,
    default=None,
    metavar="[RUN]",
    help="Continue the run in --out (or in RUN: `--resume RUN` is `--resume --out RUN`) from "
    "its last checkpoint.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start over in --out even if it already holds a run (its files are replaced).",
)
@click.option(
    "--torch-device",
    "--device",
    "device",
    default="cpu",
    show_default=True,
    help="Torch device to train on (cpu, cuda). Under torchrun each process takes the "
    "GPU of its LOCAL_RANK. (--device is the deprecated spelling: in bench and "
    "pipeline --device is the SSH target.)",
)
@choice_option(
    "--precision",
    choices=PRECISIONS,
    default=DEFAULTS.precision,
    help="How the binary layers compute. bf16-exact: their forward in bf16 where the ±1 sums "
    "are exact (checked per call, float32 otherwise), so training equals float32 bit for bit; "
    "bf16: their backward in bf16 too (gradients rounded, faster, not exact); amp: bf16 "
    "autocast over the whole model, first layer and BatchNorm included (fastest, not exact); "
    "auto: bf16-exact on hardware with bf16 arithmetic, else float32. Binary weights and "
    "Bop's state always stay float32.",
)
@click.option("--amp", is_flag=True, hidden=True, help="Deprecated spelling of --precision amp.")
@choice_option(
    "--float-layers",
    choices=LAYER_PRECISIONS,
    default=DEFAULTS.float_layers,
    help="int8: quantization-aware training of the float layers (stem, shortcut convs, head): "
    "PyTorch's fake quantization on their inputs, outputs and kernels (per output channel), "
    "the ranges learnt while training; the binary kernels train with Bop as always. export "
    "writes the ranges into model.onnx and convert runs these layers in int8 "
    "(model-TARGET-int8.tflite) without calibrating.",
)
@click.option(
    "--per-process-batchnorm",
    is_flag=True,
    help="torch's own BatchNorm: under torchrun each process normalises over its own "
    "--batch-size samples, so N processes no longer train as one; a little faster. [default: "
    "statistics over the global batch, computed alike in one process and in N] Recorded in "
    "config.json (sync_batchnorm).",
)
@choice_option(
    "--bn-eval",
    choices=BN_EVAL,
    default=DEFAULTS.bn_eval,
    help="BatchNorm statistics for evaluation and the saved model. recalibrate: re-estimated "
    "on 20 training batches before each evaluation and checkpoint (flips move "
    "pre-activations faster than running averages follow); moving: the running averages "
    "training kept, as Keras evaluates. A recipe takes the authors' (moving) unless given.",
)
@click.option(
    "--recipe",
    default=None,
    metavar="NAME",
    help="Start from one of the paper's recipes (`bnnexport recipes`); flags given "
    "explicitly override it, and a different --epochs rescales its schedules.",
)
@json_option
@handle_errors
def train_command(resume: str | None, out: str | None, force: bool, as_json: bool,
                  **options: Any) -> None:  # fmt: skip
    """Train a BNN and write checkpoint, metrics and plots into a run directory.

    Data-parallel: `torchrun --nproc-per-node=N -m bnnexport train ...` (gloo on CPU, NCCL on
    GPUs); --batch-size is the global batch, B/N images per process, so N processes train on
    the batches of one process at B, with BatchNorm over the whole batch, the same steps and
    schedules, and step rows that are the whole batch's.

    Checkpoints are written atomically after every epoch; an interrupted run continues with
    --resume, which removes what was made from the old checkpoint (ONNX model, flatbuffers,
    bench results and report) and names it. Progress bars appear only on a terminal and never
    with --json; one line per epoch goes to stderr in every case (a CI log, `| tee`).
    """
    values = {**options, "resume": resume is not None, "out": resumed_out(resume, out)}
    config, explicit = train_config(values, given_options(click.get_current_context()))
    # what train chose for the user (a recipe's scaled schedules, ...) is in report.notes and,
    # without --json, one `bnnexport: note:` line each
    report = train(
        config,
        resume=values["resume"],
        force=force,
        progress=None if not as_json else False,
        explicit=explicit,
        log=lambda line: click.echo(line, err=True),  # one line per epoch, --json or not
    )
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 reports
        title = f"trained {report.model} on {report.dataset} -> {report.run_dir}"
        emit(report, as_json, title=title)
