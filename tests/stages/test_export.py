"""bnnexport export: model.onnx and samples.npz, checked in ONNX Runtime against PyTorch."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from bnnexport.converters.patterns import SIGN_ADD_SIGN, find_binary_layers
from support.cli import COMMAND, invoke, run_process
from support.fresh_run import fresh_run

from bnnexport.errors import FidelityError, NotBinaryError
from bnnexport.run.checkpoint import load_checkpoint, save_checkpoint
from bnnexport.stages.export import export_onnx


@pytest.mark.slow
def test_export_writes_onnx_with_sign_add_sign_and_strict_kernels(tmp_path):
    run = fresh_run(tmp_path / "run")
    report = export_onnx(run, samples=200)
    layers = find_binary_layers(onnx.load(run / "model.onnx"))
    assert report.binary_layers == len(layers) == 3
    assert all(layer.pattern == SIGN_ADD_SIGN and layer.strict for layer in layers)
    assert report.argmax_agreement == 1.0
    assert report.max_abs_diff <= report.tolerance
    assert json.loads((run / "export.json").read_text())["samples"] == 200


def test_export_writes_the_test_samples(tmp_path):
    run = fresh_run(tmp_path / "run")
    export_onnx(run, samples=50)
    with np.load(run / "samples.npz") as data:
        assert data["inputs"].shape == (50, 1, 28, 28) and data["inputs"].dtype == np.float32
        assert data["labels"].dtype == np.int64 and len(data["labels"]) == 50


def test_export_batch_and_opset_are_written_into_the_model(tmp_path):
    run = fresh_run(tmp_path / "run")
    export_onnx(run, opset=13, batch=4, samples=10)
    model = onnx.load(run / "model.onnx")
    assert model.opset_import[0].version == 13
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4


def test_export_refuses_a_kernel_that_is_not_binary(tmp_path):
    run = fresh_run(tmp_path / "run")
    checkpoint = load_checkpoint(run)
    name = next(k for k in checkpoint["model"] if k.startswith("features.2.weight"))
    checkpoint["model"][name][0, 0, 0, 0] = 0.5
    save_checkpoint(run / "checkpoint.pt", {k: v for k, v in checkpoint.items() if k not in
                                            ("format", "version")})  # fmt: skip
    with pytest.raises(NotBinaryError):
        export_onnx(run, samples=10)
    assert not (run / "model.onnx").exists()


def test_disagreement_exits_1_and_keeps_the_previous_onnx(tmp_path, monkeypatch):
    run = fresh_run(tmp_path / "run")
    export_onnx(run, samples=10)
    before = (run / "model.onnx").read_bytes()
    from bnnexport.converters.gate import OnnxProbe

    real = OnnxProbe.run

    def skewed(self, x, imposed=None):  # ONNX Runtime's logits tilted: predictions change
        logits, values = real(self, x, imposed)
        return logits + np.arange(len(logits), dtype=np.float32), values

    monkeypatch.setattr(OnnxProbe, "run", skewed)
    with pytest.raises(FidelityError):
        export_onnx(run, samples=10)
    result = invoke("export", str(run), "--samples", "10")
    assert result.exit_code == 1
    assert result.stderr.startswith("bnnexport: error: ONNX Runtime vs PyTorch disagree")
    assert "plain argmax agreement" in result.stderr
    assert f"diagnostics in {run / 'gate-refusal.json'}" in result.stderr
    assert json.loads((run / "gate-refusal.json").read_text())["refused_sample"] is not None
    assert (run / "model.onnx").read_bytes() == before


def test_export_cli_prints_one_json_object(tmp_path):
    run = fresh_run(tmp_path / "run")
    result = invoke("export", str(run), "--samples", "20", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["argmax_agreement"] == 1.0 and data["binary_layers"] == 3


def test_export_of_a_missing_run_exits_2_with_one_line(tmp_path):
    result = invoke("export", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_init_run_without_a_dataset_exports_on_random_grid_samples(tmp_path):
    import subprocess

    import numpy as np

    out = tmp_path / "init"
    assert (
        run_process(
            "init", "--model", "mnist-bnn", "--input-shape", "1,20,20", "--out", out
        ).returncode
        == 0
    )
    result = subprocess.run(
        [*COMMAND, "export", str(out), "--samples", "20"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-1500:]
    samples = np.load(out / "samples.npz")
    assert samples["inputs"].shape == (20, 1, 20, 20)
    assert (samples["labels"] == -1).all()  # no ground truth: accuracy is not claimed
    assert np.array_equal(samples["inputs"] * 64, np.round(samples["inputs"] * 64))
