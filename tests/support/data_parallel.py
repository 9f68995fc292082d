"""Data-parallel training in a test: N gloo processes on loopback, each calling `train`.

`train_processes(config, processes)` starts the processes (spawned, so no thread pool of the test
process is copied into them) with the environment torchrun would give them and waits for them;
`tiny_mnist` is a data set loader (`--dataset support.data_parallel:tiny_mnist`) of 57 training
images, so that 2 processes at batch 8 end on a short global batch shared 5 / 4.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os

from torch.utils.data import Subset

from support.sshd_fixture import free_port

TINY_TRAIN = 57


def tiny_mnist(data_dir=None, augment=True):
    """The first TINY_TRAIN training images of mnist5k and its first 100 test images."""
    from bnnexport.datasets import load_mnist5k

    data = load_mnist5k(data_dir, augment)
    data.train, data.test = Subset(data.train, range(TINY_TRAIN)), Subset(data.test, range(100))
    return data


def _rank(rank: int, world_size: int, port: int, config: dict) -> None:
    import torch

    from bnnexport.training.config import TrainConfig
    from bnnexport.training.train import train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    train(TrainConfig(**config), progress=False)


def train_processes(config, processes: int = 2, timeout: float = 120) -> None:
    """Train `config` (a TrainConfig) in `processes` gloo processes; AssertionError naming the
    exit codes when one fails (the others are stopped)."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    workers = [
        context.Process(target=_rank, args=(r, processes, port, dataclasses.asdict(config)))
        for r in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
    codes = [worker.exitcode for worker in workers]
    for worker in workers:
        if worker.is_alive():  # a rank waiting in a collective for one that died
            worker.terminate()
            worker.join()
    assert codes == [0] * processes, f"exit codes of the {processes} processes: {codes}"
