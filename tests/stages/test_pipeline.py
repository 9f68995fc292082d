"""bnnexport pipeline: every stage runs, in order, on one run directory, ending with bench."""

from __future__ import annotations

import json
import shutil

import pytest
from support.cli import invoke


def _pipeline(run, *args):
    # --resume on the shared 1-epoch run: its epochs are done, so train only reloads it
    return invoke(
        "pipeline", "--out", run, "--resume", "--runs", "3", "--warmup", "1", "--samples", "100",
        *args,
    )  # fmt: skip


@pytest.mark.slow
def test_pipeline_runs_every_stage_and_ends_with_the_bench_table(_trained_run_template, tmp_path):
    from bnnexport.stages.pipeline import STAGES

    run = tmp_path / "run"
    shutil.copytree(_trained_run_template, run)
    result = _pipeline(run)
    assert result.exit_code == 0, result.output
    started = [line.split()[1] for line in result.stderr.splitlines() if line.startswith("[")]
    assert started == list(STAGES)
    assert result.stdout.rstrip().splitlines()[-1] == f"report: {run / 'report.md'}"
    for name in (
        "model.onnx",
        "model-arm64.tflite",
        "model-float.tflite",
        "bench.json",
        "report.md",
        "samples.npz",
    ):
        assert (run / name).is_file(), name
    saved = json.loads((run / "bench.json").read_text())
    assert [b["name"] for b in saved["backends"]] == [
        "pytorch",
        "onnxruntime",
        "tflite-float",
        "lce",
    ]
    assert saved["samples"] == 100


@pytest.mark.slow
def test_pipeline_json_holds_every_stage(_trained_run_template, tmp_path):
    from bnnexport.stages.pipeline import STAGES

    run = tmp_path / "run"
    shutil.copytree(_trained_run_template, run)
    result = _pipeline(run, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data["stages"]) == list(STAGES)
    assert data["bench"]["backends"][-1]["argmax_agreement"] == 1.0


def test_pipeline_stops_at_the_first_failing_stage(tmp_path):
    result = _pipeline(tmp_path / "nothing-here")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1].startswith("bnnexport: error: nothing to resume")


def test_an_unknown_device_fails_before_training_and_writes_nothing(tmp_path, monkeypatch):
    import bnnexport.stages.pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("training started before the device was reached")

    monkeypatch.setattr(bnnexport.stages.pipeline, "train", refuse)
    run = tmp_path / "run"
    result = invoke("pipeline", "--out", run, "--device", "pi@no-such-host")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-host" in lines[0], result.stderr
    assert not run.exists()


def test_a_misspelt_device_fails_before_training_and_writes_nothing(tmp_path, monkeypatch):
    import bnnexport.stages.pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("training started before the device was read")

    monkeypatch.setattr(bnnexport.stages.pipeline, "train", refuse)
    run = tmp_path / "run"
    result = invoke("pipeline", "--out", run, "--device", "adb:R58M12", "--port", "22")
    assert result.exit_code == 2, result.output
    assert result.stderr == "bnnexport: error: --port does not apply to adb:SERIAL (adb:R58M12)\n"
    assert not run.exists()
