"""Nothing lost: a failing or refused command leaves every existing file byte for byte as it
was, user files included; two writers never both run on one directory; loading data runs no code."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.cli import invoke, run_process
from support.guarantees import (
    another_writer,
    assert_one_line_error,
    assert_refused_unchanged,
    benched,
    besides_epoch_lines,
    fail_on_write,
    snapshot,
    user_files,
)
from support.image_folders import tiny_training
from support.waiting import training_in_epoch, wait_until

from bnnexport.run import files


def _cifar_batch(count: int = 4) -> dict:
    import numpy as np

    return {b"batch_label": b"training batch", b"labels": list(range(count)),
            b"data": np.zeros((count, 3072), np.uint8),
            b"filenames": [b"img%d.png" % i for i in range(count)]}  # fmt: skip


def _cifar_dir(root: Path) -> Path:
    import pickle

    root.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (root / name).write_bytes(pickle.dumps(_cifar_batch(), protocol=2))
    return root


class _RunsCode:
    """A pickle payload: unpickling it would create `marker` (i.e. run code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize(
    "error,fragment",
    [
        (
            PermissionError(errno.EACCES, "Permission denied", "run/.checkpoint.pt.tmp"),
            "permission denied",
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "run/.checkpoint.pt.tmp"),
            "no space left",
        ),
    ],
    ids=["read-only", "full"],
)
def test_unwritable_output_directory_keeps_the_run_intact(
    trained_run, monkeypatch, error, fragment
):
    before = snapshot(trained_run)
    fail_on_write(monkeypatch, error)
    result = invoke("pack", str(trained_run))
    assert result.exit_code == 2
    assert fragment in result.output.lower()
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_keeps_the_previous_checkpoint(tmp_path):
    """The process dies after writing the new checkpoint's bytes but before the rename."""
    trained_run = tmp_path / "run"  # a 1-epoch run on a tiny folder: its epochs take no time
    trained = invoke("train", *tiny_training(tmp_path / "data"), "--epochs", "1",
                     "--out", trained_run)  # fmt: skip
    assert trained.exit_code == 0, trained.output[-1500:]
    before = (trained_run / "checkpoint.pt").read_bytes()
    # killed at the fsync of the checkpoint's temporary file, not at the first fsync of the
    # resume (the manifest's, before any training), which never reached the checkpoint
    code = (
        "import os, signal\n"
        "fsync = os.fsync\n"
        "def kill_in_checkpoint_write(fd):\n"
        "    if '.checkpoint.pt.' in os.readlink(f'/proc/self/fd/{fd}'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    fsync(fd)\n"
        "os.fsync = kill_in_checkpoint_write\n"
        "from bnnexport.cli import main\n"
        f"main(['train', '--out', {str(trained_run)!r}, '--resume', '--epochs', '2'])\n"
    )
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=600)
    assert process.returncode == -signal.SIGKILL
    assert (trained_run / "checkpoint.pt").read_bytes() == before
    result = run_process("train", "--out", str(trained_run), "--resume", "--epochs", "2", "--json")
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(trained_run / "checkpoint.pt", weights_only=True)["epoch"] == 2


@pytest.mark.parametrize(
    "options,fragment",
    [(["--lr", "nan"], "--lr"), (["--lr", "-0.1"], "--lr"), (["--gamma", "2"], "--gamma"),
     (["--gamma", "nan"], "--gamma"), (["--threshold", "-1"], "--threshold"),
     (["--torch-device", "tpu0"], "tpu0"), (["--dataset", "cifar10"], "--data-dir"),
     (["--model", "binary-alexnet"], "input too small"),
     (["--gamma", "linear:1e-2,0,10"], "0 at step 10, must be in (0, 1]"),
     (["--gamma", "step:0.1,2,50"], "1.6 at step 200 of the run's 400, must be in (0, 1]")],
    ids=["lr-nan", "lr-negative", "gamma-2", "gamma-nan", "threshold-negative", "device-tpu0",
         "cifar10-without-data-dir", "model-too-large-for-mnist", "gamma-schedule-reaching-0",
         "gamma-schedule-leaving-its-range-within-the-run"],
)  # fmt: skip
def test_force_with_a_bad_option_leaves_the_run_byte_identical(trained_run, options, fragment):
    assert_refused_unchanged(trained_run, ("train", "--force", "--out", trained_run, *options),
                             2, fragment)  # fmt: skip


