"""Reliability: every bad input or fault is one line on stderr, a non-zero exit, nothing lost.

Each case runs the real CLI (a subprocess, or click's runner in-process where a fault has to be
injected) and then checks that the run directory's existing files are byte-for-byte intact.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.cli import COMMAND, invoke, run_process
from support.waiting import training_in_epoch, wait_until


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


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify", "summary", "export"])
def test_missing_checkpoint(tmp_path, command):
    result = run_process(command, str(tmp_path / "nowhere"))
    assert_one_line_error(result, 2)


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"", b"PK\x03\x04truncated"], ids=["empty", "truncated-zip"])
def test_empty_or_truncated_checkpoint(trained_run, content):
    (trained_run / "checkpoint.pt").write_bytes(content)
    before = snapshot(trained_run)
    for command in ("verify", "summary", "export"):
        assert_one_line_error(run_process(command, str(trained_run)), 2, "checkpoint.pt")
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_checkpoint_cut_in_half(trained_run):
    checkpoint = trained_run / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    assert_one_line_error(run_process("summary", str(trained_run)), 2, "truncated")


@pytest.mark.slow
def test_checkpoint_of_another_model(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model_kwargs"]["hidden"] = 64  # same name, other shapes
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    assert_one_line_error(run_process("summary", str(trained_run)), 2, "does not match model")


@pytest.mark.slow
def test_checkpoint_naming_an_unknown_model(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model_name"] = "resnet-9000"
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    assert_one_line_error(run_process("verify", str(trained_run)), 2, "resnet-9000")


class Payload:
    """Any class: unpickling it would need code from outside the checkpoint."""


@pytest.mark.slow
def test_checkpoint_carrying_a_pickled_object_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "bnnexport-checkpoint", "model": Payload()}, path)
    assert_one_line_error(run_process("verify", str(path)), 2, "pickled Python objects")


@pytest.mark.slow
def test_foreign_torch_file_is_not_a_bnnexport_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(3)}, path)
    assert_one_line_error(run_process("summary", str(path)), 2, "not a bnnexport checkpoint")


@pytest.mark.slow
def test_file_that_is_not_onnx(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    assert_one_line_error(run_process("convert", str(path), "--target", "arm64"), 2)
    assert_one_line_error(run_process("verify", str(path)), 2)


@pytest.mark.slow
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
    result = run_process("convert", str(path), "--target", "arm64")
    assert_one_line_error(result, 2, "Erf")
    assert not list(tmp_path.glob("*.tflite"))


@pytest.mark.slow
def test_file_that_is_not_a_flatbuffer(trained_run):
    assert run_process("export", str(trained_run)).returncode == 0
    (trained_run / "model-arm64.tflite").write_bytes(b"not a flatbuffer at all")
    (trained_run / "model-float.tflite").write_bytes(b"not a flatbuffer either")
    before = snapshot(trained_run)
    result = run_process(
        "bench", str(trained_run), "--runs", "1", "--warmup", "0", "--samples", "5"
    )
    assert_one_line_error(result, 2)
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_wrong_input_shape_for_a_model(trained_run):
    import numpy as np

    assert run_process("export", str(trained_run)).returncode == 0
    before_onnx = (trained_run / "model.onnx").read_bytes()
    np.savez(
        trained_run / "samples.npz",
        inputs=np.zeros((4, 3, 32, 32), np.float32),
        labels=np.zeros(4, np.int64),
    )
    result = run_process("convert", str(trained_run), "--target", "arm64")
    assert result.returncode == 2, result.stderr[-1500:]
    assert "Traceback" not in result.stderr and "shape" in result.stderr.lower()
    assert (trained_run / "model.onnx").read_bytes() == before_onnx
    assert not (trained_run / "model-arm64.tflite").exists()


@pytest.mark.slow
def test_non_binary_weights_are_refused_at_export(trained_run):
    checkpoint = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    checkpoint["model"]["features.5.weight"][0, 0, 0, 0] = 0.5
    torch.save(checkpoint, trained_run / "checkpoint.pt")
    result = run_process("export", str(trained_run))
    assert result.returncode == 1 and "features.5" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (trained_run / "model.onnx").exists()


def _fail_on_write(monkeypatch, error: OSError) -> None:
    import bnnexport.files

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(bnnexport.files.tempfile, "mkstemp", refuse)


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
    result = invoke("pack", str(trained_run))
    assert result.exit_code == 2
    assert fragment in result.output.lower()
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_unreachable_device(trained_run):
    """Everything on the host is in order, so the failure is the SSH connection's own."""
    assert run_process("export", str(trained_run)).returncode == 0
    assert run_process("convert", str(trained_run)).returncode == 0
    result = run_process(
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
    assert "cannot reach pi@127.0.0.1" in result.stderr, result.stderr


@pytest.mark.slow
def test_sigint_during_training_keeps_the_checkpoint_and_resume_works(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [*COMMAND, "train", "--epochs", "50", "--batch-size", "100", "--out", str(out), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # mid-epoch 2: a checkpoint exists and the next one is not written yet
    wait_until(training_in_epoch(out, 2), 300, "step record of epoch 2", process)
    assert (out / "checkpoint.pt").exists()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "interrupted" in stderr  # 50 epochs: not finished
    assert "Traceback" not in stderr
    epoch = torch.load(out / "checkpoint.pt", weights_only=True)["epoch"]
    assert 1 <= epoch < 50
    result = run_process(
        "train", "--out", str(out), "--resume", "--epochs", str(epoch + 1), "--json"
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == epoch + 1


@pytest.mark.slow
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
    result = run_process("train", "--out", str(trained_run), "--resume", "--epochs", "2", "--json")
    assert result.returncode == 0, result.stderr[-1500:]
    assert torch.load(trained_run / "checkpoint.pt", weights_only=True)["epoch"] == 2


# --- nothing lost, nothing run, one line (docs/RELIABILITY.md) ---------------------------------


def assert_cli_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output[-1500:], result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error: "), result.stderr[-1500:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def user_files(run: Path) -> None:
    """Files bnnexport never wrote, which no command may touch."""
    (run / "thesis.txt").write_text("three years of work\n")
    (run / "data").mkdir()
    (run / "data" / "batch.bin").write_bytes(bytes(range(256)))


@pytest.mark.parametrize(
    "options,fragment",
    [(["--lr", "nan"], "--lr"), (["--lr", "-0.1"], "--lr"), (["--gamma", "2"], "--gamma"),
     (["--gamma", "nan"], "--gamma"), (["--threshold", "-1"], "--threshold"),
     (["--torch-device", "tpu0"], "tpu0"), (["--dataset", "cifar10"], "--data-dir"),
     (["--model", "binary-alexnet"], "input too small")],
    ids=["lr-nan", "lr-negative", "gamma-2", "gamma-nan", "threshold-negative", "device-tpu0",
         "cifar10-without-data-dir", "model-too-large-for-mnist"],
)  # fmt: skip
def test_force_with_a_bad_option_leaves_the_run_byte_identical(trained_run, options, fragment):
    before = snapshot(trained_run)
    result = invoke("train", "--force", "--out", str(trained_run), *options)
    assert_cli_error(result, 2, fragment)
    assert snapshot(trained_run) == before


def test_train_force_on_a_run_holding_user_files_is_refused_and_changes_nothing(trained_run):
    user_files(trained_run)
    (trained_run / "model.onnx").write_bytes(b"the user's own export")
    before = snapshot(trained_run)
    result = invoke("train", "--force", "--epochs", "1", "--out", str(trained_run))
    assert_cli_error(result, 2, "did not write", "data/", "model.onnx", "thesis.txt")
    assert snapshot(trained_run) == before


def test_init_force_on_a_run_holding_user_files_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    args = ["init", "--model", "binarynet", "--input-shape", "3,16,16", "--out", str(out)]
    assert invoke(*args).exit_code == 0
    user_files(out)
    before = snapshot(out)
    assert_cli_error(invoke(*args, "--force", "--seed", "1"), 2, "data/", "thesis.txt")
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
    assert_cli_error(result, 2, "input too small")
    assert snapshot(out) == before


def test_init_in_a_working_directory_of_user_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user_files(tmp_path)
    before = snapshot(tmp_path)
    args = ["init", "--model", "binarynet", "--input-shape", "3,16,16", "--out", "."]
    assert_cli_error(invoke(*args), 2, "not a run directory")
    assert_cli_error(invoke(*args, "--force"), 2, "not a run directory")
    assert snapshot(tmp_path) == before


def test_out_whose_parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    result = invoke("init", "--model", "binarynet", "--out", str(tmp_path / "file" / "run"))
    assert_cli_error(result, 2, "a file is in the way")


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
    assert_cli_error(result, 2, "data_batch_1", "refusing")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()  # nothing left behind by the failed start


@contextlib.contextmanager
def another_writer(run: Path):
    """What a second bnnexport process holds while it writes `run`: a flock on the directory."""
    fd = os.open(run, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


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
    assert_cli_error(result, 2, "being written by another bnnexport command")
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_two_trains_on_one_out_do_not_both_run(tmp_path):
    out = tmp_path / "run"
    args = ("train", "--epochs", "1", "--batch-size", "200", "--out", str(out), "--json")
    command = [*COMMAND, *args]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(training_in_epoch(out, 1), 120, "step record", first)
    second = run_process("train", "--epochs", "1", "--out", str(out), "--force")
    assert_one_line_error(second, 2, "being written by another")
    first.communicate(timeout=300)
    assert first.returncode == 0


def test_json_error_is_one_object_on_stdout(tmp_path):
    result = invoke("verify", str(tmp_path / "nowhere"), "--json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["exit_code"] == 2 and "not found" in data["error"]


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--epochs", "0"],
        ["train", "--no-such-option"],
        ["nosuch"],
        ["bench"],
        ["train", "--model", "resnet-9000"],
    ],
    ids=["out-of-range", "unknown-option", "unknown-command", "missing-argument", "bad-choice"],
)
def test_click_usage_errors_are_one_line(args):
    result = invoke(*args)
    assert_cli_error(result, 2)


def test_click_usage_error_with_json_prints_one_object():
    result = invoke("train", "--epochs", "0", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2


@pytest.mark.parametrize("threshold", ["-1", "nan"])
def test_sweep_bad_threshold_is_one_line(tmp_path, threshold):
    result = invoke(
        "sweep", "--gamma", "1e-3", "--threshold", threshold, "--out", str(tmp_path / "sweep")
    )
    assert_cli_error(result, 2, "--threshold")
    assert not (tmp_path / "sweep").exists()


def test_sweep_rejects_duplicate_values_up_front(tmp_path):
    result = invoke(
        "sweep", "--gamma", "1e-3,0.001", "--threshold", "0", "--out", str(tmp_path / "sweep")
    )
    assert_cli_error(result, 2, "--gamma", "0.001")
    assert not (tmp_path / "sweep").exists()


def _samples(run: Path, shape=(1, 28, 28), count: int = 8) -> None:
    import numpy as np

    np.savez(
        run / "samples.npz",
        inputs=np.zeros((count, *shape), np.float32),
        labels=np.zeros(count, np.int64),
    )


BENCH = ["--runs", "1", "--warmup", "0", "--samples", "4"]


def test_bench_truncated_samples_is_one_line(trained_run):
    _samples(trained_run)
    path = trained_run / "samples.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = snapshot(trained_run)
    assert_cli_error(invoke("bench", str(trained_run), *BENCH), 2, "samples.npz", "truncated")
    assert snapshot(trained_run) == before


def test_bench_samples_of_another_models_shape_is_one_line(trained_run):
    _samples(trained_run, shape=(3, 32, 32))
    before = snapshot(trained_run)
    assert_cli_error(invoke("bench", str(trained_run), *BENCH), 2, "[3, 32, 32]", "[1, 28, 28]")
    assert snapshot(trained_run) == before


def test_bench_onnx_with_two_inputs_is_one_line(trained_run):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 28, 28]) for n in "xy"],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 28, 28])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        trained_run / "model.onnx",
    )
    _samples(trained_run)
    before = snapshot(trained_run)
    assert_cli_error(invoke("bench", str(trained_run), *BENCH), 2, "2 inputs")
    assert snapshot(trained_run) == before


