"""bnnexport compare: runs side by side in one figure and one table; repetitions of a setting
(seeds) become mean ± std. sweep: several optimizers (the latent baseline included), seeds,
schedules for --lr; new options refused in one line before anything is written."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_in_process

from bnnexport.run.files import write_bytes_atomic
from bnnexport.stages.compare import PALETTE, STD_NOTE, compare, mean_std, setting_id
from bnnexport.stages.sweep import plan_runs
from bnnexport.training.config import TrainConfig


def fake_run(path: Path, optimizer="bop", gamma=1e-3, seed=0, accuracy=0.9, flips=10) -> Path:
    """A run directory as train leaves it (config.json, metrics.jsonl), without training."""
    config = {**TrainConfig(optimizer=optimizer, gamma=gamma, seed=seed).to_json(),
              "out": str(path), "epochs": 2}  # fmt: skip
    rows = []
    for step in (5, 10, 15, 20):
        rows.append({"kind": "step", "step": step, "epoch": 1 + (step > 10), "steps": 5,
                     "flips": {"a": flips}, "flip_rate": {"a": -4.0 - seed},
                     "mean_flip_rate": -4.0 - seed})  # fmt: skip
        if step % 10 == 0:
            rows.append({"kind": "epoch", "step": step, "epoch": step // 10, "seconds": 1.5,
                         "train_loss": 0.1, "train_accuracy": 0.9,
                         "test_accuracy": accuracy - 0.1 * (step == 10)})  # fmt: skip
    write_bytes_atomic(path / "config.json", json.dumps(config).encode())
    write_bytes_atomic(path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return path


def test_seeds_of_one_setting_are_one_row_with_mean_and_std(tmp_path):
    runs = [
        fake_run(tmp_path / "s0", seed=0, accuracy=0.90, flips=10),
        fake_run(tmp_path / "s1", seed=1, accuracy=0.94, flips=30),
        fake_run(tmp_path / "latent", optimizer="adam-latent", accuracy=0.8, flips=4),
    ]
    report = compare(runs, tmp_path / "cmp")
    bop, latent = report.rows
    assert (bop.optimizer, bop.seeds, latent.optimizer) == ("bop", [0, 1], "adam-latent")
    # sample standard deviations (n - 1) over the two seeds
    assert (bop.test_accuracy, bop.test_accuracy_std) == pytest.approx((0.92, 0.02 * 2**0.5))
    assert (bop.flips, bop.flips_std) == pytest.approx((80.0, 40.0 * 2**0.5))  # 4 x 10, 4 x 30
    assert bop.seconds == 3.0 and bop.last_flip_rate_std == pytest.approx(0.5 * 2**0.5)
    assert bop.hyperparameters == {"gamma": 1e-3, "threshold": 1e-6, "lr": 1e-3}
    assert latent.hyperparameters == {"lr": 1e-3}
    assert latent.label == "mnist-bnn adam-latent lr=0.001"  # the model and the optimizer
    table = list(csv.DictReader(io.StringIO((tmp_path / "cmp" / "compare.csv").read_text())))
    assert [(r["optimizer"], r["runs"], r["gamma"]) for r in table] == [
        ("bop", "2", "0.001"), ("adam-latent", "1", ""),
    ]  # fmt: skip
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"][0]["seeds"] == [0, 1]
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000


def test_mean_std_is_the_sample_spread():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2**0.5)) and mean_std([0.5]) == (0.5, 0.0)
    values = [0.9, 0.91, 0.95]
    assert mean_std(values)[1] == pytest.approx(np.std(values, ddof=1))


def test_the_figure_says_its_error_bars_are_the_sample_std(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    said = []
    monkeypatch.setattr(Figure, "text", lambda self, x, y, text, **kw: said.append(text))
    runs = [fake_run(tmp_path / f"s{seed}", seed=seed) for seed in (0, 1, 2)]
    compare(runs, tmp_path / "cmp")
    assert said == [STD_NOTE] and "sample standard deviation (n - 1)" in STD_NOTE


def test_error_bars_from_fewer_than_three_seeds_come_with_a_warning(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    said = []
    monkeypatch.setattr(Figure, "text", lambda self, x, y, text, **kw: said.append(text))
    report = compare(
        [fake_run(tmp_path / f"s{seed}", seed=seed) for seed in (0, 1)], tmp_path / "c"
    )
    assert report.notes == ["error bars from 2 seeds: fewer than 3 give a spread that says little "
                            "(run more with --seeds)"]  # fmt: skip
    assert said == [f"{STD_NOTE}; {report.notes[0]}"]


def test_a_setting_keeps_the_colour_its_sweep_gave_it(tmp_path):
    """compare of some of a sweep's runs, in another order, draws each as the sweep did."""
    sweep = tmp_path / "sweep"
    runs = [fake_run(sweep / f"gamma={g:g}", gamma=g) for g in (1e-2, 1e-3, 1e-4)]
    colors = ["#d62728", "#9467bd", "#8c564b"]  # what the sweep recorded
    settings = [{"setting": setting_id(json.loads((r / "config.json").read_text())),
                 "color": c} for r, c in zip(runs, colors, strict=True)]  # fmt: skip
    write_bytes_atomic(sweep / "sweep.json", json.dumps({"settings": settings}).encode())
    report = compare([runs[2], runs[0], fake_run(tmp_path / "other", gamma=0.5)], tmp_path / "c")
    assert [row.color for row in report.rows] == [colors[2], colors[0], PALETTE[0]]


