"""Reliability: every bad input or fault is one line on stderr, a non-zero exit, nothing lost.

Each case runs the real CLI (a subprocess, or click's runner in-process where a fault has to be
injected) and then checks that the run directory's existing files are byte-for-byte intact.
"""

from __future__ import annotations

import errno
import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bnnexport.cli import main

CLI = [sys.executable, "-m", "bnnexport"]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr[-1500:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error: "), result.stderr[-1500:]
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("command", ["verify", "summary", "export"])
def test_missing_checkpoint(tmp_path, command):
    result = run_cli(command, str(tmp_path / "nowhere"))
    assert_one_line_error(result, 2)


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04truncated"], ids=["empty", "truncated-zip"])
def test_empty_or_truncated_checkpoint(trained_run, content):
    (trained_run / "checkpoint.pt").write_bytes(content)
    before = snapshot(trained_run)
    for command in ("verify", "summary", "export"):
        assert_one_line_error(run_cli(command, str(trained_run)), 2, "checkpoint.pt")
    assert snapshot(trained_run) == before


def test_checkpoint_cut_in_half(trained_run):
    checkpoint = trained_run / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    assert_one_line_error(run_cli("summary", str(trained_run)), 2, "truncated")


def test_checkpoint_of_another_model(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model_kwargs"]["hidden"] = 64  # same name, other shapes
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    assert_one_line_error(run_cli("summary", str(trained_run)), 2, "does not match model")


def test_checkpoint_naming_an_unknown_model(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model_name"] = "resnet-9000"
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    assert_one_line_error(run_cli("verify", str(trained_run)), 2, "resnet-9000")


class Payload:
    """Any class: unpickling it would need code from outside the checkpoint."""


def test_checkpoint_carrying_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "bnnexport-checkpoint", "model": Payload()}, path)
    assert_one_line_error(run_cli("verify", str(path)), 2, "pickled Python objects")


def test_foreign_torch_file_is_not_a_bnnexport_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(3)}, path)
    assert_one_line_error(run_cli("summary", str(path)), 2, "not a bnnexport checkpoint")


def test_file_that_is_not_onnx(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    assert_one_line_error(run_cli("convert", str(path), "--target", "arm64"), 2)
    assert_one_line_error(run_cli("verify", str(path)), 2)


def test_onnx_with_an_unsupported_op_names_the_op(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["y"], name="strange_erf")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "erf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = run_cli("convert", str(path), "--target", "arm64")
    assert_one_line_error(result, 2, "Erf")
    assert not list(tmp_path.glob("*.tflite"))


def test_file_that_is_not_a_flatbuffer(trained_run):
    assert run_cli("export", str(trained_run)).returncode == 0
    (trained_run / "model-arm64.tflite").write_bytes(b"not a flatbuffer at all")
    (trained_run / "model-float.tflite").write_bytes(b"not a flatbuffer either")
    before = snapshot(trained_run)
    result = run_cli("bench", str(trained_run), "--runs", "1", "--warmup", "0", "--samples", "5")
    assert_one_line_error(result, 2)
    assert snapshot(trained_run) == before


def test_wrong_input_shape_for_a_model(trained_run):
    import numpy as np

    assert run_cli("export", str(trained_run)).returncode == 0
    before_onnx = (trained_run / "model.onnx").read_bytes()
    np.savez(
        trained_run / "samples.npz",
        inputs=np.zeros((4, 3, 32, 32), np.float32),
        labels=np.zeros(4, np.int64),
    )
    result = run_cli("convert", str(trained_run), "--target", "arm64")
    assert result.returncode == 2, result.stderr[-1500:]
    assert "Traceback" not in result.stderr and "shape" in result.stderr.lower()
    assert (trained_run / "model.onnx").read_bytes() == before_onnx
    assert not (trained_run / "model-arm64.tflite").exists()


def test_non_binary_weights_are_refused_at_export(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model"]["features.5.weight"][0, 0, 0, 0] = 0.5
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    result = run_cli("export", str(trained_run))
    assert result.returncode == 1 and "features.5" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (trained_run / "model.onnx").exists()


def _fail_on_write(monkeypatch, error: OSError) -> None:
    import bnnexport.reports

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(bnnexport.reports.tempfile, "mkstemp", refuse)


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
    _fail_on_write(monkeypatch, error)
    result = CliRunner().invoke(main, ["pack", str(trained_run)])
    assert result.exit_code == 2
    assert fragment in result.output.lower()
    assert snapshot(trained_run) == before


def test_unreachable_device(trained_run):
    assert run_cli("export", str(trained_run)).returncode == 0
    (trained_run / "model-arm64.tflite").write_bytes(b"placeholder")
    result = run_cli(
        "bench",
        str(trained_run),
        "--device",
        "pi@127.0.0.1",
        "--port",
        "9",
        "--runs",
        "1",
        "--samples",
        "5",
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_sigint_during_training_keeps_the_checkpoint_and_resume_works(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [*CLI, "train", "--epochs", "3", "--batch-size", "100", "--out", str(out), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (out / "checkpoint.pt").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if process.returncode != 0:  # interrupted (not finished already)
        assert process.returncode == 130 and "interrupted" in stderr
        assert "Traceback" not in stderr
    epoch = torch.load(out / "checkpoint.pt", weights_only=True)["epoch"]
    assert epoch >= 1
    result = run_cli("train", "--out", str(out), "--resume", "--json")
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 3


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_checkpoint(trained_run):
    """The process dies after writing the new checkpoint's bytes but before the rename."""
    before = (trained_run / "checkpoint.pt").read_bytes()
    code = (
        "import os, signal, sys\n"
        "import bnnexport.reports as reports\n"
        "reports.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from bnnexport.cli import main\n"
        f"main(['train', '--out', {str(trained_run)!r}, '--resume', '--epochs', '2'])\n"
    )
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=600)
    assert process.returncode == -signal.SIGKILL
    assert (trained_run / "checkpoint.pt").read_bytes() == before
    result = run_cli("train", "--out", str(trained_run), "--resume", "--epochs", "2", "--json")
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(trained_run / "checkpoint.pt", weights_only=True)["epoch"] == 2
