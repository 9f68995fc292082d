"""`bench MODEL`: a flatbuffer or ONNX file of the user's, outside any run directory."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.cli import invoke
from support.converter_nets import StemAndBinaryConv
from support.guarantees import assert_one_line_error


@pytest.fixture(scope="module")
def _converted(tmp_path_factory):
    from bnnexport import convert_module

    folder = tmp_path_factory.mktemp("module")
    torch.manual_seed(0)
    convert_module(StemAndBinaryConv(), torch.randn(1, 2, 7, 7), out=folder / "net-arm64.tflite")
    return folder


@pytest.fixture
def converted(_converted, tmp_path):
    """A copy of a folder holding convert_module's net-arm64.tflite, .onnx and manifest."""
    folder = tmp_path / "mine"
    shutil.copytree(_converted, folder)
    (folder / "notes.txt").write_text("the user's own notes\n")
    return folder


def bench_file(*args: object):
    return invoke("bench", *args, "--runs", "3", "--warmup", "1")


@pytest.mark.slow
def test_a_convert_module_flatbuffer_is_benched_against_its_onnx_on_random_inputs(converted):
    result = bench_file(str(converted / "net-arm64.tflite"), "--samples", "20", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [b["name"] for b in report["backends"]] == ["onnxruntime", "lce"]
    assert report["random_inputs"] is True and report["samples"] == 20
    lce = report["backends"][1]
    assert lce["argmax_agreement"] == 1.0 and lce["top1"] is None  # random: no labels
    written = sorted(p.name for p in converted.iterdir())
    assert "net-arm64-bench.json" in written and "net-arm64-report.md" in written
    assert "net-arm64-bench_latency.png" in written
    assert "bench.json" not in written and "report.md" not in written
    assert (converted / "notes.txt").read_text() == "the user's own notes\n"
    text = (converted / "net-arm64-report.md").read_text()
    assert "random standard-normal inputs" in text and "(net-arm64-bench_latency.png)" in text


def test_samples_file_with_labels_gives_accuracy(converted, tmp_path):
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((12, 2, 7, 7)).astype(np.float32)
    samples = tmp_path / "mine.npz"
    np.savez(samples, inputs=inputs, labels=np.arange(12) % 4)
    result = bench_file(
        str(converted / "net-arm64.tflite"), "--samples-file", str(samples), "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["random_inputs"] is False and report["samples"] == 12
    assert all(b["top1"] is not None for b in report["backends"])
    onnx_top1 = report["backends"][0]["top1"]
    logits = _onnx_outputs(converted / "net-arm64.onnx", inputs)
    assert onnx_top1 == pytest.approx(float(np.mean(logits.argmax(1) == np.arange(12) % 4)))


def test_an_nhwc_flatbuffer_is_fed_the_nchw_samples_in_nhwc(converted, tmp_path):
    """The flatbuffer declares NHWC input (convert_module's default): bench feeds it the
    samples file's NCHW inputs transposed, so its outputs are ONNX Runtime's on the same
    samples and its top-1 the interpreter's own on NHWC inputs, computed here."""
    from bnnexport.converters.flatbuffer import input_layout, input_shapes
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    flatbuffer = converted / "net-arm64.tflite"
    assert (input_layout(flatbuffer), input_shapes(flatbuffer)) == ("nhwc", [[1, 7, 7, 2]])
    inputs = np.random.default_rng(2).standard_normal((12, 2, 7, 7)).astype(np.float32)
    labels = np.arange(12) % 4
    np.savez(tmp_path / "mine.npz", inputs=inputs, labels=labels)
    result = bench_file(str(flatbuffer), "--samples-file", str(tmp_path / "mine.npz"), "--json")
    assert result.exit_code == 0, result.output
    lce = json.loads(result.stdout)["backends"][1]
    assert lce["name"] == "lce" and lce["argmax_agreement"] == 1.0  # vs ONNX Runtime
    nhwc = Interpreter(flatbuffer.read_bytes()).predict(inputs.transpose(0, 2, 3, 1).copy())
    assert lce["top1"] == pytest.approx(float(np.mean(nhwc.argmax(1) == labels)))


@pytest.mark.parametrize(
    "labels, fragment",
    [([0, 36, 40, 3], "labels up to 40 but the model has 36 classes"), ([0, -3, 1, 2], "label -3")],
    ids=["beyond-the-classes", "below-minus-one"],
)
def test_labels_no_class_of_the_model_are_one_line(converted, tmp_path, labels, fragment):
    """Such labels gave top-1 0.0 without a word; the line names the file and the label."""
    samples = tmp_path / "mine.npz"
    inputs = np.zeros((4, 2, 7, 7), np.float32)
    np.savez(samples, inputs=inputs, labels=np.asarray(labels))
    before = sorted(p.name for p in converted.iterdir())
    result = bench_file(str(converted / "net-arm64.tflite"), "--samples-file", str(samples))
    line = assert_one_line_error(result, 2)
    assert str(samples) in line and fragment in line
    assert sorted(p.name for p in converted.iterdir()) == before


def _onnx_outputs(onnx_path, inputs):  # the reference, computed independently
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path))
    return np.concatenate([session.run(None, {session.get_inputs()[0].name: x[None]})[0]
                           for x in inputs])  # fmt: skip