def test_two_models_with_one_optimizer_setting_are_told_apart_in_the_legend(tmp_path):
    runs = [fake_run(tmp_path / "a"), fake_run(tmp_path / "b")]
    config = json.loads((runs[1] / "config.json").read_text())
    config["model"] = "mynets:small_bnn"
    write_bytes_atomic(runs[1] / "config.json", json.dumps(config).encode())
    labels = [row.label for row in compare(runs, tmp_path / "cmp").rows]
    assert labels == ["mnist-bnn bop γ=0.001 τ=1e-06", "small_bnn bop γ=0.001 τ=1e-06"]


def test_labels_and_the_table_show_every_other_setting_the_runs_differ_in(tmp_path):
    """A QAT run and a float run at another batch and precision: both were labelled 'mnist-bnn
    bop γ=0.001 τ=1e-06'."""
    qat, plain = fake_run(tmp_path / "qat"), fake_run(tmp_path / "float")
    config = json.loads((qat / "config.json").read_text())
    config.update(float_layers="int8", batch_size=100, precision="bf16")
    write_bytes_atomic(qat / "config.json", json.dumps(config).encode())
    report = compare([qat, plain], tmp_path / "cmp")
    assert [row.label for row in report.rows] == [
        "mnist-bnn bop γ=0.001 τ=1e-06 batch_size=100 float_layers=int8 precision=bf16",
        "mnist-bnn bop γ=0.001 τ=1e-06 batch_size=50 float_layers=float32 precision=auto",
    ]
    table = list(csv.DictReader(io.StringIO((tmp_path / "cmp" / "compare.csv").read_text())))
    assert [(r["float_layers"], r["batch_size"], r["precision"]) for r in table] == [
        ("int8", "100", "bf16"), ("float32", "50", "auto"),
    ]  # fmt: skip


def test_pi_over_the_last_epoch_per_layer_is_in_the_rows_and_the_table(tmp_path):
    runs = [fake_run(tmp_path / f"s{seed}", seed=seed) for seed in (0, 1)]
    (row,) = compare(runs, tmp_path / "cmp").rows
    assert row.layer_flip_rate == {"a": -4.5} and row.layer_flip_rate_std == {
        "a": pytest.approx(0.5**0.5)
    }  # seeds 0 and 1: π -4 and -5
    (line,) = csv.DictReader(io.StringIO((tmp_path / "cmp" / "compare.csv").read_text()))
    assert float(line["last_flip_rate.a"]) == -4.5


def test_runs_from_before_a_setting_existed_are_the_setting_of_its_old_value():
    old = {"model": "mnist-bnn", "gamma": 1e-3}
    assert setting_id(old) == setting_id({**old, "bn_eval": "recalibrate", "world_size": 2})
    assert setting_id(old) != setting_id({**old, "bn_eval": "moving"})


def test_compare_cli_prints_the_table_and_refuses_a_non_run_in_one_line(tmp_path):
    run = fake_run(tmp_path / "a")
    result = run_in_process("compare", str(run), "--out", str(tmp_path / "cmp"))
    assert result.returncode == 0, result.stderr
    assert "mnist-bnn bop γ=0.001 τ=1e-06" in result.stdout and "0.9000" in result.stdout
    (tmp_path / "empty").mkdir()
    result = run_in_process("compare", str(run), str(tmp_path / "empty"), "--out",
                            str(tmp_path / "cmp2"))  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "is not a training run" in lines[0]
    assert not (tmp_path / "cmp2").exists()


