"""A float32 sign tie in a model of your own is replayed, never refused as a disagreement.

A papers-style BNN (tests/support/own_models.py `latent_detach_bnn`: the detach trick on its
latent kernels and on Bi-Real's approx-sign, float shortcuts; nothing from bnnexport) trained on
mnist5k gets one real tie planted (tests/support/ties.py): one stem activation that PyTorch and
ONNX Runtime round to opposite sides of zero, LCE siding with ONNX Runtime. `export` must
replay it (PyTorch vs ONNX Runtime) and `convert` too (LCE vs PyTorch), through the model's
traced binarizations (`bnnexport.nn.sign_trace`); with the replay broken (the traced probe
imposing nothing) each refuses, naming the sample and the binarization.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_in_process
from support.guarantees import assert_one_line_error
from support.ties import PlantedTie, TieSite, plant_in_run

pytestmark = pytest.mark.slow

TRAIN = ["--epochs", "1", "--batch-size", "500", "--init-sign"]
SAMPLES = ["--samples", "100"]


def cli_json(*args) -> dict:
    result = run_in_process(*map(str, args), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def lce_side(run: Path):
    """LCE's value of the first binarization input, by (sample, flat position), on the run's
    check samples: its witness flatbuffer (the translation that also outputs every
    binarization's input), converted once."""
    from bnnexport.converters.gate.checks import WitnessModels
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize

    model = normalize(load_onnx(run / "model.onnx"))[0]
    witness = WitnessModels(model, float_model=False).witness("LCE")
    with np.load(run / "samples.npz") as samples:
        inputs = samples["inputs"]
    cache: dict[int, np.ndarray] = {}

    def side(sample: int, position: int) -> float:
        if sample not in cache:
            cache[sample] = next(iter(witness.run(inputs[sample])[1].values())).reshape(-1)
        return float(cache[sample][position])

    return side


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, PlantedTie, dict, dict]:
    """(run, the tie, export's report, convert's report) of the trained model with its tie."""
    run = tmp_path_factory.mktemp("ties") / "run"
    cli_json("train", "--model", "support.own_models:latent_detach_bnn", *TRAIN, "--out", run)
    cli_json("export", run, *SAMPLES)
    tie = plant_in_run(run, TieSite("stem.1.bias"), lce_side(run))
    exported = cli_json("export", run, *SAMPLES)
    converted = cli_json("convert", run, "--target", "arm64")
    return run, tie, exported, converted


def copy_of(run: Path, name: str) -> Path:
    copy = run.parent / name
    shutil.copytree(run, copy)
    return copy


def without_imposing(monkeypatch) -> None:
    """Break the own-model replay: the traced probe reads signs but imposes none."""
    from bnnexport.nn import sign_trace

    real = sign_trace.SignReplay.__init__

    def reads_only(self, traced, imposed):
        real(self, traced, None)

    monkeypatch.setattr(sign_trace.SignReplay, "__init__", reads_only)


def test_export_replays_the_tie_it_meets(planted):
    _run, tie, exported, _converted = planted
    assert tie.sample in exported["tie_samples"]
    assert exported["tie_positions"] >= 1 and exported["resolved_argmax_agreement"] == 1.0


def test_convert_replays_the_tie_between_lce_and_pytorch(planted):
    _run, tie, _exported, converted = planted
    assert tie.sample in converted["torch_tie_samples"]
    assert converted["torch_argmax_agreement"] == 1.0 and converted["lce_bconv2d"] == 2


def test_without_the_replay_export_refuses_the_tie_naming_sample_and_binarization(
    planted, monkeypatch
):
    run = copy_of(planted[0], "export-broken")
    tie = planted[1]
    without_imposing(monkeypatch)
    result = run_in_process("export", run, *SAMPLES)
    assert_one_line_error(result, 1, "PyTorch", f"disagree on sample {tie.sample}")
    refusal = json.loads((run / "gate-refusal.json").read_text())
    assert refusal["refused_sample"] == tie.sample
    assert refusal["first_differing_binarization"] == tie.source


def test_without_the_replay_convert_refuses_the_tie_naming_sample_and_binarization(
    planted, monkeypatch
):
    run = copy_of(planted[0], "convert-broken")
    tie = planted[1]
    without_imposing(monkeypatch)
    result = run_in_process("convert", run, "--target", "arm64")
    assert_one_line_error(result, 1, "LCE vs PyTorch", f"disagree on sample {tie.sample}")
    refusal = json.loads((run / "gate-refusal.json").read_text())
    assert refusal["refused_sample"] == tie.sample
    assert refusal["first_differing_binarization"] == tie.source
    assert not (run / "model-arm64.tflite").exists() or (
        (run / "model-arm64.tflite").read_bytes()
        == (planted[0] / "model-arm64.tflite").read_bytes()
    )


def test_where_pytorch_cannot_be_traced_convert_proves_the_chain_through_onnx_runtime(
    planted, monkeypatch
):
    """The same model with its trace made to fail: PyTorch is checked against ONNX Runtime
    (predictions only: the tie moves no prediction) and ONNX Runtime against LCE with its own
    replay, and the report says so."""
    run = copy_of(planted[0], "untraced")

    def untraceable(*_args, **_kwargs):
        raise RuntimeError("an op the trace cannot see")

    monkeypatch.setattr("bnnexport.stages.torch_probe.trace_binarizations", untraceable)
    report = cli_json("convert", run, "--target", "arm64")
    torch_check = next(c for c in report["checks"] if c["reference"] == "PyTorch")
    assert torch_check["through"].startswith("ONNX Runtime (tracing its forward pass failed")
    assert torch_check["argmax_agreement"] == 1.0 and report["lce_bconv2d"] == 2


def test_through_onnx_runtime_two_predictions_pytorch_and_onnx_runtime_part_on_are_refused(
    planted, monkeypatch
):
    from bnnexport.stages import export

    run = copy_of(planted[0], "untraced-apart")
    real = export.torch_outputs

    def two_moved(model, inputs, *args):
        out = real(model, inputs, *args).copy()
        for row in (0, 1):
            out[row, int(out[row].argmax())] = out[row].min() - 1.0  # another class wins
        return out

    def untraceable(*_args, **_kwargs):
        raise RuntimeError("an op the trace cannot see")

    monkeypatch.setattr("bnnexport.stages.torch_probe.trace_binarizations", untraceable)
    monkeypatch.setattr(export, "torch_outputs", two_moved)
    result = run_in_process("convert", run, "--target", "arm64")
    assert_one_line_error(result, 1, "2 predictions differ", "cannot be replayed: tracing")
