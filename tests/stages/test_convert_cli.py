"""bnnexport convert: run directory or raw MODEL.onnx -> LCE flatbuffer, with its fidelity gate."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from support.cli import invoke
from support.converter_nets import PlainSign, StemAndBinaryConv, binary_conv, export, sign
from support.fresh_run import fresh_run
from support.guarantees import assert_one_line_error

from bnnexport.stages.export import export_onnx

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("seeded")]  # TensorFlow and LCE conversions


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """An untrained mnist-bnn run (fresh BatchNorm: exact-zero ties), exported and converted
    with --format tflite; returns (run dir, the --json report)."""
    run = fresh_run(tmp_path_factory.mktemp("convert") / "run")
    export_onnx(run, samples=300)
    result = invoke("convert", run, "--target", "arm64", "--format", "tflite", "--json")
    assert result.exit_code == 0, result.output
    return run, json.loads(result.stdout)


def test_every_binary_layer_of_mnist_bnn_becomes_an_lce_bconv2d(converted):
    _, report = converted
    assert report["binary_layers"] == 3
    assert report["lce_bconv2d"] == report["binary_layers"]
    assert report["op_histogram"]["LceBconv2d"] == 3
    assert report["fully_connected"] == 1  # only the float classifier head


def test_flatbuffer_agrees_with_onnx_runtime_and_pytorch_on_the_samples(converted):
    _, report = converted
    assert report["samples"] == 300 and not report["random_inputs"]
    assert report["argmax_agreement"] == 1.0 and report["torch_argmax_agreement"] == 1.0
    assert report["max_abs_diff"] < 1e-3 and report["torch_max_abs_diff"] < 1e-3


def test_report_is_written_to_convert_json_with_file_sizes(converted):
    run, report = converted
    saved = json.loads((run / "convert.json").read_text())
    assert saved["output"] == str(run / "model-arm64.tflite")
    assert saved["lce_bytes"] == (run / "model-arm64.tflite").stat().st_size
    assert saved["tflite_float_bytes"] == (run / "model-float.tflite").stat().st_size
    assert saved["lce_bytes"] * 10 < saved["tflite_float_bytes"]
    assert saved["lce_settings"] == {}  # an app's default LCE interpreter runs it


def test_the_report_says_where_the_time_went_stage_by_stage(converted):
    run, report = converted
    stages = report["stage_seconds"]
    assert list(stages) == ["export", "load", "normalise", "import", "translate", "lce_converter",
                            "tflite_converter", "gate", "twin"]  # fmt: skip
    assert stages["export"] == round(json.loads((run / "export.json").read_text())["seconds"], 3)
    # the import is 0 where an earlier test imported TensorFlow in this process
    assert stages["import"] >= 0 and all(v > 0 for k, v in stages.items() if k != "import"), stages
    inside = sum(v for k, v in stages.items() if k != "export")  # convert's own stages
    assert 0.95 * report["seconds"] < inside <= report["seconds"] + 0.01, (
        inside,
        report["seconds"],
    )


def test_float_tflite_runs_in_the_stock_interpreter(converted):
    from bnnexport.converters.gate import compare_outputs
    from bnnexport.converters.runtimes import run_onnx, run_tflite

    run, _ = converted
    with np.load(run / "samples.npz") as data:
        x = data["inputs"][:20]
    float_tflite = run_tflite(run / "model-float.tflite", x)
    check = compare_outputs(run_onnx(run / "model.onnx", x), float_tflite)
    assert check.argmax_agreement == 1.0 and check.max_abs_diff < 1e-3


def test_the_arm64_flatbuffer_takes_nhwc_input_with_no_transpose(converted):
    from bnnexport.converters.flatbuffer import input_layout, input_shapes

    run, report = converted
    assert (report["input_layout"], report["input_shape"]) == ("nhwc", [1, 28, 28, 1])
    assert "TRANSPOSE" not in report["op_histogram"], report["op_histogram"]
    saved = json.loads((run / "convert.json").read_text())
    assert (saved["input_layout"], saved["input_shape"]) == ("nhwc", [1, 28, 28, 1])
    for flatbuffer in ("model-arm64.tflite", "model-float.tflite"):  # declared in the metadata
        assert input_layout(run / flatbuffer) == "nhwc"
        assert input_shapes(run / flatbuffer) == [[1, 28, 28, 1]]


def test_input_layout_nchw_keeps_the_onnx_input_and_one_transpose(tmp_path):
    from bnnexport.converters.flatbuffer import input_layout, input_shapes

    path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "plain.onnx")
    result = invoke("convert", path, "--input-layout", "nchw", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["input_layout"], report["input_shape"]) == ("nchw", [1, 2, 7, 7])
    assert report["argmax_agreement"] == 1.0
    flatbuffer = tmp_path / "plain-arm64.tflite"
    assert (input_layout(flatbuffer), input_shapes(flatbuffer)) == ("nchw", [[1, 2, 7, 7]])
    assert _input_transposes(flatbuffer) == 1  # NCHW turned NHWC inside the model


def _input_transposes(flatbuffer) -> int:
    """The TRANSPOSE ops reading a tensor of the flatbuffer's input shape (the flatten at the
    end of StemAndBinaryConv has a TRANSPOSE of its own, to NCHW order)."""
    from bnnexport.converters.flatbuffer import flatbuffer_ops, input_shapes

    shape = input_shapes(flatbuffer)[0]
    ops = flatbuffer_ops(flatbuffer)
    return sum(op.op_type == "TRANSPOSE" and op.input_shapes[0] == shape for op in ops)


def test_help_explains_the_input_layout(tmp_path):
    result = invoke("convert", "--help")
    text = " ".join(result.stdout.split())
    assert "--input-layout [nhwc|nchw]" in text and "no TRANSPOSE op at its input" in text
    assert "[default: nhwc, for arm64 and arm32]" in text


def test_an_unknown_input_layout_is_one_line_exit_2(tmp_path):
    path = tmp_path / "plain.onnx"
    path.write_bytes(b"")  # never read: the option is refused first
    assert_one_line_error(invoke("convert", path, "--input-layout", "nwhc"), 2, "nwhc")


def test_an_input_layout_for_a_model_without_an_image_input_is_one_line_exit_2(tmp_path):
    path = export(nn.Sequential(nn.Linear(16, 4)), (1, 16), tmp_path / "flat.onnx")
    result = invoke("convert", path, "--input-layout", "nhwc")
    assert_one_line_error(result, 2, "--input-layout nhwc: the model has no NCHW image input")
    assert not (tmp_path / "flat-arm64.tflite").exists()


def test_raw_onnx_without_dataset_is_checked_on_random_inputs(tmp_path):
    path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "plain.onnx")
    result = invoke("convert", path, "--target", "arm32", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["random_inputs"] and report["lce_bconv2d"] == 1
    assert report["binary_parameters"] is None  # no record of its binary kernels, unlike a run's
    assert report["input_layout"] == "nhwc" and report["input_shape"] == [1, 7, 7, 2]
    assert _input_transposes(tmp_path / "plain-arm32.tflite") == 0  # (flatten keeps its own)
    assert report["output"] == str(tmp_path / "plain-arm32.tflite")
    assert (tmp_path / "plain-arm32.tflite").is_file()
    # only --format tflite builds (and writes) the float model: its converter is a second one
    assert report["tflite_float_bytes"] is None and not (tmp_path / "plain-float.tflite").exists()


@pytest.fixture(scope="module")
def converted_to_out(tmp_path_factory):
    """proj/net.onnx (beside the user's notes) converted with --out elsewhere/mine.tflite
    --format tflite; returns (proj, elsewhere, the --json report, proj's files before)."""
    from support.guarantees import snapshot

    root = tmp_path_factory.mktemp("out")
    proj, elsewhere = root / "proj", root / "elsewhere"
    proj.mkdir()
    path = export(StemAndBinaryConv(), (1, 2, 7, 7), proj / "net.onnx")
    (proj / "notes.txt").write_text("the user's notes\n")
    before = snapshot(proj)
    out = elsewhere / "mine.tflite"
    result = invoke("convert", path, "--out", out, "--format", "tflite", "--json")
    assert result.exit_code == 0, result.output
    return proj, elsewhere, json.loads(result.stdout), before


def test_out_puts_the_flatbuffer_where_asked_and_nothing_beside_the_onnx(converted_to_out):
    from support.guarantees import snapshot

    proj, elsewhere, report, before = converted_to_out
    assert report["output"] == str(elsewhere / "mine.tflite")
    assert report["float_output"] == str(elsewhere / "mine-float.tflite")
    assert snapshot(proj) == before  # not a file more, not a byte changed
    assert sorted(p.name for p in elsewhere.iterdir()) == [
        "mine-float.tflite", "mine.tflite", "provenance.json"
    ]  # fmt: skip


def test_bench_of_the_out_flatbuffer_finds_the_onnx_it_was_made_from(converted_to_out):
    _, elsewhere, _, _ = converted_to_out
    result = invoke("bench", elsewhere / "mine.tflite", "--runs", "2", "--samples", "4", "--json")
    assert result.exit_code == 0, result.output
    backends = json.loads(result.stdout)["backends"]
    assert [b["name"] for b in backends] == ["onnxruntime", "lce"]
    assert backends[1]["argmax_agreement"] == 1.0


def test_unsupported_op_exits_2_naming_node_and_op_type(tmp_path):
    class Net(nn.Module):
        def forward(self, x):
            return torch.erf(x).flatten(1)

    path = export(Net(), (1, 2, 3, 3), tmp_path / "erf.onnx")
    result = invoke("convert", path)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "op type Erf" in lines[0] and "/Erf" in lines[0]
    assert "from the PyTorch model's own forward()" in lines[0]  # the module it came from
    assert "Conv" in lines[0]  # it lists what is supported
    assert not (tmp_path / "erf-arm64.tflite").exists()


def test_gate_failure_exits_1_and_keeps_no_flatbuffer(tmp_path, monkeypatch):
    import bnnexport.converters.gate.checks

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = binary_conv(4, 8)

        def forward(self, x):
            return self.conv(sign(x)).flatten(1)

    path = export(Net(), (1, 4, 5, 5), tmp_path / "net.onnx")
    real = bnnexport.converters.gate.checks.run_lce
    monkeypatch.setattr(
        bnnexport.converters.gate.checks, "run_lce", lambda p, x: real(p, x) * -1.0 + 0.5
    )
    result = invoke("convert", path)
    assert result.exit_code == 1
    assert "LCE vs ONNX Runtime disagree" in result.stderr and "no flatbuffer kept" in result.stderr
    refusal = tmp_path / "net-arm64-gate-refusal.json"  # the diagnostics, named in the line
    assert f"diagnostics in {refusal}" in result.stderr and len(result.stderr.splitlines()) == 1
    assert json.loads(refusal.read_text())["comparison"] == "LCE vs ONNX Runtime"
    assert not list(tmp_path.glob("*.tflite"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "net-arm64-gate-refusal.json", "net.onnx", "provenance.json"
    ]  # fmt: skip


def test_truncated_onnx_exits_2_with_one_line(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07\x12\x05torch\x1a")
    result = invoke("convert", path)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_run_without_model_onnx_exits_2_pointing_at_export(tmp_path):
    run = fresh_run(tmp_path / "run")
    result = invoke("convert", run)
    assert result.exit_code == 2 and "bnnexport export" in result.stderr


def test_op_histogram_rejects_a_truncated_flatbuffer(converted):
    from bnnexport.converters.errors import InvalidModelError
    from bnnexport.converters.flatbuffer import op_histogram

    run, _ = converted
    data = (run / "model-arm64.tflite").read_bytes()
    with pytest.raises(InvalidModelError):
        op_histogram(data[: len(data) // 50])


def test_signature_outputs_names_the_flatbuffer_outputs_in_order(converted):
    from bnnexport.converters.errors import InvalidModelError
    from bnnexport.converters.flatbuffer import signature_outputs

    run, _ = converted
    data = (run / "model-arm64.tflite").read_bytes()
    assert signature_outputs(data) == ["output_0"]
    for broken in (data[:16], bytes(64)):  # the tables sit at the front: cut into them
        with pytest.raises(InvalidModelError):
            signature_outputs(broken)


def test_training_modules_do_not_import_tensorflow():
    code = (
        "import sys, bnnexport.cli, bnnexport.stages.export, bnnexport.stages.convert, "
        "bnnexport.converters.lce, bnnexport.converters.patterns; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_flatbuffer_is_compared_with_pytorch_itself_on_every_sample(converted):
    """LCE's own outputs against PyTorch's, plain and resolved, on all samples: a model.onnx
    that no longer matches the checkpoint fails even where ONNX Runtime and LCE agree."""
    run, report = converted
    torch_check = next(c for c in report["checks"] if c["reference"] == "PyTorch")
    assert torch_check["candidate"] == "LCE" and torch_check["samples"] == report["samples"]
    assert report["twin_max_abs_diff"] == 0.0
    assert {(c["candidate"], c["reference"]) for c in report["twin_checks"]} == {
        ("LCE twin", "ONNX Runtime twin"),
        ("LCE twin", "PyTorch twin"),
    }


def test_a_stale_model_onnx_is_refused_against_pytorch(tmp_path):
    """The checkpoint changed after export: ONNX Runtime and LCE still agree with each other,
    but not with PyTorch, and convert exits 1."""
    from bnnexport.run.checkpoint import load_checkpoint, save_checkpoint

    run = fresh_run(tmp_path / "run")
    export_onnx(run, samples=30)
    checkpoint = load_checkpoint(run)
    for key, value in checkpoint["model"].items():
        if key.endswith("weight") and value.dim() == 4:  # flip the first binary conv's kernel
            checkpoint["model"][key] = -value
            break
    save_checkpoint(run / "checkpoint.pt", checkpoint)
    result = invoke("convert", run)  # the provenance record knows model.onnx is stale ...
    assert result.exit_code == 2 and "is stale" in result.stderr
    (run / "provenance.json").unlink()  # ... and without it, the gate's PyTorch check does
    result = invoke("convert", run)
    assert result.exit_code == 1, result.output
    assert "LCE vs PyTorch disagree" in result.stderr
    assert not (run / "model-arm64.tflite").exists()


class PadPoolNet(nn.Module):
    """sign -> pad(+1) -> max-pool -> ±1 conv: binary, but no binary form exists for it."""

    def __init__(self):
        super().__init__()
        self.conv = binary_conv(4, 8)

    def forward(self, x):
        x = torch.nn.functional.pad(sign(x), (1, 1, 1, 1), value=1.0)
        return self.conv(torch.nn.functional.max_pool2d(x, 2)).flatten(1)


def test_a_binary_layer_left_float_exits_1_naming_it(tmp_path):
    path = export(PadPoolNet(), (1, 4, 8, 8), tmp_path / "padpool.onnx")
    result = invoke("convert", path)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "/conv/Conv" in lines[0] and "would stay float" in lines[0]
    assert "--allow-float" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["padpool.onnx"]


@pytest.mark.parametrize("allowed", ["/conv/Conv", "all"])
def test_allow_float_converts_and_lists_the_fallback(tmp_path, allowed):
    path = export(PadPoolNet(), (1, 4, 8, 8), tmp_path / "padpool.onnx")
    result = invoke("convert", path, "--allow-float", allowed, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["float_fallbacks"] == ["/conv/Conv"] and report["lce_bconv2d"] == 0


def plain_sign_net(binarize, relu: bool = False) -> nn.Module:
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = binary_conv(4, 8)

        def forward(self, x):
            return self.conv(binarize(torch.relu(x) if relu else x)).flatten(1)

    return Net()


SIGNS = pytest.mark.parametrize("binarize", [torch.sign, PlainSign.apply], ids=["sign", "function"])


@SIGNS
def test_a_plain_sign_no_zero_reaches_converts_and_is_listed(tmp_path, binarize):
    path = export(plain_sign_net(binarize), (1, 4, 6, 6), tmp_path / "plain.onnx")
    result = invoke("convert", path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["lce_bconv2d"] == 1 and report["rewrites"]["plain-sign"] == 1
    assert len(report["zero_free_signs"]) == 1


@SIGNS
def test_a_plain_sign_reached_by_exact_zeros_is_refused_with_what_to_change(tmp_path, binarize):
    path = export(plain_sign_net(binarize, relu=True), (1, 4, 6, 6), tmp_path / "plain.onnx")
    result = invoke("convert", path)
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "exact zero(s) reach the plain Sign" in line and "sign(sign(x) + 0.1)" in line
    assert len(line.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.onnx"]


@SIGNS
def test_a_plain_sign_without_its_rewrite_is_refused_with_what_was_seen(tmp_path, binarize):
    path = export(plain_sign_net(binarize), (1, 4, 6, 6), tmp_path / "plain.onnx")
    result = invoke("convert", path, "--disable-rewrite", "plain-sign")
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "plain Sign, which maps 0 to 0" in line and "sign(sign(x) + 0.1)" in line
    assert len(line.splitlines()) == 1


def test_an_unknown_rewrite_pass_is_one_line_naming_the_passes(tmp_path):
    path = export(plain_sign_net(torch.sign), (1, 4, 6, 6), tmp_path / "plain.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = invoke("convert", path, "--disable-rewrite", "no-such-pass")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "unknown pass 'no-such-pass'" in line
    assert "plain-sign" in line  # the passes it knows
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("option", ["--batched-copy", "--batch-twin"])
def test_a_bad_batched_copy_size_is_one_line_and_touches_nothing(tmp_path, option):
    """The batched copy's option, and its deprecated spelling, refuse a batch of 0 before any
    work: one line, exit 2, every file where it was."""
    from support.guarantees import assert_refused_unchanged

    (tmp_path / "net.onnx").write_bytes(b"the user's own file, not a model")
    line = assert_refused_unchanged(tmp_path, ("convert", tmp_path / "net.onnx", option, "0"), 2)
    assert "0" in line and ("--batched-copy" in line or option in line), line
