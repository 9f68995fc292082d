"""`convert --float-layers int8 --io int8` of a model ending in a binary layer: a papers-style BNN
whose head is a binary matmul + BatchNorm (tests/support/own_models.py `plus_minus_one_bnn`),
calibrated after training and trained with its float layers in int8. No int8 layer writes its
output, so the converter quantizes the output itself (an output point of its own, calibrated):
the flatbuffer takes and gives int8, checked against the float-io one like any int8-io copy."""

from __future__ import annotations

import json

import pytest
from bnnexport.converters.runtimes import lce_interpreter
from support.cli import invoke, run_in_process
from support.guarantees import assert_one_line_error
from support.image_folders import tiny_training

pytestmark = pytest.mark.slow  # training, export and TensorFlow conversions

MODEL = "support.own_models:plus_minus_one_bnn"


def _cli_json(*args) -> dict:
    result = run_in_process(*map(str, args), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module", params=["calibrated", "trained"])
def int8_io_run(request, tmp_path_factory):
    """(the run, its `convert --io int8` report), its ranges calibrated or trained (QAT)."""
    root = tmp_path_factory.mktemp(f"int8-io-{request.param}")
    qat = ["--float-layers", "int8"] if request.param == "trained" else []
    run = root / "run"
    _cli_json("train", "--model", MODEL, *tiny_training(root), "--epochs", "2", "--init-sign",
              *qat, "--out", run)  # fmt: skip
    _cli_json("export", run)
    report = _cli_json("convert", run, "--float-layers", "int8", "--io", "int8")
    return run, report, request.param


def test_a_model_ending_in_a_binary_layer_converts_with_int8_input_and_output(int8_io_run):
    run, report, ranges = int8_io_run
    assert report["int8"]["io"] == "int8" and report["int8"]["ranges"] == ranges
    interpreter = lce_interpreter(run / "model-arm64-int8.tflite", 1)
    assert [str(t) for t in (*interpreter.input_types, *interpreter.output_types)] == ["int8"] * 2
    assert report["lce_bconv2d"] == report["binary_layers"] == 3


def test_its_output_gets_an_activation_point_of_its_own(int8_io_run):
    _run, report, ranges = int8_io_run
    assert "logits" in report["int8"]["tensor_points"]  # the graph's output, as export names it
    if ranges == "trained":  # QAT learnt no range there: it is calibrated, and says so
        assert report["int8"]["calibrated_points"] == ["logits"]


def test_a_float_output_left_by_lces_converter_is_one_line_not_a_traceback(
    int8_io_run, monkeypatch
):
    """Were the output point missing, LCE would leave the output float: refused saying so."""
    import bnnexport.converters.lce
    from bnnexport.converters.quantize import quantize

    def without_output_point(model, calibration, given=None, int8_outputs=False):
        return quantize(model, calibration, given)

    monkeypatch.setattr(bnnexport.converters.lce, "quantize", without_output_point)
    run, _report, _ranges = int8_io_run
    result = invoke("convert", run, "--float-layers", "int8", "--io", "int8")
    assert_one_line_error(result, 2, "--io int8", "input or output float", "--io float32")


def test_the_report_counts_int8_convs_as_int8_and_says_what_its_replay_took(int8_io_run):
    from bnnexport.stages.convert import ConvertReport

    _run, report, _ranges = int8_io_run
    assert (report["float_conv2d"], report["int8_conv2d"]) == (0, 1)  # the stem, in int8
    table = ConvertReport(**report).to_table()
    check = next(line for line in table.splitlines() if line.startswith("  LCE int8 vs"))
    assert "samples replayed at int8 steps" in check and "tie samples" not in check
    assert "(binarization signs tied, of those)" in table
