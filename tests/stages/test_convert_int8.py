"""bnnexport convert --float-layers int8 (and convert_module(float_layers="int8")): the float
layers of a trained run in int8 beside its float32 flatbuffer, the report saying which and what
it cost, and bad input refused in one line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from bnnexport.converters.flatbuffer import flatbuffer_ops
from support.cli import invoke
from support.converter_nets import FloatStemBinaryBody
from support.guarantees import assert_one_line_error, assert_refused_unchanged, snapshot

from bnnexport.stages.export import export_onnx

pytestmark = pytest.mark.slow  # TensorFlow and LCE conversions


@pytest.fixture(scope="module")
def exported(_trained_run_template, tmp_path_factory):
    """The 1-epoch mnist-bnn run, exported on 300 samples."""
    import shutil

    run = tmp_path_factory.mktemp("int8") / "run"
    shutil.copytree(_trained_run_template, run)
    export_onnx(run, samples=300)
    return run


@pytest.fixture(scope="module")
def converted(exported):
    """The run converted with --float-layers int8; (run, the --json report)."""
    result = invoke("convert", exported, "--float-layers", "int8", "--json")
    assert result.exit_code == 0, result.output
    return exported, json.loads(result.stdout)


def test_int8_writes_its_own_flatbuffer_and_report_beside_the_float_ones(converted):
    run, report = converted
    assert report["output"] == str(run / "model-arm64-int8.tflite")
    assert json.loads((run / "convert-int8.json").read_text())["float_layers"] == "int8"
    assert not (run / "convert.json").exists() and not (run / "model-arm64.tflite").exists()
    from bnnexport.run.provenance import stale_reason

    assert stale_reason(run, "model-arm64-int8.tflite") is None  # recorded, from model.onnx


def test_the_stem_and_the_head_are_int8_ops_and_every_binary_layer_an_lce_bconv2d(converted):
    run, report = converted
    int8 = report["int8"]
    assert int8["int8_layers"] == ["/features/features.0/Conv", "/classifier/classifier.3/Gemm"]
    assert int8["int8_ops"] == 2 and int8["float_ops"] == 0 and int8["kept_float"] == {}
    assert report["lce_bconv2d"] == report["binary_layers"] == 3
    ops = flatbuffer_ops(run / "model-arm64-int8.tflite")
    assert [op.input_types[0] for op in ops if op.op_type == "CONV_2D"] == ["INT8", "INT8"]


def test_the_report_gives_the_accuracy_against_the_float_model(converted):
    _, report = converted
    accuracy = report["int8"]["accuracy"]
    assert accuracy["labelled"] == 300 and accuracy["float_argmax_agreement"] >= 0.97
    assert accuracy["top1_drop_points"] <= 1.0  # else convert would have refused
    assert report["int8"]["ranges"] == "calibrated" and report["int8"]["calibration_samples"]
    gate = report["checks"][0]
    assert (gate["candidate"], gate["argmax_agreement"]) == ("LCE int8", 1.0)


def test_the_table_says_which_layers_are_int8_and_what_it_cost(exported, converted):
    result = invoke("convert", exported, "--float-layers", "int8", "--calibration-samples",
                    exported / "samples.npz")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 layers in int8, 2 int8 ops" in result.stdout
    assert "against the float model: argmax agreement" in result.stdout


def test_an_unknown_float_layer_precision_is_one_line(exported):
    assert_refused_unchanged(exported, ("convert", exported, "--float-layers", "int4"), 2,
                             "'int4' is not one of 'float32', 'int8'")  # fmt: skip


def test_calibration_samples_of_the_wrong_shape_are_one_line_and_nothing_is_written(
    exported, tmp_path
):
    bad = tmp_path / "calibration.npz"
    np.savez(bad, inputs=np.zeros((4, 1, 9, 9), np.float32))
    args = ("convert", exported, "--float-layers", "int8", "--calibration-samples", bad)
    assert_refused_unchanged(exported, args, 2, "[4, 1, 9, 9] do not fit", "[1, 1, 28, 28]")


def test_a_calibration_file_that_is_no_samples_archive_is_one_line(exported, tmp_path):
    bad = tmp_path / "calibration.npz"
    bad.write_text("not an archive")
    args = ("convert", exported, "--float-layers", "int8", "--calibration-samples", bad)
    assert_refused_unchanged(exported, args, 2, "calibration.npz")


def test_a_float_tflite_copy_is_no_int8_output(exported):
    args = ("convert", exported, "--float-layers", "int8", "--format", "tflite")
    assert_refused_unchanged(exported, args, 2, "not written for an int8 conversion")


def test_an_accuracy_limit_below_the_loss_is_refused_in_one_line(exported, tmp_path):
    crushed = tmp_path / "crushed.npz"  # ranges of [0, 0]: the inputs lose their negatives
    np.savez(crushed, inputs=np.zeros((4, 1, 28, 28), np.float32))
    kept = snapshot(exported)
    result = invoke("convert", exported, "--float-layers", "int8", "--calibration-samples",
                    crushed, "--max-accuracy-drop", "0.5")  # fmt: skip
    assert_one_line_error(result, 1, "points of top-1", "--max-accuracy-drop")
    after = snapshot(exported)
    assert after.pop("gate-refusal.json") and after.pop("provenance.json")
    assert after == {k: v for k, v in kept.items() if k != "provenance.json"}  # nothing kept


def test_convert_module_runs_the_float_layers_of_a_module_in_int8(tmp_path):
    from bnnexport import convert_module

    torch.manual_seed(0)
    x = torch.from_numpy(
        np.random.default_rng(0).uniform(-1, 1, (32, 3, 8, 8)).astype(np.float32)
    )  # fmt: skip
    report = convert_module(FloatStemBinaryBody(), x[:1], out=tmp_path / "net.tflite",
                            samples=x, float_layers="int8")  # fmt: skip
    assert report.float_layers == "int8" and report.int8["int8_ops"] == 2
    assert report.lce_bconv2d == report.binary_layers == 2
    assert report.torch_argmax_agreement >= 0.9  # against the float module


def test_bench_puts_the_int8_flatbuffer_beside_the_float_one_on_the_host(converted, tmp_path):
    """Latency, size, top-1 and agreement with PyTorch for both flatbuffers, side by side."""
    import shutil

    from bnnexport.converters.runtimes import run_lce

    run = tmp_path / "run"
    shutil.copytree(converted[0], run)
    assert invoke("convert", run).exit_code == 0  # the float flatbuffer beside the int8 one
    result = invoke("bench", run, "--runs", "2", "--warmup", "0", "--samples", "50", "--json")
    assert result.exit_code == 0, result.output
    rows = {b["name"]: b for b in json.loads(result.stdout)["backends"]}
    lce, int8 = rows["lce"], rows["lce-int8"]
    assert int8["size_bytes"] == (run / "model-arm64-int8.tflite").stat().st_size
    assert int8["size_bytes"] < lce["size_bytes"] and int8["latency_ms"]["mean"] > 0
    with np.load(run / "samples.npz") as samples:
        inputs, labels = samples["inputs"][:50], samples["labels"][:50]
    mine = run_lce(run / "model-arm64-int8.tflite", inputs)
    assert int8["top1"] == pytest.approx(float(np.mean(mine.argmax(1) == labels)))
    from bnnexport.run.checkpoint import load_model
    from bnnexport.stages.export import torch_outputs

    reference = torch_outputs(load_model(run), inputs)
    agreement = np.mean(mine.argmax(1) == reference.argmax(1))
    assert int8["argmax_agreement"] == pytest.approx(agreement)
    table = invoke("bench", run, "--runs", "2", "--warmup", "0", "--samples", "50").stdout
    assert "lce-int8" in table and "lce " in table
