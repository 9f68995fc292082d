"""Bad input: every bad file, option or environment is one line on stderr (`bnnexport: error:`),
a non-zero exit (1 a check failed, 2 bad input), never a traceback."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from support.cli import invoke, run_process
from support.guarantees import (
    assert_one_line_error,
    assert_refused_unchanged,
    fail_on_write,
    snapshot,
    write_zero_samples,
)


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


@pytest.mark.slow
def test_unreachable_device(trained_run):
    """Everything on the host is in order, so the failure is the SSH connection's own."""
    for stage in ("export", "convert"):  # in this process: only the bench needs its own
        assert invoke(stage, str(trained_run)).exit_code == 0
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
    assert_one_line_error(result, 2)


@pytest.mark.parametrize("command", ["bench", "pipeline"])
def test_an_unknown_device_runner_is_one_line_naming_the_registered_ones(trained_run, command):
    """`--runner` takes its choices from `deploy.runners`' registry (auto and every runner)."""
    before = snapshot(trained_run)
    args = (
        [command, str(trained_run)] if command == "bench" else [command, "--out", str(trained_run)]
    )
    result = invoke(*args, "--device", "pi@127.0.0.1", "--runner", "tflite")
    line = assert_one_line_error(result, 2)
    assert "tflite" in line and all(n in line for n in ("auto", "python", "lce_benchmark_model"))
    assert snapshot(trained_run) == before


