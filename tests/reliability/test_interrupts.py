"""Interrupts: Ctrl-C (SIGINT) at any moment ends a command with one line and exit 130, and
leaves what was saved usable (training resumes from its last checkpoint)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from support.cli import COMMAND, invoke, run_process
from support.guarantees import assert_one_line_error
from support.image_folders import tiny_training
from support.waiting import training_in_epoch, wait_until


@pytest.mark.slow
def test_sigint_during_training_keeps_the_checkpoint_and_resume_works(tmp_path):
    out = tmp_path / "run"
    # epochs of a fraction of a second on a tiny folder: the signal lands at any point of one
    # after the first checkpoint; 1000 are never reached
    args = [*tiny_training(tmp_path / "data"), "--epochs", "1000", "--out", str(out), "--json"]
    process = subprocess.Popen(
        [*COMMAND, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    # in epoch 2 or later: a checkpoint exists
    wait_until(training_in_epoch(out, 2), 300, "step record of epoch 2", process)
    assert (out / "checkpoint.pt").exists()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130  # 1000 epochs: not finished
    assert "Traceback" not in stderr
    epoch = torch.load(out / "checkpoint.pt", weights_only=True)["epoch"]
    assert 1 <= epoch < 1000
    assert stderr.splitlines()[-1] == (  # the epoch lines come before it
        f"bnnexport: error: interrupted: the last checkpoint (epoch {epoch} of 1000) is in {out}; "
        f"continue with bnnexport train --out {out} --resume"
    )
    result = run_process(
        "train", "--out", str(out), "--resume", "--epochs", str(epoch + 1), "--json"
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == epoch + 1


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_says_no_epoch_was_saved(tmp_path):
    out = tmp_path / "run"
    command = ["train", "--epochs", "50", "--batch-size", "100", "--out", str(out)]
    result = _interrupt(command, training_in_epoch(out, 1))  # an epoch takes seconds
    assert not (out / "checkpoint.pt").exists()
    assert_one_line_error(result, 130, "before the first checkpoint: no epoch of this run was "
                          f"saved in {out}")  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_in_the_train_stage_of_a_pipeline_names_the_checkpoint_and_resume(tmp_path):
    out = tmp_path / "run"
    command = ["pipeline", "--epochs", "50", "--batch-size", "100", "--out", str(out)]
    result = _interrupt(command, (out / "checkpoint.pt").exists)
    assert result.returncode == 130, result.stderr[-1500:]
    epoch = torch.load(out / "checkpoint.pt", weights_only=True)["epoch"]
    assert result.stderr.splitlines()[-1] == (  # after the stage and epoch lines
        f"bnnexport: error: interrupted: the last checkpoint (epoch {epoch} of 50) is in {out}; "
        f"continue with bnnexport train --out {out} --resume"
    )


def _tiny_run(tmp_path: Path, *options: str) -> tuple[Path, list[str]]:
    """A run of one epoch on a tiny image folder; returns it and the options that trained it."""
    run, options = tmp_path / "run", [*tiny_training(tmp_path / "data"), *options]
    result = invoke("train", *options, "--epochs", "1", "--out", run)
    assert result.exit_code == 0, result.output[-1500:]
    return run, options


def _interrupt_at(monkeypatch, name: str, calls: int = 1) -> None:
    """Ctrl-C at the `calls`-th call of bnnexport.stages.train's `name`."""
    import bnnexport.stages.train

    real, seen = getattr(bnnexport.stages.train, name), []

    def interrupted(*args, **kwargs):
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bnnexport.stages.train, name, interrupted)


def test_ctrl_c_after_a_checkpoint_on_a_gpu_names_the_device_in_the_resume_command(
    tmp_path, monkeypatch
):
    import bnnexport.stages.train
    from bnnexport.training.distributed import setup

    monkeypatch.setattr(bnnexport.stages.train, "setup", lambda device: setup("cpu"))  # no GPU here
    _interrupt_at(monkeypatch, "_export_metrics", calls=2)  # epoch 2, saved just before
    out = tmp_path / "run"
    args = ["train", *tiny_training(tmp_path / "data"), "--epochs", "3", "--out", out]
    result = invoke(*args, "--torch-device", "cuda:1")
    assert result.exit_code == 130, result.output[-1500:]
    assert result.stderr.splitlines()[-1] == (
        f"bnnexport: error: interrupted: the last checkpoint (epoch 2 of 3) is in {out}; "
        f"continue with bnnexport train --out {out} --resume --torch-device cuda:1"
    )


def test_ctrl_c_with_force_before_the_old_run_is_replaced_says_nothing_of_this_run_was_saved(
    tmp_path, monkeypatch
):
    run, options = _tiny_run(tmp_path)
    _interrupt_at(monkeypatch, "_prepare_run")  # the old run's checkpoint is still there
    result = invoke("train", *options, "--epochs", "2", "--force", "--out", run)
    assert_one_line_error(result, 130, "before the first checkpoint: no epoch of this run")
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1


