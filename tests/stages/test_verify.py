"""bnnexport verify: binary kernels strictly ±1, inputs binarized, one-line errors for bad files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from support.cli import run_in_process
from support.converter_nets import export
from torch import nn

from bnnexport.nn.layers import BinaryConv2d, BinaryLinear
from bnnexport.nn.quantizers import Quantizer
from bnnexport.run.checkpoint import load_checkpoint, save_checkpoint
from bnnexport.stages.verify import verify, verify_model

# (layer, index of the weight set off) in the default mnist-bnn
OFF_LAYER, OFF_INDEX = "features.5", (3, 1, 2, 0)


def run_verify(*args: str) -> subprocess.CompletedProcess:
    return run_in_process("verify", *args)


def checkpoint_with_one_weight(run: Path, value: float, target: Path) -> Path:
    data = load_checkpoint(run)
    data["model"][f"{OFF_LAYER}.weight"][OFF_INDEX] = value
    save_checkpoint(target, {k: v for k, v in data.items() if k not in ("format", "version")})
    return target


def test_trained_run_verifies_and_writes_verify_json(trained_run):
    result = run_verify(str(trained_run), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["strict"] is True and report["offending"] == []
    assert [layer["name"] for layer in report["layers"]] == [
        "features.2",
        "features.5",
        "classifier.1",
    ]
    assert report["binary_parameters"] == 32 * 64 * 9 + 64 * 64 * 9 + 3136 * 128
    assert json.loads((trained_run / "verify.json").read_text())["strict"] is True


@pytest.mark.parametrize("value", [0.5, 0.0, float("nan")])
def test_one_non_binary_weight_fails_naming_the_layer(trained_run, tmp_path, value):
    bad = checkpoint_with_one_weight(trained_run, value, tmp_path / "bad.pt")
    result = run_verify(str(bad))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "not binary" in line]
    assert len(lines) == 1
    assert OFF_LAYER in lines[0] and "1 of 36864" in lines[0]
    assert "[3, 1, 2, 0]=" + ("nan" if value != value else f"{value:g}") in lines[0]


def test_json_lists_the_offending_layer_with_its_index(trained_run, tmp_path):
    bad = checkpoint_with_one_weight(trained_run, 0.5, tmp_path / "bad.pt")
    result = run_verify(str(bad), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["strict"] is False
    assert [(o["name"], o["off"], o["examples"]) for o in report["offending"]] == [
        (OFF_LAYER, 1, [[list(OFF_INDEX), 0.5]])
    ]


def test_truncated_checkpoint_exits_2_with_one_line(trained_run, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((trained_run / "checkpoint.pt").read_bytes()[:4000])
    result = run_verify(str(truncated))
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["missing.onnx", "missing.pt", "missing_dir"])
def test_missing_file_exits_2_with_one_line(tmp_path, name):
    result = run_verify(str(tmp_path / name))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_foreign_onnx_file_exits_2_with_one_line(tmp_path):
    foreign = tmp_path / "model.onnx"
    foreign.write_bytes(b"this is not a protobuf \x00\xff\x12" * 20)
    result = run_verify(str(foreign))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_binary_onnx_model_verifies(tmp_path):
    model = nn.Sequential(BinaryConv2d(32, 16, 3, padding=1), nn.Flatten(), BinaryLinear(1024, 8))
    result = run_verify(str(export(model, (1, 32, 8, 8), tmp_path / "m.onnx")), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(layer["op"], layer["kernel"]) for layer in report["layers"]] == [
        ("Conv", "strict"),
        ("MatMul", "strict"),
    ]
    assert report["binary_parameters"] == 16 * 32 * 9 + 1024 * 8


def test_onnx_kernel_with_folded_batchnorm_is_accepted_as_scaled(tmp_path):
    model = nn.Sequential(BinaryConv2d(32, 16, 3), nn.BatchNorm2d(16))
    model[1].running_var.uniform_(0.5, 2.0)  # a scale other than 1 in every channel
    # constant folding (the exporter's default) folds BatchNorm into the kernel
    result = run_verify(str(export(model, (1, 32, 8, 8), tmp_path / "m.onnx")), "--json")
    assert result.returncode == 0, result.stderr
    (layer,) = json.loads(result.stdout)["layers"]
    assert layer["kernel"] == "scaled" and layer["scale_range"][0] > 0


def test_onnx_non_binary_kernel_fails_naming_the_node(tmp_path):
    import onnx

    model = nn.Sequential(BinaryConv2d(32, 16, 3), nn.Flatten(), BinaryLinear(576, 8))
    with torch.no_grad():
        model[2].weight[5, 7] = 0.25
    path = export(model, (1, 32, 8, 8), tmp_path / "m.onnx")
    node = next(n.name for n in onnx.load(str(path)).graph.node if n.op_type == "MatMul")
    result = run_verify(str(path))
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if "not binary" in line]
    # MatMul stores the kernel transposed: [in, out]
    assert node in line and "1 of 4608" in line and "[7, 5]=0.25" in line


def test_onnx_model_without_binary_layers_does_not_verify(tmp_path):
    path = export(nn.Sequential(nn.Conv2d(3, 4, 3)), (1, 3, 8, 8), tmp_path / "float.onnx")
    report = verify(path)
    assert report.strict is False and "no binary layers" in report.offending[0]["message"]


def test_first_layer_with_real_input_is_reported_as_such():
    model = nn.Sequential(BinaryConv2d(1, 8, 3, input_quantizer=None), BinaryConv2d(8, 8, 3))
    report = verify_model(model)
    assert report.strict
    assert [layer.input for layer in report.layers] == ["real (first layer)", "ste_sign"]


def test_a_k_bit_input_is_accepted_and_reported_as_not_binary():
    """DoReFa-Net's 2-bit activations: its kernels are binary kernels (strictly ±1), its
    layers are no binary layers."""
    model = nn.Sequential(BinaryConv2d(8, 8, 3, input_quantizer="dorefa"))
    report = verify_model(model)
    assert report.strict
    assert report.layers[0].input == "dorefa (2-bit, not binary)"


def test_unregistered_input_quantizer_is_not_supported():
    class Halve(Quantizer):  # not registered: nobody can tell what it exports to
        def forward(self, x):
            return x / 2

    model = nn.Sequential(BinaryConv2d(8, 8, 3, input_quantizer=Halve()))
    report = verify_model(model)
    assert report.strict is False
    assert report.layers[0].input.startswith("unsupported")
    assert "0 (BinaryConv2d): input unsupported" in report.offending[0]["message"]


def test_training_ends_with_a_strict_verify(trained_run):
    assert json.loads((trained_run / "train.json").read_text())["strict"] is True
    assert json.loads((trained_run / "verify.json").read_text())["strict"] is True


@pytest.mark.parametrize("record", ["none", "names"])
def test_a_checkpoint_from_before_records_is_decided_by_the_same_function(
    trained_run, tmp_path, record
):
    """No `binary_kernels` (a zoo run of an older version), or a list of names (a model of your
    own from an older version): decided when read, to the same record training writes now."""
    data = load_checkpoint(trained_run)
    names = [k["name"] for k in data["binary_kernels"]["kernels"]]
    data = {k: v for k, v in data.items() if k not in ("format", "version", "binary_kernels")}
    if record == "names":
        data["binary_kernels"] = names
    old = save_checkpoint(tmp_path / "old.pt", data)
    report = verify(old)
    assert report.strict and report.binary_parameters == 456704
    assert [layer.name for layer in report.layers] == ["features.2", "features.5", "classifier.1"]