def test_bench_without_flatbuffers_measures_the_rest_and_says_what_it_skipped(trained_run):
    _samples(trained_run)
    result = invoke("bench", str(trained_run), *BENCH, "--json")
    assert result.exit_code == 0, result.output[-1500:]
    data = json.loads(result.stdout)
    assert [b["name"] for b in data["backends"]] == ["pytorch"]
    assert set(data["skipped"]) == {"onnxruntime", "tflite-float", "lce"}
    assert "bnnexport convert" in data["skipped"]["lce"]


def test_bench_skips_a_flatbuffer_made_from_an_older_onnx(trained_run):
    from bnnexport import provenance

    assert invoke("export", str(trained_run), "--samples", "8").exit_code == 0
    (trained_run / "model-float.tflite").write_bytes(b"converted from the old model.onnx")
    provenance.record(trained_run, "model-float.tflite", ["model.onnx"])
    import onnx

    model = onnx.load(trained_run / "model.onnx")
    model.doc_string = "exported again"
    onnx.save(model, trained_run / "model.onnx")
    provenance.record(trained_run, "model.onnx", ["checkpoint.pt"])
    result = invoke("bench", str(trained_run), *BENCH, "--json")
    assert result.exit_code == 0, result.output[-1500:]
    data = json.loads(result.stdout)
    assert [b["name"] for b in data["backends"]] == ["pytorch", "onnxruntime"]
    assert "stale" in data["skipped"]["tflite-float"]