def test_ctrl_c_in_a_resumed_run_before_its_next_checkpoint_says_to_run_it_again(
    tmp_path, monkeypatch
):
    run, _ = _tiny_run(tmp_path)
    _interrupt_at(monkeypatch, "_run_epochs")  # --lr 0.005 is not in the checkpoint yet
    result = invoke("train", "--resume", "--epochs", "3", "--lr", "0.005", "--out", run)
    assert result.exit_code == 130, result.output[-1500:]
    assert result.stderr.splitlines()[-1] == (
        f"bnnexport: error: interrupted before the next checkpoint: the last one (epoch 1) is in "
        f"{run}; continue with the same command"
    )


def _interrupt(args: list[str], when) -> subprocess.CompletedProcess:
    """Start the CLI, wait until `when()` holds, send SIGINT (what Ctrl-C sends)."""
    process = subprocess.Popen(
        [*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    while not when() and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    try:
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()  # a hung child must not outlive the test
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.6, 1.2, 2.5])  # start-up, torch, data, training
def test_ctrl_c_at_any_moment_is_one_line_130(delay, tmp_path):
    started = time.time()
    command = ["train", "--epochs", "1000", "--out", str(tmp_path / "run")]  # never finishes
    result = _interrupt(command, lambda: time.time() - started > delay)
    assert_one_line_error(result, 130, "interrupted")


@pytest.mark.slow
def test_ctrl_c_during_init_leaves_no_partial_artifact(tmp_path):
    out = tmp_path / "run"
    result = _interrupt(["init", "--model", "quicknet", "--out", str(out)], out.exists)
    assert_one_line_error(result, 130, "interrupted")
    assert not list(tmp_path.rglob("*.tmp"))  # no half-written checkpoint
    assert not out.exists() or not (out / "config.json").exists()


def test_ctrl_c_swallowed_by_a_library_still_ends_the_command(tmp_path):
    """A library that catches KeyboardInterrupt and carries on must not keep bnnexport running."""
    script = (
        "import signal, time, bnnexport.__main__ as entry\n"
        "entry.UNWIND_SECONDS = 1.0\n"
        "signal.signal(signal.SIGINT, entry._on_sigint)\n"
        # the outer try catches an interrupt that lands between two sleeps (at the inner loop's
        # jump), which would otherwise end the script with SIGINT instead of the watchdog
        "while True:\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        while True:\n"
        "            try:\n"
        "                time.sleep(0.05)\n"
        "            except KeyboardInterrupt:\n"
        "                pass  # what the swallowing library does\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
    )
    process = subprocess.Popen(
        [COMMAND[0], "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = process.stdout.readline()
        assert first.strip() == "ready", first + process.stderr.read()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()  # a hung child must not outlive the test
    assert process.returncode == 130
    assert stderr == "bnnexport: error: interrupted\n"


def test_after_ctrl_c_before_the_first_checkpoint_a_plain_rerun_starts_afresh(
    tmp_path, monkeypatch
):
    out, options = tmp_path / "run", tiny_training(tmp_path / "data")
    with monkeypatch.context() as patched:
        _interrupt_at(patched, "evaluate_counts")  # epoch 1 steps logged, no checkpoint yet
        result = invoke("train", *options, "--epochs", "1", "--out", out)
    assert_one_line_error(result, 130, f"no epoch of this run was saved in {out}; run the same "
                          "command again to start afresh")  # fmt: skip
    assert (out / "config.json").is_file() and not (out / "checkpoint.pt").exists()
    resumed = invoke("train", "--resume", out)
    assert_one_line_error(resumed, 2, f"nothing to resume: {out} holds no checkpoint",
                          "run the same command without --resume")  # fmt: skip
    rows = _step_rows(out)
    assert rows
    rerun = invoke("train", *options, "--epochs", "1", "--out", out)  # the same command
    assert rerun.exit_code == 0, rerun.output[-1500:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert len(_step_rows(out)) == len(rows)  # the interrupted run's rows are gone


def _step_rows(run: Path) -> list[dict]:
    from bnnexport.run.records import read_jsonl

    return [row for row in read_jsonl(run / "metrics.jsonl") if row.get("kind") == "step"]


def test_resume_takes_the_run_as_its_value_too(tmp_path):
    run, _ = _tiny_run(tmp_path)
    result = invoke("train", "--resume", run, "--epochs", "2")  # as --resume --out RUN
    assert result.exit_code == 0, result.output[-1500:]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 2
    other = invoke("train", "--resume", run, "--out", tmp_path / "other")
    assert_one_line_error(other, 2, "two runs; give one (--resume RUN)")