def test_click_usage_error_with_json_prints_one_object():
    result = invoke("train", "--epochs", "0", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2


@pytest.mark.parametrize("threshold", ["-1", "nan"])
def test_sweep_bad_threshold_is_one_line(tmp_path, threshold):
    result = invoke(
        "sweep", "--gamma", "1e-3", "--threshold", threshold, "--out", str(tmp_path / "sweep")
    )
    assert_one_line_error(result, 2, "--threshold")
    assert not (tmp_path / "sweep").exists()


def test_sweep_rejects_duplicate_values_up_front(tmp_path):
    result = invoke(
        "sweep", "--gamma", "1e-3,0.001", "--threshold", "0", "--out", str(tmp_path / "sweep")
    )
    assert_one_line_error(result, 2, "--gamma", "0.001")
    assert not (tmp_path / "sweep").exists()


BENCH = ["--runs", "1", "--warmup", "0", "--samples", "4"]


def test_bench_truncated_samples_is_one_line(trained_run):
    write_zero_samples(trained_run)
    path = trained_run / "samples.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = snapshot(trained_run)
    assert_one_line_error(invoke("bench", str(trained_run), *BENCH), 2, "samples.npz", "truncated")
    assert snapshot(trained_run) == before


def test_bench_samples_of_another_models_shape_is_one_line(trained_run):
    write_zero_samples(trained_run, shape=(3, 32, 32))
    before = snapshot(trained_run)
    assert_one_line_error(
        invoke("bench", str(trained_run), *BENCH), 2, "[3, 32, 32]", "[1, 28, 28]"
    )
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
    write_zero_samples(trained_run)
    before = snapshot(trained_run)
    assert_one_line_error(invoke("bench", str(trained_run), *BENCH), 2, "2 inputs")
    assert snapshot(trained_run) == before


def test_bench_without_flatbuffers_measures_the_rest_and_says_what_it_skipped(trained_run):
    write_zero_samples(trained_run)
    result = invoke("bench", str(trained_run), *BENCH, "--json")
    assert result.exit_code == 0, result.output[-1500:]
    data = json.loads(result.stdout)
    assert [b["name"] for b in data["backends"]] == ["pytorch"]
    assert set(data["skipped"]) == {"onnxruntime", "tflite-float", "lce"}
    assert "bnnexport convert" in data["skipped"]["lce"]


def test_bench_skips_a_flatbuffer_made_from_an_older_onnx(trained_run):
    from bnnexport.run import provenance

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
    fail_on_write(monkeypatch, OSError(errno.EROFS, "Read-only file system", "run/x.tmp"))
    assert_one_line_error(invoke(command, str(trained_run)), 2, "read-only")
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
    assert_one_line_error(result, 2, fragment)
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
    assert_one_line_error(invoke("summary", str(path)), 2, "an ONNX model")


def test_missing_optional_dependency_is_one_line(trained_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    write_zero_samples(trained_run)
    assert invoke("bench", str(trained_run), *BENCH).exit_code == 0  # no ONNX model: not needed
    (trained_run / "model.onnx").write_bytes(b"\x08\x07")  # any file: the import comes first
    assert_one_line_error(
        invoke("bench", str(trained_run), *BENCH), 2, "onnxruntime", "pip install"
    )


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
    assert_one_line_error(invoke("train", "--resume", "--out", str(out)), 2, "bnnexport init")
    assert snapshot(out) == before


def test_resume_of_a_checkpoint_from_another_version_is_one_line(trained_run):
    _edit_checkpoint(trained_run, lambda c: c["config"].update(warp_factor=9))
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--epochs", "2")
    assert_one_line_error(result, 2, "warp_factor", "another version")
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
    assert_refused_unchanged(trained_run, ("train", "--resume", "--out", trained_run, *options),
                             2, fragment)  # fmt: skip


def test_resume_with_fewer_epochs_than_trained_is_refused(trained_run):
    _edit_checkpoint(trained_run, lambda c: c.update(epoch=3))
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--epochs", "2")
    assert_one_line_error(result, 2, "--epochs 2", "3 epoch")
    assert snapshot(trained_run) == before


def test_resume_of_a_finished_run_with_a_changed_option_is_refused(trained_run):
    before = snapshot(trained_run)
    result = invoke("train", "--resume", "--out", str(trained_run), "--lr", "0.005")
    assert_one_line_error(result, 2, "--lr", "raise --epochs")
    assert snapshot(trained_run) == before


@pytest.mark.slow
def test_resume_applies_and_records_a_changed_learning_rate(tmp_path):
    from support.image_folders import tiny_training

    from bnnexport.run.files import write_bytes_atomic

    trained_run = tmp_path / "run"  # 1 epoch at batch 4 on a tiny folder: epoch 2 costs nothing
    trained = invoke("train", *tiny_training(tmp_path / "data"), "--epochs", "1",
                     "--out", trained_run)  # fmt: skip
    assert trained.exit_code == 0, trained.output[-1500:]
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
        "6",
        "--json",
    )
    assert result.exit_code == 0, result.output[-1500:]
    assert json.loads(result.stdout)["resume_changes"]["lr"] == [0.001, 0.005]
    assert json.loads((trained_run / "config.json").read_text())["lr"] == 0.005
    from bnnexport.run.records import read_jsonl

    records = read_jsonl(trained_run / "metrics.jsonl")
    assert [r["changed"] for r in records if r["kind"] == "resume"] == [
        {"lr": [0.001, 0.005], "batch_size": [4, 6], "epochs": [1, 2]}
    ]
    assert {r["adam.lr"] for r in records if r["kind"] == "step" and r["epoch"] == 2} == {0.005}
    assert not (trained_run / "model.onnx").exists()  # made from the replaced checkpoint


def test_one_class_imagefolder_is_refused(tmp_path):
    from support.image_folders import write_image_folder

    root = write_image_folder(tmp_path / "images", classes=("cat",), per_class=2)
    result = invoke(
        "train", "--dataset", "imagefolder", "--data-dir", str(root), "--out", str(tmp_path / "run")
    )
    assert_one_line_error(result, 2, "at least 2 class", "'cat'")
    assert not (tmp_path / "run").exists()


def test_zoo_list_with_no_match_says_so():
    assert_one_line_error(invoke("zoo", "list", "NOSUCH"), 2, "no model matches 'NOSUCH'")


def test_train_torch_device_and_its_deprecated_spelling(tmp_path):
    for option in ("--torch-device", "--device"):
        assert_one_line_error(
            invoke("train", option, "tpu0", "--out", str(tmp_path / "r")), 2, "tpu0"
        )


def test_convert_at_a_batch_the_graph_hard_codes_away_is_one_line(tmp_path):
    """A dynamic input whose graph reshapes to a constant batch of 1: `--batch 2` is refused
    by name before any conversion, and nothing is written."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="/head/Reshape")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 18])], initializer=[shape],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "net.onnx"))
    before = snapshot(tmp_path)
    line = assert_one_line_error(invoke("convert", tmp_path / "net.onnx", "--batch", "2"), 2)
    assert "/head/Reshape" in line and "hard-codes batch 1" in line
    assert snapshot(tmp_path) == before


def test_allow_float_naming_no_binary_layer_is_one_line_before_tensorflow(tmp_path, monkeypatch):
    """A misspelt --allow-float was allowed silently: now one line naming it and the model's
    binary layers, before any translation to TensorFlow (which would fail this test)."""
    import bnnexport.converters.lce
    from support.converter_nets import StemAndBinaryConv, export

    def no_tensorflow(*args, **kwargs):
        raise AssertionError("translated to TensorFlow before refusing the name")

    monkeypatch.setattr(bnnexport.converters.lce, "translate", no_tensorflow)
    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "net.onnx")
    before = snapshot(tmp_path)
    args = ("convert", onnx_path, "--allow-float", "/conv/Conv", "--allow-float", "/cnov/Conv")
    line = assert_one_line_error(invoke(*args), 2, "'/cnov/Conv'", "binary layers", "/conv/Conv")
    assert "/stem" not in line  # the float stem is no binary layer
    assert snapshot(tmp_path) == before


def _labelled_samples(run: Path, labels: list[int]) -> None:
    import numpy as np

    inputs = np.zeros((len(labels), 1, 28, 28), np.float32)
    np.savez(run / "samples.npz", inputs=inputs, labels=np.asarray(labels, np.int64))


def test_bench_labels_beyond_the_models_classes_are_one_line_before_timing(
    trained_run, monkeypatch
):
    """mnist-bnn has 10 outputs: a label 10 (or 12) scored top-1 0.0 without a word. The check
    runs on the first backend's outputs, before anything is timed."""
    import bnnexport.stages.bench.host

    def no_timing(*args, **kwargs):
        raise AssertionError("timed a backend before checking the labels")

    monkeypatch.setattr(bnnexport.stages.bench.host, "time_calls", no_timing)
    _labelled_samples(trained_run, [3, 12, 10, -1])
    before = snapshot(trained_run)
    assert_one_line_error(
        invoke("bench", str(trained_run), *BENCH), 2, "samples.npz", "up to 12", "10 classes"
    )
    assert snapshot(trained_run) == before


def test_bench_a_label_below_minus_one_is_one_line(trained_run):
    _labelled_samples(trained_run, [3, -2, 1, 0])
    before = snapshot(trained_run)
    assert_one_line_error(invoke("bench", str(trained_run), *BENCH), 2, "samples.npz", "label -2")
    assert snapshot(trained_run) == before
