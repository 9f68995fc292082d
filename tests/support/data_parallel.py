"""Data-parallel training in a test: N gloo processes on loopback, each calling `train`.

`train_processes(config, processes)` starts the processes (spawned, so no thread pool of the test
process is copied into them) with the environment torchrun would give them and waits for them;
`tiny_mnist` is a data set loader (`--dataset support.data_parallel:tiny_mnist`) of 57 training
images, so that 2 processes at the global batch 16 end on a short global batch shared 5 / 4;
`recipe_mnist` one of 159: four steps at the CIFAR-10 recipes' batch of 50, the last global
batch of 9 shared 5 / 4 too. `train_processes` trains several configurations one after the
other in the same processes (starting them is most of a small run's time).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os

from torch.utils.data import Subset

from support.sshd_fixture import free_port

TINY_TRAIN = 57
RECIPE_TRAIN = 159


def first_images(train: int, data_dir=None, augment=True):
    """The first `train` training images of mnist5k and its first 100 test images."""
    from bnnexport.datasets import load_mnist5k

    data = load_mnist5k(data_dir, augment)
    data.train, data.test = Subset(data.train, range(train)), Subset(data.test, range(100))
    return data


def tiny_mnist(data_dir=None, augment=True):
    return first_images(TINY_TRAIN, data_dir, augment)


def recipe_mnist(data_dir=None, augment=True):
    return first_images(RECIPE_TRAIN, data_dir, augment)


def _rank(rank: int, world_size: int, ports: list[int], configs: list[dict]) -> None:
    import torch

    from bnnexport.stages.train import train
    from bnnexport.training.config import TrainConfig

    torch.set_num_threads(1)
    for port, config in zip(ports, configs, strict=True):  # a new process group each time
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        train(TrainConfig(**config), progress=False)


def train_processes(configs, processes: int = 2, timeout: float = 120) -> None:
    """Train `configs` (a TrainConfig, or a list of them, trained one after the other) in
    `processes` gloo processes; AssertionError naming the exit codes when one fails (the
    others are stopped)."""
    configs = configs if isinstance(configs, list) else [configs]
    context = multiprocessing.get_context("spawn")
    ports = [free_port() for _ in configs]
    settings = [dataclasses.asdict(config) for config in configs]
    workers = [
        context.Process(target=_rank, args=(r, processes, ports, settings))
        for r in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout * len(configs))
    codes = [worker.exitcode for worker in workers]
    for worker in workers:
        if worker.is_alive():  # a rank waiting in a collective for one that died
            worker.terminate()
            worker.join()
    assert codes == [0] * processes, f"exit codes of the {processes} processes: {codes}"
