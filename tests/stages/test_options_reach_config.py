"""Every option `train`, `pipeline` and `sweep` accept reaches the run's config.json: one way
from options to a TrainConfig (`bnnexport.cli.train.train_config`), walked option by option.

pipeline once built its TrainConfig from 12 of train's options and silently dropped the rest;
sweep took 6. The walk below gives every option a value other than its default, runs each
command once, and reads config.json back."""

from __future__ import annotations

import json

import click
import pytest
from support.cli import invoke, run_in_process
from support.image_folders import write_plain_folder

from bnnexport.cli.bench import bench_command
from bnnexport.cli.pipeline import pipeline_command
from bnnexport.cli.sweep import sweep_command
from bnnexport.cli.train import train_command

KERNELS = "features.2.weight,features.5.weight,classifier.1.weight"  # mnist-bnn's
# option -> (its value on the command line, config.json's key, the value config.json holds)
TRAIN_OPTIONS = {
    "model": ("mnist-bnn", "model", "mnist-bnn"),
    "dataset": ("imagefolder", "dataset", "imagefolder"),
    "image_size": ("24x28", "dataset_options", {"image_size": [24, 28]}),
    "mean": ("0.5", "dataset_options", {"mean": [0.5]}),
    "std": ("0.25", "dataset_options", {"std": [0.25]}),
    "val_split": ("0.5", "dataset_options", {"val_split": 0.5}),
    "optimizer": ("bop2", "optimizer", "bop2"),
    "init_sign": (None, "init_sign", True),
    "binary": (KERNELS, "binary", KERNELS.split(",")),
    "gamma": ("0.002", "gamma", 0.002),
    "threshold": ("1e-07", "threshold", 1e-07),
    "lr": ("0.003", "lr", 0.003),
    "sigma": ("0.02", "sigma", 0.02),
    "epochs": ("1", "epochs", 1),
    "batch_size": ("6", "batch_size", 6),
    "seed": ("7", "seed", 7),
    "log_every": ("2", "log_every", 2),
    "eval_every": ("3", "eval_every", 3),
    "metrics_csv": (None, "metrics_csv", True),
    "precision": ("float32", "precision", "float32"),
    "per_process_batchnorm": (None, "sync_batchnorm", False),
    "float_layers": ("int8", "float_layers", "int8"),
    "recipe": ("paper-cifar10-sweep", "recipe", "paper-cifar10-sweep"),
    # the recipe evaluates with the moving statistics: the option given wins over it
    "bn_eval": ("recalibrate", "bn_eval", "recalibrate"),
}
# options that are how a command runs or where it writes, not what it trains
NOT_TRAINING = {
    "train": {"out", "resume", "force", "device", "amp", "as_json", "data_dir"},
    "pipeline": {"out", "resume", "force", "train_device", "amp", "as_json", "data_dir"},
    "sweep": {"gammas", "thresholds", "optimizers", "seeds", "out", "force", "device", "amp",
              "as_json", "data_dir"},
}  # fmt: skip
BENCH = {p.name for p in bench_command.params}  # pipeline's --device is bench's SSH device
SWEEP_SETS = {"gamma", "threshold", "optimizer", "recipe"}  # sweep's own lists replace these


def argv(names: set[str]) -> list[str]:
    args = []
    for name in sorted(names):
        value = TRAIN_OPTIONS[name][0]
        args += [f"--{name.replace('_', '-')}"] + ([] if value is None else [value])
    return args


@pytest.mark.parametrize("command", [train_command, pipeline_command, sweep_command])
def test_every_option_is_walked_or_named_as_no_part_of_training(command):
    """A new option must join TRAIN_OPTIONS (and reach the config) or say why it need not."""
    names = {p.name for p in command.params if isinstance(p, click.Option) and p.name != "help"}
    others = NOT_TRAINING[command.name] | (BENCH if command.name == "pipeline" else set())
    expected = set(TRAIN_OPTIONS) - (SWEEP_SETS if command.name == "sweep" else set())
    assert names - others == expected


def check_config(path, names: set[str]) -> None:
    config = json.loads(path.read_text())
    for name in sorted(names):
        _, key, value = TRAIN_OPTIONS[name]
        held = config[key]
        if isinstance(value, dict):  # one entry of dataset_options
            held = {k: held.get(k) for k in value}
        assert held == value, (name, config[key])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_plain_folder(tmp_path_factory.mktemp("images") / "data", size=(28, 24))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "pipeline", "sweep"])
def test_every_option_reaches_config_json(command, images, tmp_path):
    names = set(TRAIN_OPTIONS) - (SWEEP_SETS if command == "sweep" else set())
    args = [command, *argv(names), "--data-dir", images, "--out", tmp_path / "out"]
    if command == "pipeline":
        args += ["--samples", "6", "--runs", "2", "--warmup", "0"]
    if command == "sweep":
        args += ["--optimizer", "bop2", "--gamma", "0.002", "--threshold", "1e-07"]
    result = run_in_process(*args)
    assert result.returncode == 0, result.stderr
    config = tmp_path / "out" / ("gamma=0.002,threshold=1e-07" if command == "sweep" else "")
    check_config(config / "config.json", names)


@pytest.mark.slow
def test_the_deprecated_amp_flag_reaches_the_config_as_precision_amp(tmp_path):
    from support.image_folders import tiny_training

    out = tmp_path / "run"
    args = [*tiny_training(tmp_path / "data"), "--epochs", "1", "--amp", "--out", out]
    assert run_in_process("train", *args).returncode == 0
    assert json.loads((out / "config.json").read_text())["precision"] == "amp"


@pytest.mark.parametrize("spelling", ["--torch-device", "--train-device"])
def test_pipeline_takes_trains_device_spelling_and_the_deprecated_one(spelling, monkeypatch):
    import bnnexport.stages.pipeline

    seen = []

    def capture(config, *args, **kwargs):
        seen.append(config.device)
        raise SystemExit(0)

    monkeypatch.setattr(bnnexport.stages.pipeline, "pipeline", capture)
    invoke("pipeline", spelling, "cuda:1")
    assert seen == ["cuda:1"]


def test_pipeline_resume_takes_the_run_as_its_value_as_train_does(monkeypatch, tmp_path):
    import bnnexport.stages.pipeline

    seen = []

    def capture(config, *args, resume=False, **kwargs):
        seen.append((config.out, resume))
        raise SystemExit(0)

    monkeypatch.setattr(bnnexport.stages.pipeline, "pipeline", capture)
    invoke("pipeline", "--resume", tmp_path / "run")
    invoke("pipeline", "--out", tmp_path / "other")
    assert seen == [(str(tmp_path / "run"), True), (str(tmp_path / "other"), False)]