def test_a_bare_flatbuffer_is_benched_alone(converted, tmp_path):
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    shutil.copy(converted / "net-arm64.tflite", alone / "model.tflite")
    result = bench_file(str(alone / "model.tflite"), "--samples", "8", "--json")
    assert result.exit_code == 0, result.output
    assert [b["name"] for b in json.loads(result.stdout)["backends"]] == ["lce"]


def test_samples_of_another_shape_are_one_line(converted, tmp_path):
    samples = tmp_path / "wrong.npz"
    np.savez(samples, inputs=np.zeros((4, 3, 7, 7), np.float32))
    before = sorted(p.name for p in converted.iterdir())
    assert_one_line_error(
        bench_file(str(converted / "net-arm64.tflite"), "--samples-file", str(samples)), 2
    )
    assert sorted(p.name for p in converted.iterdir()) == before


def test_samples_file_with_a_run_directory_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    samples = tmp_path / "s.npz"
    np.savez(samples, inputs=np.zeros((4, 2, 7, 7), np.float32))
    assert "--samples-file" in assert_one_line_error(
        bench_file(str(tmp_path / "run"), "--samples-file", str(samples)), 2
    )


def test_a_users_report_next_to_the_model_is_never_replaced(converted):
    (converted / "net-arm64-report.md").write_text("my own report\n")
    line = assert_one_line_error(
        bench_file(str(converted / "net-arm64.tflite"), "--samples", "4"), 2
    )
    assert "net-arm64-report.md" in line
    assert (converted / "net-arm64-report.md").read_text() == "my own report\n"


@pytest.mark.slow
def test_a_flatbuffer_file_on_a_device(converted, sshd, tmp_path):
    from support.recorded_outputs import TAB_OUTPUT

    (tmp_path / "output.txt").write_text(TAB_OUTPUT)
    stand_in = tmp_path / "lce_benchmark_model"
    stand_in.write_text(f"#!/bin/sh\ncat {tmp_path / 'output.txt'}\n")
    device = ["--device", sshd.destination, "--port", str(sshd.port), "--ssh-key", str(sshd.key)]
    for option in sshd.options:
        device += ["--ssh-option", option]
    device += ["--remote-tmp", str(sshd.remote_tmp), "--runner", "lce_benchmark_model"]
    device += ["--benchmark-binary", str(stand_in)]
    result = bench_file(str(converted / "net-arm64.tflite"), "--samples", "8", *device, "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["backends"][-1]
    assert row["name"] == "lce" and row["where"] == sshd.destination
    assert row["latency_ms"]["min"] == 15.002 and row["extra"]["peak_memory_mb"] == 9.8
    assert "latency only" in row["extra"]["note"]


@pytest.mark.parametrize(
    ("name", "what"),
    [("compare.png", "is an image"), ("checkpoint.pt", "is a checkpoint (bench the run "
     "directory it is in)"), ("notes.txt", "is a .txt file")],
)  # fmt: skip
def test_a_file_that_is_no_model_is_named_for_what_it_is(tmp_path, name, what):
    path = tmp_path / name
    path.write_bytes(b"\x89PNG")
    line = assert_one_line_error(invoke("bench", path), 2, f"{path} {what}")
    assert "no such" not in line and "an LCE flatbuffer (.tflite) or an ONNX model" in line


def test_a_missing_model_file_is_said_to_be_missing(tmp_path):
    assert_one_line_error(invoke("bench", tmp_path / "gone.tflite"), 2, "not found")