@pytest.mark.parametrize("command", ["verify", "pack"])
def test_read_only_run_directory_is_one_line(trained_run, monkeypatch, command):
    before = snapshot(trained_run)
    _fail_on_write(monkeypatch, OSError(errno.EROFS, "Read-only file system", "run/x.tmp"))
    assert_cli_error(invoke(command, str(trained_run)), 2, "read-only")
    assert snapshot(trained_run) == before


@pytest.mark.parametrize(
    "content,fragment",
    [
        (bytes(range(7, 256)) * 20, "binary data of an unknown format"),
        (b"these are my notes\n", "a text file"),
    ],
    ids=["random-bytes", "text"],
)
def test_a_non_checkpoint_is_named_for_what_it_is(tmp_path, content, fragment):
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    result = invoke("summary", str(path))
    assert_cli_error(result, 2, fragment)
    assert "pickled" not in result.stderr


def test_an_onnx_file_given_as_checkpoint_is_named_onnx(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "weights.pt"
    onnx.save(helper.make_model(graph), path)
    assert_cli_error(invoke("summary", str(path)), 2, "an ONNX model")


def test_missing_optional_dependency_is_one_line(trained_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    _samples(trained_run)
    assert invoke("bench", str(trained_run), *BENCH).exit_code == 0  # no ONNX model: not needed
    (trained_run / "model.onnx").write_bytes(b"\x08\x07")  # any file: the import comes first
    assert_cli_error(invoke("bench", str(trained_run), *BENCH), 2, "onnxruntime", "pip install")


def test_tf_use_legacy_keras_is_unset_for_bnnexport(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert invoke("zoo", "list", "binarynet").exit_code == 0
    assert "TF_USE_LEGACY_KERAS" not in os.environ


def _edit_checkpoint(run: Path, edit) -> None:
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, run / "checkpoint.pt")


def test_resume_of_an_init_run_is_one_line(tmp_path):
    out = tmp_path / "run"
    assert invoke("init", "--model", "mnist-bnn", "--out", str(out)).exit_code == 0
    before = snapshot(out)
    assert_cli_error(invoke("train", "--resume", "--out", str(out)), 2, "bnnexport init")
    assert snapshot(out) == before


def test_resume_of_a_checkpoint_from_another_version_is_one_line(trained_run):
    _edit_checkpoint(trained_run, lambda c: c["config"].update(warp_factor=9))
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--epochs", "2")
    assert_cli_error(result, 2, "warp_factor", "another version")
    assert snapshot(trained_run) == before


@pytest.mark.parametrize(
    "options,fragment",
    [
        (["--epochs", "2", "--model", "binarynet"], "--model"),
        (["--epochs", "2", "--optimizer", "adam-latent"], "--optimizer"),
        (["--epochs", "2", "--seed", "7"], "--seed"),
    ],
    ids=["model", "optimizer", "seed"],
)
def test_resume_refuses_an_option_it_cannot_apply_naming_it(trained_run, options, fragment):
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), *options)
    assert_cli_error(result, 2, fragment)
    assert snapshot(trained_run) == before


