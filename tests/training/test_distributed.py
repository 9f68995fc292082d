"""Data-parallel training: 2 gloo processes on CPU over loopback, via torchrun and in a test's
own processes; N processes at batch B/N train as one process at batch B."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.data_parallel import train_processes
from support.sshd_fixture import free_port

from bnnexport.nn.layers import binary_parameters
from bnnexport.run.checkpoint import load_model
from bnnexport.run.records import read_jsonl
from bnnexport.training.config import TrainConfig
from bnnexport.training.distributed import (
    AllReduceBatchNorm,
    GlobalBatches,
    _sum_over_batch,
    global_batchnorm,
)
from bnnexport.training.train import train


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


def tiny_config(out, batch_size: int, **changes) -> TrainConfig:
    """mnist-bnn narrowed to 9,152 binary weights, on 57 images: 4 steps at global batch 16."""
    return TrainConfig(
        model_kwargs={"width": 8, "hidden": 16}, dataset="support.data_parallel:tiny_mnist",
        epochs=1, batch_size=batch_size, log_every=1, bn_recalibration_batches=2,
        precision="float32", out=str(out), **changes,
    )  # fmt: skip


def step_flips(run) -> list[dict[str, int]]:
    return [r["flips"] for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "step"]


@pytest.mark.slow
def test_two_gloo_processes_train_as_one_process_at_the_global_batch(tmp_path):
    """The same global batches (one shared 5 / 4 at the end) and BatchNorm over the global
    batch: every step flips the same weights and the binary weights end identical. What
    differs is float32 sums taken in another order (weight gradients, DDP's average): the
    real-valued parameters within 1e-5, BatchNorm's running statistics within 1e-3 relative (a
    pre-activation within rounding of zero, binarized the other way during recalibration,
    moves a channel's mean by 2 / its values)."""
    one, two = tmp_path / "one", tmp_path / "two"
    torch.set_num_threads(1)
    train(tiny_config(one, batch_size=16), progress=False)
    train_processes(tiny_config(two, batch_size=8), processes=2)
    flips = step_flips(one)
    assert len(flips) == 4 and all(sum(f.values()) for f in flips)  # 4 steps, each flipping
    assert step_flips(two) == flips
    a, b = (torch.load(r / "checkpoint.pt", weights_only=True)["model"] for r in (one, two))
    kernels = {
        k["name"]
        for k in json.loads((one / "config.json").read_text())["binary_kernels"]["kernels"]
    }  # noqa: E501
    assert all(torch.equal(a[name], b[name]) for name in kernels)
    for name in set(a) - kernels:
        tolerance = 1e-3 if "running" in name else 1e-5
        assert torch.allclose(a[name].double(), b[name].double(), tolerance, 1e-5), name


@pytest.mark.parametrize("size", [40, 57, 61])
@pytest.mark.parametrize("processes", [2, 3])
def test_n_processes_share_exactly_the_batches_of_one_process_at_n_times_the_batch(size, processes):
    one = list(GlobalBatches(size, 4 * processes, seed=3, epoch=1))
    shares = [list(GlobalBatches(size, 4, 3, 1, r, processes)) for r in range(processes)]
    assert [sum(parts, []) for parts in zip(*shares, strict=True)] == one


def test_a_short_last_batch_is_shared_as_evenly_as_possible_and_weighed_by_share():
    batches = [GlobalBatches(57, 8, 0, 0, r, 2) for r in (0, 1)]
    assert [len(list(b)[-1]) for b in batches] == [5, 4]  # 57 = 3 x 16 + 9
    assert [b.shares(3) for b in batches] == [10 / 9, 8 / 9]  # the two average to 1
    assert [b.shares(0) for b in batches] == [1.0, 1.0]


def test_a_last_batch_too_small_for_batchnorm_is_dropped():
    assert len(GlobalBatches(49, 16, 0, 0)) == 3  # 16, 16, 16: the last sample is left out
    assert len(GlobalBatches(51, 8, 0, 0, 0, 2, smallest_last=2)) == 4  # 3 over the world
    assert len(GlobalBatches(51, 8, 0, 0, 0, 2, smallest_last=4)) == 3  # 2 + 1 per process


def test_batchnorm_statistics_round_alike_however_the_batch_is_split():
    """The mean of 50 samples from one sum, and from two processes' sums of 25 added."""
    x = torch.randn(50, 32, 28, 28).to(memory_format=torch.channels_last) * 3 + 1
    whole = (_sum_over_batch(x) / x[:, 0].numel()).float()
    halves = ((_sum_over_batch(x[:25]) + _sum_over_batch(x[25:])) / x[:, 0].numel()).float()
    assert torch.equal(whole, halves)


@pytest.mark.parametrize("norm", [torch.nn.BatchNorm2d(4), torch.nn.BatchNorm1d(6, momentum=None)])
def test_all_reduce_batchnorm_in_one_process_is_torchs_batchnorm_to_rounding(norm):
    import copy

    torch.manual_seed(0)
    if norm.weight is not None:
        torch.nn.init.uniform_(norm.weight, 0.5, 2.0)
        torch.nn.init.uniform_(norm.bias, -1.0, 1.0)
    ours = global_batchnorm(copy.deepcopy(norm))
    assert isinstance(ours, (AllReduceBatchNorm, type(norm)))
    shape = (8, 4, 5, 5) if isinstance(norm, torch.nn.BatchNorm2d) else (8, 6)
    x, grad = (torch.randn(*shape) * 3 + 2).requires_grad_(), torch.randn(*shape)
    results = []
    for module in (norm, ours):
        output = module(x)
        inputs = [x, *module.parameters()]
        results.append([output, *torch.autograd.grad(output, inputs, grad),
                        module.running_mean, module.running_var])  # fmt: skip
    for theirs, mine in zip(*results, strict=True):
        assert torch.allclose(theirs, mine, rtol=1e-5, atol=1e-5)
