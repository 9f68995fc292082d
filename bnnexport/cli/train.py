"""`bnnexport train`."""

from __future__ import annotations

import os

import click

from bnnexport.cli.common import (
    FloatList,
    ImageSize,
    choice_option,
    count_option,
    emit,
    handle_errors,
    json_option,
    name_or_import_option,
    number_or_schedule,
)
from bnnexport.datasets import list_datasets
from bnnexport.errors import ConfigError
from bnnexport.models import list_models
from bnnexport.optimizers import OPTIMIZERS
from bnnexport.precision import PRECISIONS
from bnnexport.train import TrainConfig, default_out, train

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


RECIPE_OVERRIDABLE = ("model", "dataset", "data_dir", "optimizer", "gamma", "threshold", "lr",
                      "sigma", "epochs", "batch_size", "seed")  # fmt: skip


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
    help="bop: Bop on binary kernels + Adam on real parameters; adam-latent: Adam on "
    "real latent weights binarized with the STE (the baseline; binary kernels start "
    "Glorot-uniform, a model of your own's too).",
)
@click.option(
    "--init-sign",
    is_flag=True,
    help="Bop: set binary kernels that are not exactly ±1 (a model of your own initialised "
    "with real weights) to sign(w), ties to +1, and say so; without it they are refused.",
)
@click.option(
    "--gamma",
    default=str(DEFAULTS.gamma),
    show_default=True,
    help="Bop adaptivity rate γ: a number, 'step:G0,FACTOR,EVERY_STEPS' or "
    "'linear:START,END,STEPS'.",
)
@click.option(
    "--threshold",
    default=str(DEFAULTS.threshold),
    show_default=True,
    help="Bop flip threshold τ: a number or a schedule as for --gamma.",
)
@click.option(
    "--lr",
    default=str(DEFAULTS.lr),
    show_default=True,
    help="Adam learning rate for real-valued parameters (and latent weights with "
    "adam-latent): a number or a schedule.",
)
@click.option(
    "--sigma",
    default=str(DEFAULTS.sigma),
    show_default=True,
    help="bop2's second-moment rate σ in (0, 1]: v <- v + σ(g² - v); a number or a schedule. "
    "Refused with any other optimizer.",
)
@count_option(
    "--epochs",
    default=None,
    help="Epochs to train [default: 5]; with --resume, the total to reach "
    "[default: the run's own].",
)
@count_option("--batch-size", default=DEFAULTS.batch_size, help="Images per optimizer step.")
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
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
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
@click.option(
    "--recipe",
    default=None,
    metavar="NAME",
    help="Start from one of the paper's recipes (`bnnexport recipes`); flags given "
    "explicitly override it, and a different --epochs rescales its schedules.",
)
@json_option
@handle_errors
def train_command(
    model,
    dataset,
    data_dir,
    image_size,
    mean,
    std,
    val_split,
    optimizer,
    init_sign,
    gamma,
    threshold,
    lr,
    sigma,
    epochs,
    batch_size,
    seed,
    out,
    log_every,
    eval_every,
    metrics_csv,
    resume,
    force,
    device,
    precision,
    amp,
    recipe,
    as_json,
) -> None:
    """Train a BNN and write checkpoint, metrics and plots into a run directory.

    Data-parallel: `torchrun --nproc-per-node=N -m bnnexport train ...` (gloo on CPU, NCCL on
    GPUs); --batch-size is per process, so the effective batch is N times larger.

    Checkpoints are written atomically after every epoch; an interrupted run continues with
    --resume. Progress bars appear only on a terminal and never with --json.
    """
    config = TrainConfig(
        model=model,
        dataset=dataset,
        data_dir=data_dir,
        dataset_options=dataset_options(image_size, mean, std, val_split),
        optimizer=optimizer,
        init_sign=init_sign,
        gamma=number_or_schedule(gamma),
        threshold=number_or_schedule(threshold),
        lr=number_or_schedule(lr),
        sigma=number_or_schedule(sigma),
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        out=out or default_out(model, dataset),
        device=device,
        precision="amp" if amp else precision,
        log_every=log_every,
        eval_every=eval_every,
        metrics_csv=metrics_csv,
    )
    ctx = click.get_current_context()
    explicit = {
        name
        for name in TrainConfig.__dataclass_fields__
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }
    if config.dataset_options:  # each is checked against the run's own on --resume
        explicit.add("dataset_options")
    if "sigma" in explicit and optimizer != "bop2" and not resume:
        raise ConfigError(f"--sigma is bop2's second-moment rate; --optimizer {optimizer} has none")
    if recipe is not None:
        from bnnexport.recipes import recipe_config

        if resume:
            raise ConfigError("--recipe with --resume: a resumed run keeps its own configuration")
        given = {  # only what the user typed overrides the recipe, never a flag's default
            name: getattr(config, name) for name in RECIPE_OVERRIDABLE
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        }  # fmt: skip
        if config.dataset_options:  # --image-size, --mean, --std, --val-split
            given["dataset_options"] = config.dataset_options
        config = recipe_config(recipe, **given, out=out, device=device, precision=config.precision,
                               log_every=log_every, eval_every=eval_every,
                               metrics_csv=metrics_csv)  # fmt: skip
        from bnnexport.recipes import compression_note

        note = compression_note(config)
        if note and not as_json:
            click.echo(f"bnnexport: note: {note}", err=True)
    report = train(
        config,
        resume=resume,
        force=force,
        progress=None if not as_json else False,
        explicit=explicit,
    )
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 reports
        title = f"trained {report.model} on {report.dataset} -> {report.run_dir}"
        emit(report, as_json, title=title)