def test_resume_with_fewer_epochs_than_trained_is_refused(trained_run):
    _edit_checkpoint(trained_run, lambda c: c.update(epoch=3))
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--epochs", "2")
    assert_cli_error(result, 2, "--epochs 2", "3 epoch")
    assert snapshot(trained_run) == before


def test_resume_of_a_finished_run_rewrites_nothing(trained_run):
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert json.loads(result.stdout)["flip_rate"]  # the stored report, flip rates included
    assert snapshot(trained_run) == before


def test_resume_of_a_finished_run_with_a_changed_option_is_refused(trained_run):
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--lr", "0.005")
    assert_cli_error(result, 2, "--lr", "raise --epochs")
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_resume_applies_and_records_a_changed_learning_rate(trained_run):
    from bnnexport.files import write_bytes_atomic

    # bnnexport's own (recorded) export of epoch 1; a file of the user's would be refused
    write_bytes_atomic(trained_run / "model.onnx", b"exported from epoch 1")
    result = invoke(
        "train",
        "--resume",
        "--out",
        str(trained_run),
        "--epochs",
        "2",
        "--lr",
        "0.005",
        "--batch-size",
        "200",
        "--json",
    )
    assert result.exit_code == 0, result.output[-1500:]
    assert json.loads(result.stdout)["resume_changes"]["lr"] == [0.001, 0.005]
    assert json.loads((trained_run / "config.json").read_text())["lr"] == 0.005
    from bnnexport.runs import read_jsonl

    records = read_jsonl(trained_run / "metrics.jsonl")
    assert [r["changed"] for r in records if r["kind"] == "resume"] == [
        {"lr": [0.001, 0.005], "batch_size": [100, 200], "epochs": [1, 2]}
    ]
    assert {r["adam.lr"] for r in records if r["kind"] == "step" and r["epoch"] == 2} == {0.005}
    assert not (trained_run / "model.onnx").exists()  # made from the replaced checkpoint


