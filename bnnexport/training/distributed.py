"""Data-parallel training under `torchrun`: process-group set-up and who does what.

`torchrun --nproc-per-node=N -m bnnexport train ...` starts N processes; each reads its rank from
the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK). Gradients are all-reduced by
DistributedDataParallel before the optimizer step, so Bop sees the same averaged gradient on every
rank and flips the same weights: the binary weights stay identical everywhere. Only rank 0 writes
the run directory and prints. Backend: NCCL on GPUs, gloo on CPU.

Example:
    >>> from bnnexport.training.distributed import setup
    >>> context = setup("cpu")  # outside torchrun: a single process
    >>> context.world_size, context.is_main
    (1, True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bnnexport.errors import DependencyError


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands in a (possibly single-process) training job."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum numbers over all ranks (used for global accuracy and loss)."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    @torch.no_grad()
    def count_mismatches(self, tensors: list[torch.Tensor]) -> int:
        """Entries, over all ranks, that differ from rank 0's copy (0 when ranks agree)."""
        if not self.enabled:
            return 0
        mismatched = torch.zeros(1, dtype=torch.float64, device=self.device)
        for tensor in tensors:
            reference = tensor.detach().clone()
            dist.broadcast(reference, src=0)
            mismatched += (reference != tensor).sum()
        dist.all_reduce(mismatched)
        return int(mismatched.item())

    def shutdown(self) -> None:
        """Leave the process group (a no-op for a single process)."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def setup(device: str = "cpu") -> DistributedContext:
    """Join the process group torchrun describes, or return a single-process context."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DependencyError(f"--device {device}: no CUDA GPU is available to this process")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext(device=device)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DistributedContext(rank=rank, world_size=world_size, device=device)
