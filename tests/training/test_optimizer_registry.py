"""Adding an optimizer touches its own module and one test: `support/toy_optimizer.py`
declares a toy optimizer with one hyperparameter (β) and registers it, nothing else in
bnnexport names it, and here it reaches `bnnexport train --help`, a sweep, config.json, the
optimizer the trainer builds, and `bnnexport compare`. Each command runs in a process of its
own, where the toy's module is imported before the command line is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.image_folders import tiny_training

from bnnexport.run.records import read_jsonl

TESTS = Path(__file__).resolve().parents[1]


def toy(*args: object) -> subprocess.CompletedProcess:
    """`bnnexport ARGS` with the toy optimizer registered."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "support.toy_optimizer", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})  # fmt: skip


@pytest.mark.slow  # a process of its own: about 3 s of imports
def test_train_help_offers_a_registered_optimizer_and_its_hyperparameter():
    result = toy("train", "--help")
    assert result.returncode == 0, result.stderr
    assert "|toy]" in result.stdout and "toy: flips where w·g > β" in result.stdout
    assert "--beta TEXT" in result.stdout and "threshold β >= 0 on w·g" in result.stdout


@pytest.mark.slow
def test_a_registered_optimizers_hyperparameter_reaches_config_trainer_and_compare(tmp_path):
    out = tmp_path / "sweep"
    result = toy("sweep", "--optimizer", "toy", "--gamma", "1e-3", "--threshold", "0",
                 "--beta", "0.25", "--epochs", "1", *tiny_training(tmp_path / "data"),
                 "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = out / "optimizer=toy"  # no γ or τ declared: the sweep runs it once
    config = json.loads((run / "config.json").read_text())
    assert (config["optimizer"], config["beta"]) == ("toy", 0.25)
    steps = [row for row in read_jsonl(run / "metrics.jsonl") if row["kind"] == "step"]
    assert steps and {row["bop.beta"] for row in steps} == {0.25}  # what the trainer built
    result = toy("compare", run, "--out", tmp_path / "compare", "--json")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["rows"][0]
    assert row["hyperparameters"] == {"beta": 0.25, "lr": 0.001}
    assert row["label"] == "mnist-bnn toy β=0.25"
