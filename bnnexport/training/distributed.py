"""Data-parallel training under `torchrun`: process-group set-up, who does what, and what makes
N processes sharing each batch of B the same experiment as one process at batch B.

`torchrun --nproc-per-node=N -m bnnexport train ...` starts N processes; each reads its rank from
the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK). `--batch-size` is the global
batch, as a recipe's is: each process takes batch-size / N (`process_batch_size`). Gradients
are all-reduced by DistributedDataParallel before the optimizer step, so Bop sees the same
averaged gradient on every rank and flips the same weights: the binary weights stay identical
everywhere. Only rank 0 writes the run directory and prints; the step rows' loss and
accuracies are the global batch's (`bnnexport.training.loop.BatchCounts`, all-reduced).
Backend: NCCL on GPUs, gloo on CPU.

The same experiment as one process takes two more things, both here:

- `GlobalBatches`: one sampler for one process and for N. Every process draws the same
  permutation (seed + epoch), cuts it into global batches of N x batch-size and takes its share
  of each, so the global batches are those of one process at the global batch size.
- `global_batchnorm`: BatchNorm statistics over the global batch, not each process's share,
  computed the same way in one process and in N (`AllReduceBatchNorm`: per-sample sums added in
  float64 and all-reduced; torch's SyncBatchNorm refuses the CPU and gloo, and its statistics
  differ from one process's by rounding). `train --per-process-batchnorm` turns it off.

Example:
    >>> from bnnexport.training.distributed import setup
    >>> context = setup("cpu")  # outside torchrun: a single process
    >>> context.world_size, context.is_main
    (1, True)
    >>> [len(b) for b in GlobalBatches(10, 2, seed=0, epoch=0, rank=1, world_size=2)]
    [2, 2, 1]
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Sampler

from bnnexport.errors import ConfigError, DependencyError


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


def process_batch_size(batch_size: int, world_size: int) -> int:
    """Each process's share of the global batch `batch_size` (`train --batch-size`, the same
    experiment in one process and in N); ConfigError naming both numbers when N processes
    cannot share it evenly.

    Example:
        >>> process_batch_size(50, 2)
        25
    """
    if batch_size % world_size:
        raise ConfigError(
            f"--batch-size {batch_size} cannot be shared evenly by {world_size} processes: it "
            f"is the global batch (each process takes batch-size / {world_size}); give a "
            f"multiple of {world_size}"
        )
    return batch_size // world_size


class GlobalBatches(Sampler[list[int]]):
    """One process's batches of one epoch, cut from global batches that every process agrees
    on; with `world_size` 1, simply the epoch's shuffled batches.

    Every process draws the same permutation of the `size` samples from `seed + epoch`, the
    same for any number of processes, cuts it into global batches of `batch_size x
    world_size` and takes its `rank`-th share of each. So N processes at batch B/N train on
    exactly the global batches of one process at batch B, in the same order. The last global
    batch may be short: it is shared as evenly as possible (the first ranks take one more
    sample; `shares` says how each process weighs its loss), or dropped when it holds fewer
    than `smallest_last` samples (BatchNorm cannot train on a single value per channel).

    Example:
        >>> one = GlobalBatches(8, 4, seed=0, epoch=0)
        >>> two = [GlobalBatches(8, 2, seed=0, epoch=0, rank=r, world_size=2) for r in (0, 1)]
        >>> [sorted(b) for b in one] == [sorted(a + b) for a, b in zip(*two)]
        True
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        seed: int,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        smallest_last: int = 2,
    ) -> None:
        self.size, self.batch_size, self.seed, self.epoch = size, batch_size, seed, epoch
        self.rank, self.world_size = rank, world_size
        step = batch_size * world_size
        self.global_sizes = [min(step, size - start) for start in range(0, size, step)]
        if len(self.global_sizes) > 1 and self.global_sizes[-1] < smallest_last:
            self.global_sizes.pop()

    def __len__(self) -> int:
        return len(self.global_sizes)

    def shares(self, index: int) -> float:
        """How much this process's loss on batch `index` weighs, 1.0 where every process holds
        the same number of samples: its samples x world_size / the global batch's samples
        (DDP averages the processes' gradients, which then equal the global batch's)."""
        total = self.global_sizes[index]
        mine = len(self._share(range(total)))
        return mine * self.world_size / total

    def _share(self, batch: Any) -> Any:
        """This rank's part of one global batch: as even as possible, first ranks larger."""
        part, extra = divmod(len(batch), self.world_size)
        start = self.rank * part + min(self.rank, extra)
        return batch[start : start + part + (self.rank < extra)]

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        start = 0
        for total in self.global_sizes:
            yield self._share(order[start : start + total])
            start += total


def _sum_over_batch(x: torch.Tensor) -> torch.Tensor:
    """Per channel, the float64 sum of `x` (N, C, ...) over all but the channel dimension,
    the same to the bit however the batch is split: each sample's own float32 sum first (the
    same kernel on the same data in one process or in N), then those few sums in float64, where
    their order no longer shows once the result is rounded to float32."""
    per_sample = x.sum(list(range(2, x.dim()))) if x.dim() > 2 else x
    return per_sample.sum(0, dtype=torch.float64)


def _all_reduce(tensor: torch.Tensor, synced: bool) -> torch.Tensor:
    if synced:
        dist.all_reduce(tensor)
    return tensor


