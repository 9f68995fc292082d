"""Shared fixtures. `trained_run`: one short real training run on the shipped mnist5k subset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# a script run on the emulated device, not a module: --doctest-modules must not import it
collect_ignore = ["lce_benchmark_model_standin.py"]


@pytest.fixture(scope="session")
def _trained_run_template(tmp_path_factory) -> Path:
    from bnnexport.train import TrainConfig, train

    out = tmp_path_factory.mktemp("trained") / "run"
    train(TrainConfig(epochs=1, batch_size=100, out=str(out)), progress=False)
    return out


@pytest.fixture
def trained_run(_trained_run_template, tmp_path) -> Path:
    """A fresh copy of a 1-epoch Bop run of mnist-bnn on mnist5k (safe to modify)."""
    target = tmp_path / "run"
    shutil.copytree(_trained_run_template, target)
    return target
