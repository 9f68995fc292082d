"""Flips: how many binary weights changed sign in an optimizer step, and the paper's flip rate.

π_t = log(flips / weights + e^-9) (Helwegen et al. 2019, Eq. 6): -9 means no flip at all.

Example:
    >>> round(flip_rate(10, 1000), 3)
    -4.593
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bnnexport.nn.layers import BinaryLayer
from bnnexport.nn.quantizers import binarize
from bnnexport.optim.composite import binary_kernels


def flip_rate(flips: int, total: int) -> float:
    """The paper's π_t = log(flips / total + e^-9) (Eq. 6); -9 means no flip at all."""
    return math.log(flips / total + math.exp(-9))


class FlipCounter:
    """Counts sign changes of every binary kernel across one optimizer step.

    Works for Bop (the weight is the kernel) and the latent baseline (the sign of the latent
    weight is the kernel) alike. `kernels` is {parameter name: parameter} (a composite
    optimizer's `binary_kernels`; default: `binary_kernels(model)`); a kernel that is a
    bnnexport layer's weight is counted under the layer's name, any other under its parameter's.
    """

    def __init__(self, model: nn.Module, kernels: dict[str, torch.Tensor] | None = None) -> None:
        kernels = binary_kernels(model) if kernels is None else kernels
        self.kernels: list[tuple[str, torch.Tensor]] = [
            (_layer_name(model, name), kernel) for name, kernel in kernels.items()
        ]
        self._before: list[torch.Tensor] = []

    @torch.no_grad()
    def before_step(self) -> None:
        self._before = [binarize(kernel) for _, kernel in self.kernels]

    @torch.no_grad()
    def after_step(self) -> dict[str, tuple[int, int]]:
        """{kernel name: (flips, total)} since `before_step`."""
        counts = {}
        for (name, kernel), before in zip(self.kernels, self._before, strict=True):
            flips = int((binarize(kernel) != before).sum())
            counts[name] = (flips, before.numel())
        return counts


def _layer_name(model: nn.Module, name: str) -> str:
    """`features.2` for the weight of bnnexport's layer `features.2`, else `name` itself."""
    owner, _, leaf = name.rpartition(".")
    if leaf == "weight" and isinstance(model.get_submodule(owner), BinaryLayer):
        return owner or "(root)"
    return name