def test_train_force_on_a_run_holding_user_files_is_refused_and_changes_nothing(trained_run):
    user_files(trained_run)
    (trained_run / "model.onnx").write_bytes(b"the user's own export")
    before = snapshot(trained_run)
    result = invoke("train", "--force", "--epochs", "1", "--out", str(trained_run))
    assert_one_line_error(result, 2, "did not write", "data/", "model.onnx", "thesis.txt")
    assert snapshot(trained_run) == before


def test_init_force_on_a_run_holding_user_files_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    args = ["init", "--model", "binarynet", "--input-shape", "3,16,16", "--out", str(out)]
    assert invoke(*args).exit_code == 0
    user_files(out)
    before = snapshot(out)
    assert_one_line_error(invoke(*args, "--force", "--seed", "1"), 2, "data/", "thesis.txt")
    assert snapshot(out) == before


def test_init_force_with_a_bad_size_leaves_the_run_byte_identical(tmp_path):
    out = tmp_path / "run"
    assert (
        invoke(
            "init", "--model", "binarynet", "--input-shape", "3,16,16", "--out", str(out)
        ).exit_code
        == 0
    )
    user_files(out)
    before = snapshot(out)
    result = invoke(
        "init", "--model", "binary-alexnet", "--input-shape", "3,8,8", "--out", str(out), "--force"
    )
    assert_one_line_error(result, 2, "input too small")
    assert snapshot(out) == before


def test_init_in_a_working_directory_of_user_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user_files(tmp_path)
    before = snapshot(tmp_path)
    args = ["init", "--model", "binarynet", "--input-shape", "3,16,16", "--out", "."]
    assert_one_line_error(invoke(*args), 2, "not a run directory")
    assert_one_line_error(invoke(*args, "--force"), 2, "not a run directory")
    assert snapshot(tmp_path) == before


def test_out_whose_parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    result = invoke("init", "--model", "binarynet", "--out", str(tmp_path / "file" / "run"))
    assert_one_line_error(result, 2, "a file is in the way")


def test_a_genuine_cifar_batch_loads(tmp_path):
    from bnnexport.datasets import load_dataset

    data = load_dataset("cifar10", _cifar_dir(tmp_path / "cifar"))
    assert len(data.train) == 20 and len(data.test) == 4


def test_a_crafted_cifar_batch_runs_no_code(tmp_path):
    import pickle

    root = _cifar_dir(tmp_path / "cifar")
    marker = tmp_path / "pwned"
    batch = _cifar_batch()
    batch[b"labels"] = _RunsCode(marker)
    (root / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=2))
    result = invoke(
        "train",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(root),
        "--model",
        "binarynet",
        "--out",
        str(tmp_path / "run"),
    )
    assert_one_line_error(result, 2, "data_batch_1", "refusing")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()  # nothing left behind by the failed start


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--resume", "--epochs", "2"],
        ["train", "--force"],
        ["pack"],
        ["verify"],
        ["export"],
        ["bench"],
    ],
    ids=["train-resume", "train-force", "pack", "verify", "export", "bench"],
)
def test_a_second_writer_gets_one_line_and_changes_nothing(trained_run, args):
    before = snapshot(trained_run)
    if args[0] == "train":
        args = [*args, "--out", str(trained_run)]
    else:
        args = [args[0], str(trained_run), *args[1:]]
    with another_writer(trained_run):
        result = invoke(*args)
    line = assert_one_line_error(result, 2, "being written by another bnnexport command")
    assert ("use another --out" in line) == (args[0] == "train")  # only train has --out here
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_two_trains_on_one_out_do_not_both_run(tmp_path):
    """The first train is held after its epoch's steps until the second has been refused, so
    the two overlap on any machine, and the first epoch can be a tiny folder's."""
    out, release = tmp_path / "run", tmp_path / "release"
    args = ["train", *tiny_training(tmp_path / "data"), "--epochs", "1", "--out", str(out)]
    code = (
        "import pathlib, time\n"
        "import bnnexport.stages.train as train\n"
        "recalibrate = train.recalibrate_batchnorm\n"
        "def held(*args, **kwargs):\n"
        f"    release, deadline = pathlib.Path({str(release)!r}), time.monotonic() + 300\n"
        "    while not release.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    return recalibrate(*args, **kwargs)\n"
        "train.recalibrate_batchnorm = held\n"
        "from bnnexport.cli import main\n"
        f"main({args!r})\n"
    )
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_until(training_in_epoch(out, 1), 120, "step record", first)
        second = run_process("train", "--epochs", "1", "--out", str(out), "--force")
    finally:
        release.touch()
    assert_one_line_error(second, 2, "being written by another")
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-1500:]