@pytest.mark.slow
def test_a_new_run_after_an_interrupted_first_epoch_starts_clean_metrics(tmp_path):
    from bnnexport.files import write_bytes_atomic
    from bnnexport.runs import append_jsonl

    out = tmp_path / "run"
    # what a run killed before its first checkpoint leaves: train's empty metrics.jsonl,
    # recorded as append-only, and the step lines appended since
    write_bytes_atomic(out / "metrics.jsonl", b"", append=True)
    stale = {"kind": "step", "step": 999, "epoch": 1, "loss": 9.0}
    append_jsonl(out / "metrics.jsonl", [stale])  # no checkpoint.pt yet
    result = invoke("train", "--epochs", "1", "--batch-size", "200", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert '"step": 999' not in (out / "metrics.jsonl").read_text()


def test_one_class_imagefolder_is_refused(tmp_path):
    from support.image_folders import write_image_folder

    root = write_image_folder(tmp_path / "images", classes=("cat",), per_class=2)
    result = invoke(
        "train", "--dataset", "imagefolder", "--data-dir", str(root), "--out", str(tmp_path / "run")
    )
    assert_cli_error(result, 2, "at least 2 class", "'cat'")
    assert not (tmp_path / "run").exists()


def test_zoo_list_with_no_match_says_so():
    assert_cli_error(invoke("zoo", "list", "NOSUCH"), 2, "no model matches 'NOSUCH'")


def test_train_progress_bar_keeps_its_width_at_60_columns():
    import io

    from bnnexport.train import progress_bars

    stream = io.StringIO()
    bar, status = progress_bars(range(80), 0, 5, True, file=stream, ncols=60)
    for step in bar:
        if step == 40:
            status.set_description_str("loss 0.1234  acc 0.9120  π -3.21")
            bar.refresh()
            break
    lines = [s for s in stream.getvalue().replace("\x1b[A", "").split("\r") if s.strip()]
    bar_line = [s for s in lines if s.startswith("epoch 1/5")][-1]
    assert len(bar_line.split("|")[1]) >= 30, bar_line
    assert "loss" not in bar_line and any(s.startswith("loss 0.1234") for s in lines)


def test_bench_shows_progress_when_asked(trained_run, capsys):
    from bnnexport.bench import BenchOptions, bench

    _samples(trained_run)
    bench(trained_run, BenchOptions(runs=1, warmup=0, samples=4), write_report=False, progress=True)
    assert "bench" in capsys.readouterr().err


def test_train_torch_device_and_its_deprecated_spelling(tmp_path):
    for option in ("--torch-device", "--device"):
        assert_cli_error(invoke("train", option, "tpu0", "--out", str(tmp_path / "r")), 2, "tpu0")


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
