"""Quantization-aware training end to end: `train --float-layers int8` (here in Python) records
it, `export` writes the learnt ranges as QuantizeLinear/DequantizeLinear pairs checked against
PyTorch, and `convert` runs the float layers in int8 on those ranges without calibrating."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from bnnexport.converters.flatbuffer import flatbuffer_ops
from support.cli import invoke, run_in_process
from support.guarantees import assert_one_line_error
from support.image_folders import write_image_folder

from bnnexport.errors import ConfigError
from bnnexport.run.checkpoint import load_checkpoint, load_model
from bnnexport.training.config import TrainConfig, validate_config

pytestmark = pytest.mark.slow  # training, export and a TensorFlow conversion


@pytest.fixture(scope="module")
def qat_run(tmp_path_factory):
    """mnist-bnn trained 2 epochs with int8 float layers on 16x16 pictures, exported."""
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.train import train

    root = tmp_path_factory.mktemp("qat")
    data = write_image_folder(root / "data")
    config = TrainConfig(
        dataset="imagefolder", data_dir=str(data), dataset_options={"image_size": [16, 16]},
        batch_size=4, epochs=2, out=str(root / "run"), float_layers="int8",
    )  # fmt: skip
    train(config, progress=False)
    export_onnx(root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def converted(qat_run):
    result = invoke("convert", qat_run, "--json")  # int8: the run's own float layers
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _learnt_scales(run) -> list[float]:
    from bnnexport.stages.torch_probe import activation_quantizers

    return [float(q.scale) for q in activation_quantizers(load_model(run))]


def test_the_run_records_that_its_float_layers_trained_in_int8(qat_run):
    assert json.loads((qat_run / "config.json").read_text())["float_layers"] == "int8"
    checkpoint = load_checkpoint(qat_run / "checkpoint.pt")
    assert checkpoint["float_layers"] == "int8"
    binary = [v for k, v in checkpoint["model"].items() if k in {"features.2.weight",
              "features.5.weight", "classifier.1.weight"}]  # fmt: skip
    assert len(binary) == 3 and all(set(v.unique().tolist()) == {-1.0, 1.0} for v in binary)


def test_export_writes_the_learnt_ranges_as_quantize_dequantize_pairs(qat_run):
    model = onnx.load(str(qat_run / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear") == 4
    assert "ReduceMax" not in ops  # kernels are constants on their grid, not the arithmetic
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    scales = [float(initializers[n.input[1]]) for n in model.graph.node
              if n.op_type == "QuantizeLinear"]  # fmt: skip
    assert scales == pytest.approx(_learnt_scales(qat_run), rel=1e-6)


def test_convert_carries_the_trained_ranges_instead_of_calibrating(qat_run, converted):
    int8 = converted["int8"]
    assert converted["float_layers"] == "int8"
    ranges = (int8["ranges"], int8["calibration_samples"], int8["calibrated_points"])
    assert ranges == ("trained", 0, [])
    scales = sorted(p["scale"] for p in int8["tensor_points"].values())
    assert all(any(np.isclose(s, t, rtol=1e-6) for t in _learnt_scales(qat_run)) for s in scales)
    saved = json.loads((qat_run / "convert-int8.json").read_text())
    assert saved["int8"]["ranges"] == "trained"


def test_the_flatbuffer_runs_the_float_layers_in_int8_around_lce_bconv2d(qat_run, converted):
    ops = flatbuffer_ops((qat_run / "model-arm64-int8.tflite").read_bytes())
    assert sum(op.op_type == "LceBconv2d" for op in ops) == 3
    int8 = [op for op in ops if op.op_type in ("CONV_2D", "FULLY_CONNECTED")]
    assert int8 and all(op.input_types[:1] == ["INT8"] for op in int8)
    assert converted["int8"]["int8_layers"] == ["/features/features.0/Conv",
                                                "/classifier/classifier.3/Gemm"]  # fmt: skip


def _mutant_export(monkeypatch, change) -> None:
    """export writes `change`d copies of the model: an exporter mistake PyTorch does not see."""
    import copy

    import bnnexport.stages.export as export

    real = export.onnx_export

    def mutant(model, example, path, **options):
        changed = copy.deepcopy(model)
        change(changed)
        real(changed, example, path, **options)

    monkeypatch.setattr(export, "onnx_export", mutant)


def test_an_exported_activation_more_than_a_step_from_pytorch_s_is_refused(
    qat_run, tmp_path, monkeypatch
):
    """The stem's kernel written 5 % larger: its int8 output is then steps away from PyTorch's
    given the same int8 input, which the export check refuses in one line."""
    import torch

    def larger_stem(model):
        with torch.no_grad():
            model.features[0].weight.mul_(1.05)

    _mutant_export(monkeypatch, larger_stem)
    result = run_in_process("export", qat_run, "--out", tmp_path / "m.onnx")
    assert_one_line_error(result, 1, "steps from PyTorch's", "not kept")
    assert not (tmp_path / "m.onnx").exists()


def test_an_exported_activation_on_another_grid_is_refused(qat_run, tmp_path, monkeypatch):
    """One activation written with 3 times its scale: within a (coarser) step of PyTorch's
    values in its own steps, but not PyTorch's grid."""
    from bnnexport.stages.torch_probe import activation_quantizers

    _mutant_export(monkeypatch, lambda model: activation_quantizers(model)[1].scale.mul_(3.0))
    result = run_in_process("export", qat_run, "--out", tmp_path / "m.onnx")
    assert_one_line_error(result, 1, "in the ONNX model", "in PyTorch", "not kept")


def test_an_unknown_float_layer_precision_for_training_is_one_line(tmp_path):
    result = run_in_process("train", "--float-layers", "int4", "--out", tmp_path / "r")
    assert_one_line_error(result, 2, "--float-layers", "int4")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="--float-layers 'int4' is not one of float32, int8"):
        validate_config(TrainConfig(float_layers="int4"))


def test_bench_runs_a_quantization_aware_run_s_int8_flatbuffer(qat_run, converted):
    """A QAT run has no float flatbuffer: bench scores its int8 one against PyTorch (the model
    as trained, fake quantization included) and says why the float rows are missing."""
    result = invoke("bench", qat_run, "--runs", "2", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = {b["name"]: b for b in data["backends"]}
    assert {"pytorch", "lce-int8"} <= set(rows) and "lce" not in rows
    assert rows["lce-int8"]["top1"] is not None
    assert data["skipped"]["lce"] == (
        "model-arm64.tflite not found: a run trained with --float-layers int8 has its int8 "
        "flatbuffer (lce-int8) only"
    )
