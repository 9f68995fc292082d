"""`bnnexport train`: run directory contents, JSON output, resume, crash safety, clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.cli import COMMAND, invoke, run_in_process, run_process
from support.image_folders import tiny_training
from support.waiting import training_in_epoch, wait_until

from bnnexport.nn.layers import binary_parameters
from bnnexport.run.checkpoint import load_model
from bnnexport.run.records import read_jsonl


@pytest.mark.slow
def test_train_json_prints_one_object_and_writes_the_run_directory(tmp_path):
    out = tmp_path / "run"
    result = run_process(
        "train", "--epochs", "1", "--batch-size", "100", "--out", str(out), "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("test_accuracy", "train_accuracy", "epochs", "optimizer", "seconds", "run_dir"):
        assert key in report
    assert 0.5 < report["test_accuracy"] <= 1.0
    assert report["optimizer"] == "bop" and report["epochs"] == 1
    for name in (
        "checkpoint.pt",
        "config.json",
        "metrics.jsonl",
        "train.json",
        "accuracy.png",
        "flip_rate.png",
    ):
        assert (out / name).is_file(), name
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert {"model", "optimizer", "epoch", "config", "model_name"} <= set(checkpoint)
    records = read_jsonl(out / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and set(steps[0]["flip_rate"]) == {"features.2", "features.5", "classifier.1"}
    assert all(-9.0 <= v <= 0.0 for r in steps for v in r["flip_rate"].values())


def test_trained_kernels_are_strictly_binary(trained_run):
    for p in binary_parameters(load_model(trained_run)):
        assert bool(((p == 1) | (p == -1)).all())


@pytest.mark.slow
def test_adam_latent_checkpoint_holds_binary_kernels_and_latent_weights(tmp_path):
    out = tmp_path / "latent"
    result = run_process("train", *tiny_training(tmp_path / "data"), "--optimizer", "adam-latent",
                         "--epochs", "1", "--out", str(out), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    kernel = checkpoint["model"]["features.2.weight"]
    latent = checkpoint["latent"]["features.2.weight"]
    assert bool(((kernel == 1) | (kernel == -1)).all())
    assert latent.abs().max() <= 1.0 and not bool(((latent == 1) | (latent == -1)).all())
    assert torch.equal(kernel, torch.where(latent >= 0, 1.0, -1.0))


@pytest.mark.slow
def test_resume_continues_from_the_last_epoch(tmp_path):
    trained_run = tmp_path / "run"  # 1 epoch on a tiny folder: resuming it costs no mnist epoch
    trained = invoke("train", *tiny_training(tmp_path / "data"), "--epochs", "1",
                     "--out", trained_run)  # fmt: skip
    assert trained.exit_code == 0, trained.output[-1500:]
    result = run_process("train", "--out", str(trained_run), "--resume", "--epochs", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["resumed_from_epoch"] == 1 and report["epochs"] == 2
    epochs = [r["epoch"] for r in read_jsonl(trained_run / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs == [1, 2]
    assert torch.load(trained_run / "checkpoint.pt", weights_only=True)["epoch"] == 2


@pytest.mark.slow
def test_existing_run_is_not_overwritten_without_resume_or_force(trained_run):
    before = (trained_run / "checkpoint.pt").read_bytes()
    result = run_process("train", "--out", str(trained_run), "--epochs", "1")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--resume" in result.stderr
    assert (trained_run / "checkpoint.pt").read_bytes() == before


@pytest.mark.slow
def test_missing_cifar_directory_is_a_one_line_error(tmp_path):
    result = run_process(
        "train",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path / "nope"),
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2
    assert result.stderr.startswith("bnnexport: error: data directory not found")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_malformed_cifar_directory_names_what_is_missing(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"not a pickle")
    result = run_process(
        "train", "--dataset", "cifar10", "--data-dir", str(tmp_path), "--out", str(tmp_path / "run")
    )
    assert result.returncode == 2 and "missing data_batch_2" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_sigkill_during_training_leaves_a_valid_checkpoint_and_resume_finishes(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # epochs of a fraction of a second on a tiny folder: the kill lands at any point of one,
    # its checkpoint write included; 1000 are never reached
    args = [*tiny_training(tmp_path / "data"), "--epochs", "1000", "--out", str(out), "--json"]
    process = subprocess.Popen(
        [*COMMAND, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    checkpoint = out / "checkpoint.pt"
    # inside epoch 2: the first checkpoint is written and the second is not
    wait_until(training_in_epoch(out, 2), 240, "step record of epoch 2", process)
    assert checkpoint.exists(), "no checkpoint after the first epoch"
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = torch.load(checkpoint, weights_only=True)  # not corrupt
    assert 1 <= saved["epoch"] < 1000
    finish = saved["epoch"] + 1  # one more epoch proves the resume; 1000 were never reachable
    result = run_process("train", "--out", str(out), "--resume", "--epochs", str(finish), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["epochs"] == finish and report["resumed_from_epoch"] == saved["epoch"]
    assert torch.load(checkpoint, weights_only=True)["epoch"] == finish


def test_every_command_has_help_for_every_option():
    from click import Context

    from bnnexport.cli import main

    for name, command in main.commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"{name} {param.opts} has no help"
        assert command.get_help(Context(command)).strip()


@pytest.mark.slow
def test_python_m_and_console_script_both_run():
    assert run_process("--help").returncode == 0
    script = Path(sys.executable).parent / "bnnexport"
    assert subprocess.run([str(script), "--version"], capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_last_batch_of_one_image_is_dropped_not_a_batchnorm_traceback(tmp_path):
    """BatchNorm1d cannot train on one value a channel: 101 images at batch 50 train 2 steps."""
    out = tmp_path / "run"
    args = ["--model", "support.handwritten_bnn:hand_written_bnn", "--init-sign",
            "--dataset", "support.own_models:mnist_101", "--epochs", "1", "--out", out]  # fmt: skip
    result = run_in_process("train", *args)
    assert result.returncode == 0, result.stderr
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    assert sum(r["steps"] for r in steps) == 2
