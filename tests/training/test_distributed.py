"""Data-parallel training: 2 gloo processes on CPU over loopback, via torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.sshd_fixture import free_port

from bnnexport.nn.layers import binary_parameters
from bnnexport.run.checkpoint import load_model


@pytest.mark.slow
def test_two_process_gloo_run_matches_across_ranks_and_writes_one_run_directory(
    trained_run, tmp_path
):
    out = tmp_path / "ddp"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "bnnexport",
            "train",
            "--epochs",
            "1",
            "--batch-size",
            "50",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1  # only rank 0 prints
    said = [line for line in result.stderr.splitlines() if line.startswith("epoch 1/1: loss")]
    assert len(said) == 1, result.stderr[-2000:]  # and only rank 0 says how the epoch went
    report = reports[0]
    assert report["world_size"] == 2
    assert report["rank_mismatched_weights"] == 0  # every rank flipped the same weights
    for p in binary_parameters(load_model(out)):
        assert bool(((p == 1) | (p == -1)).all())
    single = json.loads((trained_run / "train.json").read_text())  # 1 process, batch 100
    assert abs(report["test_accuracy"] - single["test_accuracy"]) < 0.1
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