class _Normalize(torch.autograd.Function):
    """y = centered · invstd · w + b, `centered` = x - the global batch's mean (computed
    without autograd; the gradient goes to x); the backward is
    BatchNorm's with its two per-channel sums (Σdy, Σdy·centered) all-reduced, so every
    process's input gradient is the global batch's (w and b keep their local gradients, which
    DDP averages)."""

    @staticmethod
    def forward(ctx: Any, x, centered, invstd, weight, bias, count: float, synced: bool):  # type: ignore[override]
        shape = [1, -1] + [1] * (centered.dim() - 2)
        scale = invstd if weight is None else invstd * weight
        ctx.save_for_backward(centered, invstd, scale)
        ctx.count, ctx.synced, ctx.affine = count, synced, weight is not None
        offset = torch.zeros_like(invstd) if bias is None else bias
        return torch.addcmul(offset.view(shape), centered, scale.view(shape))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        centered, invstd, scale = ctx.saved_tensors
        dims, shape = [0, *range(2, grad.dim())], [1, -1] + [1] * (grad.dim() - 2)
        sums = torch.stack([grad.sum(dims), (grad * centered).sum(dims)])
        grad_weight = sums[1] * invstd if ctx.affine else None  # Σ dy·x̂, this process's
        grad_bias = sums[0].clone() if ctx.affine else None
        total = _all_reduce(sums, ctx.synced) / ctx.count
        # dx = (dy - mean(dy) - x̂ · mean(dy·x̂)) · invstd · w, with x̂ = centered · invstd
        grad_input = torch.addcmul((-total[0] * scale).view(shape), grad, scale.view(shape))
        grad_input.addcmul_(centered, (-total[1] * invstd * invstd * scale).view(shape))
        return grad_input, None, None, grad_weight, grad_bias, None, None


class AllReduceBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are the global batch's, computed alike in one
    process and in N, so that N processes at batch B/N normalise exactly as one at batch B
    (`global_batchnorm` mixes it into a model's own BatchNorm classes: an
    `AllReduceBatchNorm2d` is a `nn.BatchNorm2d` too). In eval mode it is plain BatchNorm.

    Mean and variance come from per-sample float32 sums added in float64 (`_sum_over_batch`)
    and all-reduced across the processes, so they round to the same float32 however the batch
    is split; torch's own CPU BatchNorm sums in float32 in an order that depends on the batch
    and the threads (its statistics differed from these by up to 2e-4 on mnist-bnn's first
    layer, enough to flip signs the next layer binarizes). torch's SyncBatchNorm merges
    per-process statistics and refuses the CPU. The backward is BatchNorm's, with its two sums
    all-reduced. Running statistics follow BatchNorm's rule (momentum, or the cumulative
    average when momentum is None), with the unbiased global variance.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)  # plain BatchNorm
        synced = dist.is_available() and dist.is_initialized()
        x = input.float()
        shape = [1, -1] + [1] * (x.dim() - 2)
        with torch.no_grad():
            count = float(_all_reduce(torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64,
                                                   device=x.device), synced))  # fmt: skip
            mean = (_all_reduce(_sum_over_batch(x), synced) / count).float()
            centered = x - mean.view(shape)
            variance = _all_reduce(_sum_over_batch(centered.square()), synced) / count
            self._track(mean, variance, count)
            invstd = torch.rsqrt(variance + self.eps).float()
        # x itself goes in too: its gradient is the one the backward computes for `centered`
        output = _Normalize.apply(x, centered, invstd, self.weight, self.bias, count, synced)
        return output.to(input.dtype)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, variance: torch.Tensor, count: float) -> None:
        if not self.track_running_stats or self.running_mean is None:
            return
        self.num_batches_tracked.add_(1)  # type: ignore[union-attr]
        factor = self.momentum
        if factor is None:  # the cumulative average, as BatchNorm keeps it
            factor = 1.0 / float(self.num_batches_tracked)  # type: ignore[arg-type]
        unbiased = variance * count / max(count - 1.0, 1.0)
        self.running_mean.mul_(1.0 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(unbiased.float(), alpha=factor)  # type: ignore[union-attr]


def global_batchnorm(model: nn.Module) -> nn.Module:
    """`model` with every BatchNorm an `AllReduceBatchNorm`: training statistics over the
    global batch, computed alike in one process and in N, on any device and backend. Its
    parameters, buffers and state-dict keys stay the same tensors, so optimizers and
    checkpoints see no difference; the model is changed in place (and returned).

    Not torch's SyncBatchNorm, even on GPUs where it runs: it merges per-process float32
    statistics, and one process's BatchNorm sums in yet another order, so the two would normalise
    a batch differently by rounding and flip different signs downstream."""
    return _convert(model)


_ALL_REDUCE_CLASSES: dict[type, type] = {}


def _convert(module: nn.Module) -> nn.Module:
    """Every BatchNorm below `module` (itself included) made an AllReduceBatchNorm in place:
    its class becomes a subclass of its own with the all-reduce forward, so it keeps its
    parameters, buffers, hooks and `isinstance(m, nn.BatchNorm2d)`."""
    for child in module.modules():
        kind = type(child)
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(
            child, (nn.SyncBatchNorm, AllReduceBatchNorm)
        ):
            if kind not in _ALL_REDUCE_CLASSES:
                _ALL_REDUCE_CLASSES[kind] = type(
                    f"AllReduce{kind.__name__}", (AllReduceBatchNorm, kind), {}
                )
            child.__class__ = _ALL_REDUCE_CLASSES[kind]
    return module
