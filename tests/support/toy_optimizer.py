"""A toy optimizer in a module of its own, as a new optimizer is added: its class, its
factory and one `register_optimizer` call, with one hyperparameter (β) nothing else in
bnnexport names. `python -m support.toy_optimizer ARGS` is `bnnexport ARGS` with it
registered (tests/optim/test_optimizer_registry.py).

It registers on import, as any optimizer's module does: imported only in a process of its
own (tests/conftest.py keeps --doctest-modules from importing it into pytest's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bnnexport.optim.bop import LR, ScheduledAdam, require_plus_minus_one
from bnnexport.optim.composite import (
    LR_OPTION,
    CaseOptimizer,
    Hyperparameter,
    OptimizerEntry,
    binary_kernels,
    register_optimizer,
    set_to_sign,
)


class SignStep(torch.optim.Optimizer):
    """w <- -w where w·g > β: Bop with γ = 1 and τ = β (no memory of past gradients)."""

    def __init__(self, params: Any, beta: float) -> None:
        super().__init__(params, {"beta": beta, "lr": 0.0})
        self.schedules = {"beta": beta}  # what CaseOptimizer.hyperparameters() reports

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        for group in self.param_groups:
            for weight in group["params"]:
                if weight.grad is not None:
                    weight.mul_(torch.where(weight * weight.grad > group["beta"], -1.0, 1.0))


def toy_with_adam(
    model: nn.Module,
    beta: float = 0.5,
    lr: float | str = LR,
    *,
    binary: Any = None,
    init_sign: bool = False,
) -> CaseOptimizer:
    """SignStep for the binary kernels, Adam for everything real-valued."""
    kernels = binary_kernels(model, binary)
    if init_sign:
        set_to_sign(kernels)
    require_plus_minus_one(kernels)
    ids = {id(p) for p in kernels.values()}
    optimizer = CaseOptimizer(
        model,
        [
            ("bop", lambda _, p: id(p) in ids, lambda ps: SignStep(ps, beta)),
            ("adam", lambda _, p: id(p) not in ids, lambda ps: ScheduledAdam(ps, lr)),
        ],
    )
    optimizer.binary_kernels = kernels
    return optimizer


BETA = Hyperparameter(
    name="beta",
    symbol="β",
    default=0.5,
    help="The toy's flip threshold β >= 0 on w·g (a number).",
    what="flip threshold",
    ok=lambda value: math.isfinite(value) and value >= 0,
    rule="must be a finite number >= 0",
    schedulable=False,
)
register_optimizer(
    OptimizerEntry("toy", toy_with_adam, (BETA, LR_OPTION), ("beta",), "flips where w·g > β")
)

if __name__ == "__main__":
    from bnnexport.cli import main

    main()