def test_sweep_plans_one_folder_per_optimizer_setting_and_seed(tmp_path):
    base = TrainConfig(seed=7, lr="linear:1e-2,1e-4,100")
    plan = plan_runs(base, [1e-2, 1e-4], [0.0], tmp_path, ["bop", "adam-latent"], 2)
    assert list(plan) == [("bop", 1e-2, 0.0), ("bop", 1e-4, 0.0), ("adam-latent", None, None)]
    outs = [Path(c.out).relative_to(tmp_path).as_posix() for cs in plan.values() for c in cs]
    assert outs[:2] == ["optimizer=bop,gamma=0.01,threshold=0/seed=7",
                        "optimizer=bop,gamma=0.01,threshold=0/seed=8"]  # fmt: skip
    assert outs[-1] == "optimizer=adam-latent/seed=8"
    latent = plan[("adam-latent", None, None)][0]
    assert latent.optimizer == "adam-latent" and latent.lr == "linear:1e-2,1e-4,100"
    one = plan_runs(base, [1e-3], [1e-6], tmp_path, ["bop"], 1)
    assert [c.out for c in one[("bop", 1e-3, 1e-6)]] == [
        str(tmp_path / "gamma=0.001,threshold=1e-06")
    ]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--optimizer", "bop,nope"], "--optimizer"),
        (["--optimizer", "bop,bop"], "--optimizer"),
        (["--seeds", "0"], "--seeds"),
        (["--lr", "cosine:1"], "cosine:1"),
        (["--eval-every", "-1"], "--eval-every"),
        (["--log-every", "x"], "--log-every"),
    ],
)
def test_a_bad_sweep_option_is_one_line_and_writes_nothing(tmp_path, args, fragment):
    out = tmp_path / "sweep"
    result = run_in_process(
        "sweep", "--gamma", "1e-3", "--threshold", "0", "--out", str(out), *args
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("bnnexport: error: ") and fragment in lines[0]
    assert not out.exists()


def _drawn(monkeypatch, module) -> list:
    """The figures `module` saves, kept for inspection."""
    figures: list = []
    monkeypatch.setattr(
        module, "save_figure_atomic", lambda fig, path, dpi=100: figures.append(fig)
    )
    return figures


def test_sweep_png_has_a_column_per_varied_hyperparameter_its_value_the_colour(
    tmp_path, monkeypatch
):
    """10 settings (5 γ x 2 τ) and the baseline: a γ column and a τ column, a curve coloured by
    the column's hyperparameter and styled by the other, legends below the data."""
    from bnnexport.stages import plots
    from bnnexport.stages.compare import read_run

    figures = _drawn(monkeypatch, plots)
    gammas, keys, groups = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5), [], []
    for gamma in gammas:
        for threshold in (1e-6, 0.0):
            run = fake_run(tmp_path / f"{gamma:g}-{threshold:g}", gamma=gamma)
            config = json.loads((run / "config.json").read_text())
            write_bytes_atomic(
                run / "config.json", json.dumps({**config, "threshold": threshold}).encode()
            )
            groups.append([read_run(run)])
            keys.append(("bop", gamma, threshold))
    groups.append([read_run(fake_run(tmp_path / "latent", optimizer="adam-latent"))])
    keys.append(("adam-latent", None, None))
    colors = plots.plot_sweep(groups, keys, tmp_path / "sweep.png")
    (figure,) = figures
    accuracy = [ax for ax in figure.axes if ax.get_ylabel().startswith("test accuracy")]
    assert [ax.get_title().split(" varies")[0] for ax in accuracy] == ["γ", "τ"]
    lines = accuracy[0].get_lines()
    styles = {(line.get_color(), line.get_linestyle()) for line in lines}
    assert len(styles) == 11  # every curve told apart
    assert len({colors[id(g[0])] for g in groups[:-1]}) == 5  # the first column: one per γ
    for ax in figure.axes:
        if ax.get_legend() is not None:  # below its panel, outside the data
            box = ax.get_legend().get_window_extent()
            assert box.y1 < ax.get_window_extent().y0


def test_accuracy_png_marks_whole_epochs(tmp_path, monkeypatch):
    from bnnexport.stages import plots

    figures = _drawn(monkeypatch, plots)
    run = fake_run(tmp_path / "run")
    plots.plot_training(run)
    ticks = figures[0].axes[0].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks)