def test_resume_of_a_finished_run_rewrites_nothing(trained_run):
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert json.loads(result.stdout)["flip_rate"]  # the stored report, flip rates included
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_a_new_run_after_an_interrupted_first_epoch_starts_clean_metrics(tmp_path):
    from bnnexport.run.files import write_bytes_atomic
    from bnnexport.run.records import append_jsonl

    out = tmp_path / "run"
    # what a run killed before its first checkpoint leaves: train's empty metrics.jsonl,
    # recorded as append-only, and the step lines appended since
    write_bytes_atomic(out / "metrics.jsonl", b"", append=True)
    stale = {"kind": "step", "step": 999, "epoch": 1, "loss": 9.0}
    append_jsonl(out / "metrics.jsonl", [stale])  # no checkpoint.pt yet
    options = tiny_training(tmp_path / "data")
    result = invoke("train", *options, "--epochs", "1", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert '"step": 999' not in (out / "metrics.jsonl").read_text()


@pytest.fixture(params=[0o022, 0o002], ids=["umask-022", "umask-002"])
def umask(request):
    """The process umask set to the parameter for one test, then restored."""
    import os

    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


@pytest.mark.slow
def test_a_flatbuffer_gets_the_same_mode_as_every_other_file(tmp_path, umask):
    """Flatbuffers were 0600 (mkstemp) beside reports following the umask; every file
    bnnexport writes is 0666 less the umask, the float model and the manifest too."""
    import stat

    from support.converter_nets import StemAndBinaryConv, export

    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "net.onnx")
    result = invoke("convert", str(onnx_path), "--format", "tflite")
    assert result.exit_code == 0, result.output[-1500:]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir() if p != onnx_path}
    assert modes == dict.fromkeys(
        ["net-arm64.tflite", "net-float.tflite", "provenance.json"], 0o666 & ~umask
    )


def _tiny_benched_run(tmp_path: Path) -> tuple[Path, list[str]]:
    """A 1-epoch run on a tiny image folder, then exported samples and a bench with its report
    and plots; returns the run and the names of what was made from its checkpoint."""
    run = tmp_path / "run"
    trained = invoke("train", *tiny_training(tmp_path / "data"), "--epochs", "1", "--out", run)
    assert trained.exit_code == 0, trained.output[-1500:]
    return run, ["verify.json", *benched(run, (3, 16, 16))]  # train verifies its checkpoint


def test_resume_removes_everything_made_from_the_old_checkpoint_and_names_it(tmp_path):
    run, made = _tiny_benched_run(tmp_path)
    assert {"report.md", "bench_latency.png", "bench.json", "samples.npz"} <= set(made)
    result = invoke("train", "--resume", "--epochs", "2", "--out", run)
    assert result.exit_code == 0, result.output[-1500:]
    removed = json.loads((run / "train.json").read_text())["resume_removed"]  # --json's too
    assert sorted(removed) == sorted(made)
    note = f"bnnexport: note: --resume: removed {', '.join(removed)} (made from the old checkpoint)"
    assert besides_epoch_lines(result.stderr) == [note]
    left = {p.name for p in run.iterdir()}
    assert left.isdisjoint(set(made) - {"verify.json"})  # train writes its verify.json again
    assert files.foreign_files(run) == []


def test_resume_refuses_to_remove_a_bench_report_the_user_edited(tmp_path):
    run, _ = _tiny_benched_run(tmp_path)
    with (run / "report.md").open("a") as report:
        report.write("\nMy notes on this model.\n")  # the report is the user's now
    args = ("train", "--resume", "--epochs", "2", "--out", run)
    assert_refused_unchanged(run, args, 2, "report.md")
