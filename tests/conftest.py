"""Shared fixtures, registered once for every test folder.

`trained_run`: one short real training run on the shipped mnist5k subset; `seeded`: torch's
generator at seed 0; the loopback sshd (`support.sshd_fixture`) and the emulated aarch64 device
(`support.aarch64_device`). What tests share besides fixtures lives in `tests/support/`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# a script run on the emulated device, not a module: --doctest-modules must not import it
# support/toy_optimizer.py registers an optimizer on import: only ever in a process of its own
collect_ignore = ["support/lce_benchmark_model_standin.py", "support/toy_optimizer.py"]

pytest_plugins = ["support.sshd_fixture", "support.aarch64_device"]


@pytest.fixture
def seeded() -> None:
    """Random ±1 kernels and BatchNorm statistics, the same on every run."""
    import torch

    torch.manual_seed(0)


@pytest.fixture(scope="session")
def _trained_run_template(tmp_path_factory) -> Path:
    from bnnexport.stages.train import train
    from bnnexport.training.config import TrainConfig

    out = tmp_path_factory.mktemp("trained") / "run"
    train(TrainConfig(epochs=1, batch_size=100, out=str(out)), progress=False)
    return out


@pytest.fixture
def trained_run(_trained_run_template, tmp_path) -> Path:
    """A fresh copy of a 1-epoch Bop run of mnist-bnn on mnist5k (safe to modify)."""
    target = tmp_path / "run"
    shutil.copytree(_trained_run_template, target)
    return target
