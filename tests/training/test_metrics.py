"""Metrics rows say how many steps they cover, π_t stays a per-step rate whatever --log-every
is, train.json gives the last epoch's mean π, and the exports (CSV, TensorBoard) hold every row.
New train options are refused in one line, exit 2, leaving the run as it was."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch
from support.cli import run_in_process, run_process
from support.guarantees import snapshot
from support.image_folders import tiny_training, write_image_folder

from bnnexport.run.records import read_jsonl
from bnnexport.stages.train import train
from bnnexport.training.config import TrainConfig
from bnnexport.training.metrics import (
    NO_TENSORBOARD,
    TENSORBOARD_FILE,
    metrics_csv,
    pi,
    tensorboard_available,
)


def _train(out: Path, **kwargs):
    """One epoch of mnist-bnn on 12 images of 16x16 at batch 3: 4 steps, as many as the rows
    below need, each a fraction of a second (the rows' arithmetic, not the data, is tested;
    the training flip makes the restored random states of `eval_every` matter)."""
    data = out.parent / "data"
    if not data.exists():
        write_image_folder(data)
    config = TrainConfig(
        epochs=1, batch_size=3, out=str(out), dataset="imagefolder", data_dir=str(data),
        dataset_options={"image_size": 16}, **kwargs,
    )  # fmt: skip
    return train(config, progress=False)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("metrics") / "run"
    report = _train(out, log_every=3, eval_every=2, metrics_csv=True)
    return out, report


@pytest.mark.slow
def test_each_row_states_the_steps_it_covers_and_pi_is_per_step(logged_run):
    out, _ = logged_run
    sizes = {k[: -len(".weight")]: v.numel() for k, v in
             torch.load(out / "checkpoint.pt", weights_only=True)["model"].items()
             if k.endswith(".weight") and v.dim() > 1}  # fmt: skip
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    assert [(r["step"], r["steps"]) for r in rows] == [(3, 3), (4, 1)]  # the epoch's tail too
    for row in rows:
        for layer, flips in row["flips"].items():
            expected = math.log(flips / (sizes[layer] * row["steps"]) + math.exp(-9))
            assert row["flip_rate"][layer] == pytest.approx(expected)
        all_flips = sum(row["flips"].values())
        weights = sum(sizes[layer] for layer in row["flips"])
        assert row["mean_flip_rate"] == pytest.approx(pi(all_flips / (weights * row["steps"])))
    assert sum(sum(r["flips"].values()) for r in rows) > 0


@pytest.mark.slow
def test_train_json_reports_the_last_epochs_mean_flip_rate(logged_run):
    out, report = logged_run
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    steps = sum(r["steps"] for r in rows)
    for layer, rate in report.flip_rate.items():
        per_step = [math.exp(r["flip_rate"][layer]) - math.exp(-9) for r in rows]
        mean_fraction = sum(f * r["steps"] for f, r in zip(per_step, rows, strict=True)) / steps
        assert rate == pytest.approx(pi(mean_fraction), rel=1e-6)
    epoch = next(r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch")
    assert epoch["flip_rate"] == report.flip_rate
    assert epoch["mean_flip_rate"] == report.mean_flip_rate > -9


@pytest.mark.slow
def test_eval_every_records_test_accuracy_mid_epoch_without_changing_training(logged_run, tmp_path):
    out, report = logged_run
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[-1]["test_accuracy"] == report.test_accuracy  # step 4 ends the epoch
    plain = tmp_path / "plain"
    _train(plain, log_every=3)  # same run without evaluations: bit-identical weights
    a = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(plain / "checkpoint.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_metrics_csv_holds_every_row_with_one_column_per_layer_value(logged_run):
    out, _ = logged_run
    records = read_jsonl(out / "metrics.jsonl")
    rows = list(csv.DictReader(io.StringIO((out / "metrics.csv").read_text())))
    assert [r["kind"] for r in rows] == [r["kind"] for r in records]
    step = next(r for r in rows if r["kind"] == "step")
    first = next(r for r in records if r["kind"] == "step")
    assert float(step["flip_rate.features.2"]) == first["flip_rate"]["features.2"]
    assert (out / "metrics.csv").read_bytes() == metrics_csv(records)


def test_tensorboard_comes_with_the_default_install():
    assert tensorboard_available()  # a dependency in pyproject.toml, not an extra


@pytest.mark.slow
def test_a_run_without_tensorboard_says_so_in_one_line_and_in_its_notes(tmp_path, monkeypatch):
    import bnnexport.stages.train as train_module

    monkeypatch.setattr(train_module, "tensorboard_available", lambda: False)
    monkeypatch.setattr("bnnexport.training.metrics.tensorboard_available", lambda: False)
    out = tmp_path / "run"
    result = run_in_process("train", *tiny_training(tmp_path / "data"), "--epochs", "1",
                            "--out", out)  # fmt: skip
    notes = [line for line in result.stderr.splitlines() if "tensorboard" in line]
    assert result.returncode == 0 and notes == [f"bnnexport: note: {NO_TENSORBOARD}"]
    assert json.loads((out / "train.json").read_text())["notes"] == [NO_TENSORBOARD]
    assert not (out / TENSORBOARD_FILE).exists()


@pytest.mark.slow
def test_writing_tensorboard_scalars_adds_nothing_to_stderr(tmp_path):
    """torch's TensorBoard writer imports TensorFlow, whose native start-up lines (absl, oneDNN)
    went to stderr in a fresh process; a train's stderr is its own lines only."""
    out = tmp_path / "run"
    result = run_process("train", *tiny_training(tmp_path / "data"), "--epochs", "1",
                         "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-1500:]
    assert (out / TENSORBOARD_FILE).exists()
    assert [line for line in result.stderr.splitlines() if not line.startswith("epoch ")] == []


@pytest.mark.slow
def test_tensorboard_scalars_are_written(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = logged_run
    events = EventAccumulator(str(out))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"flip_rate/features.2", "flip_rate/all", "test/accuracy", "train/loss"} <= set(tags)
    assert [e.step for e in events.Scalars("flip_rate/all")] == [3, 4]


def test_tensorboard_shows_the_flips_and_top5(logged_run):
    """The flips themselves beside their rate, per layer and over all weights, and top-5."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = logged_run
    events = EventAccumulator(str(out))
    events.Reload()
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    assert [e.value for e in events.Scalars("flips/all")] == [
        sum(r["flips"].values()) for r in rows
    ]
    assert [e.value for e in events.Scalars("flips/features.2")] == [
        r["flips"]["features.2"] for r in rows
    ]
    assert {"train/top5_accuracy", "test/top5", "epoch/train_top5_accuracy"} <= set(
        events.Tags()["scalars"]
    )


@pytest.mark.slow
def test_every_row_holds_top5_beside_top1(logged_run):
    out, _ = logged_run
    test = ("test_accuracy", "test_top5_accuracy")
    pairs = {"step": [("accuracy", "top5_accuracy")], "eval": [test],
             "epoch": [("train_accuracy", "train_top5_accuracy"), test]}  # fmt: skip
    for row in read_jsonl(out / "metrics.jsonl"):
        for top1, top5 in pairs[row["kind"]]:
            assert 0.0 <= row[top1] <= row[top5] <= 1.0, row


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--log-every", "-1"], "--log-every"),
        (["--eval-every", "often"], "--eval-every"),
        (["--metrics-csv=yes"], "--metrics-csv"),
        (["--sigma", "2", "--optimizer", "bop2"], "--sigma"),
        (["--sigma", "0.1"], "--optimizer bop has none"),
    ],
)
def test_a_bad_metrics_or_sigma_option_is_one_line_and_leaves_the_run(trained_run, args, fragment):
    before = snapshot(trained_run)
    result = run_in_process("train", "--out", str(trained_run), "--force", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error: ") and fragment in lines[0]
    assert snapshot(trained_run) == before


@pytest.mark.slow
@pytest.mark.parametrize("bn_eval,tracked", [("moving", 4), ("recalibrate", 2)])
def test_bn_eval_moving_keeps_the_running_averages_training_kept(tmp_path, bn_eval, tracked):
    """--bn-eval moving evaluates and saves what training tracked over its 4 steps (as Keras
    evaluates); recalibrate replaces it by averages over 2 training batches."""
    import torch

    out = tmp_path / bn_eval
    config = TrainConfig(model_kwargs={"width": 8, "hidden": 16}, epochs=1, batch_size=16,
                         dataset="support.data_parallel:tiny_mnist", bn_eval=bn_eval,
                         bn_recalibration_batches=2, precision="float32", out=str(out))  # fmt: skip
    train(config, progress=False)
    state = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    counts = {int(v) for k, v in state.items() if k.endswith("num_batches_tracked")}
    assert counts == {tracked}
