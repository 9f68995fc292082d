"""bnnexport sweep: one run per (γ, τ), one figure, a table of final accuracies and the flip-rate
ordering the paper predicts (higher γ, lower τ -> more flips)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import invoke

from bnnexport.stages.compare import compare
from bnnexport.stages.sweep import SweepSetting, flip_ordering


def _setting(gamma, threshold, rate):
    return SweepSetting(gamma, threshold, "", 0.9, 0.9, rate, rate, 1.0)


def test_ordering_compares_only_settings_that_differ_in_one_hyperparameter():
    settings = [_setting(1e-2, 0.0, -3.0), _setting(1e-3, 0.0, -5.0), _setting(1e-3, 1e-6, -6.0)]
    ordering = flip_ordering(settings)
    assert ordering["agrees"] and len(ordering["comparisons"]) == 2
    kinds = sorted(c["because"] for c in ordering["comparisons"])
    assert kinds == ["higher gamma", "lower threshold"]


def test_ordering_reports_a_disagreement():
    assert not flip_ordering([_setting(1e-2, 0.0, -7.0), _setting(1e-3, 0.0, -5.0)])["agrees"]


@pytest.mark.slow
def test_sweep_on_mnist5k_writes_runs_figure_and_table(tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--gamma", "1e-2,1e-4", "--threshold", "1e-6,0", "--epochs", "1",
            "--batch-size", "200", "--out", str(out), "--json"]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report == json.loads((out / "sweep.json").read_text())
    assert (out / "sweep.png").stat().st_size > 10_000
    assert len(report["settings"]) == 4
    for setting in report["settings"]:
        assert (out / f"gamma={setting['gamma']:g},threshold={setting['threshold']:g}"
                / "checkpoint.pt").is_file()  # fmt: skip
        assert 0.0 <= setting["test_accuracy"] <= 1.0
    assert len(report["ordering"]["comparisons"]) == 4
    rates = {(s["gamma"], s["threshold"]): s["flip_rate"] for s in report["settings"]}
    # the paper's claim on γ holds by a wide margin even after one epoch
    assert rates[(1e-2, 0.0)] > rates[(1e-4, 0.0)]
    # compare of two of its runs: the sweep's colours, and one π (last epoch) and one
    # `seconds` in sweep.json, compare.json and train.json
    picked = report["settings"][2:0:-1]
    rows = compare([s["run_dir"] for s in picked], tmp_path / "cmp").rows
    assert [r.color for r in rows] == [s["color"] for s in picked]
    # sweep.png's first column colours a curve by its γ (its line style is τ's)
    colors = {(s["gamma"], s["threshold"]): s["color"] for s in report["settings"]}
    assert colors[(1e-2, 0.0)] == colors[(1e-2, 1e-6)] != colors[(1e-4, 0.0)]
    layers = {"features.2", "features.5", "classifier.1"}
    assert all(set(s["layer_flip_rate"]) == layers for s in report["settings"])
    for row, setting in zip(rows, picked, strict=True):
        trained = json.loads((Path(setting["run_dir"]) / "train.json").read_text())
        assert (
            row.last_flip_rate
            == setting["last_epoch_flip_rate"]
            == pytest.approx(trained["mean_flip_rate"])
        )
        assert row.seconds == setting["seconds"] == pytest.approx(trained["seconds"])
