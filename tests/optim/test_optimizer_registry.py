"""Adding an optimizer touches its own module and one test: `support/toy_optimizer.py`
declares a toy optimizer with one hyperparameter (β) and registers it, nothing else in
bnnexport names it, and here it reaches `bnnexport train --help`, a sweep, config.json, the
optimizer the trainer builds, and `compare`. Each command runs in a process of its own, where
the toy's module is imported before the command line is built; `compare` runs here, with the
toy registered for its call only."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.image_folders import tiny_training

from bnnexport.optim.composite import OPTIMIZERS
from bnnexport.run.records import read_jsonl
from bnnexport.stages.compare import compare

TESTS = Path(__file__).resolve().parents[1]
MODULE = "support.toy_optimizer"


@contextlib.contextmanager
def toy_registered() -> Iterator[None]:
    """The toy registered in this process (its module imported afresh), and unregistered."""
    before = dict(OPTIMIZERS)
    sys.modules.pop(MODULE, None)
    try:
        importlib.import_module(MODULE)
        yield
    finally:
        sys.modules.pop(MODULE, None)
        OPTIMIZERS.clear()
        OPTIMIZERS.update(before)


def toy(*args: object) -> subprocess.CompletedProcess:
    """`bnnexport ARGS` with the toy optimizer registered."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", MODULE, *map(str, args)],
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
    with toy_registered():  # compare reads the registry when it runs: here, in this process
        row = compare([run], tmp_path / "compare").rows[0]
    assert row.hyperparameters == {"beta": 0.25, "lr": 0.001}
    assert row.label == "mnist-bnn toy β=0.25"


def test_a_taken_name_or_a_hyperparameter_declared_otherwise_is_refused():
    from dataclasses import replace

    from bnnexport.optim.composite import SIGMA_OPTION, OptimizerEntry, register_optimizer

    bop = OPTIMIZERS["bop"]
    with pytest.raises(ValueError, match="'bop' is registered already"):
        register_optimizer(bop)
    other_sigma = replace(SIGMA_OPTION, default=0.5)  # config.json has one "sigma"
    entry = OptimizerEntry("bop3", bop.factory, (other_sigma,), (), "another σ")
    with pytest.raises(ValueError, match="'sigma' is declared otherwise"):
        register_optimizer(entry)
    assert "bop3" not in OPTIMIZERS
