"""Bop, the latent-free binary optimizer, and the optimizers that train beside it.

Bop (Helwegen et al., "Latent Weights Do Not Exist: Rethinking Binarized Neural Network
Optimization", NeurIPS 2019, Algorithm 2) keeps one exponential moving average m of the gradient
per binary weight and flips the weight when the average is strong enough and points the same way:

    m <- (1 - γ) m + γ g        (m starts at 0)
    w <- -w   iff   w · m > τ   (equivalently |m| > τ and sign(m) = sign(w))

`CaseOptimizer` gives each parameter to exactly one optimizer (Bop for binary kernels, Adam for
everything real-valued), the role of larq's CaseOptimizer. `latent_adam` is the latent-weight
baseline: Adam on real weights that the layers binarize in the forward pass (STE), clipped to
[-1, 1].

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> from bnnexport.optimizers import bop_with_adam
    >>> model = create_model("mnist-bnn")
    >>> optimizer = bop_with_adam(model, gamma=1e-4, threshold=1e-8, lr=1e-2)
    >>> model(torch.randn(4, 1, 28, 28)).sum().backward()
    >>> optimizer.step()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from bnnexport.layers import binary_layers, binary_parameters, set_latent
from bnnexport.quantizers import binarize
from bnnexport.schedules import Schedule, as_schedule, schedule_from_dict, schedule_to_dict

_EXTRA = "bnnexport"  # key of our own additions in an optimizer state dict


class _Scheduled:
    """Mixin: hyperparameters given as schedules, evaluated at every step, saved as dicts."""

    schedules: dict[str, Schedule]
    steps: int

    def _apply_schedules(self) -> None:
        for group in self.param_groups:  # type: ignore[attr-defined]
            for key, schedule in self.schedules.items():
                group[key] = schedule(self.steps)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()  # type: ignore[misc]
        state[_EXTRA] = {
            "steps": self.steps,
            "schedules": {k: schedule_to_dict(s) for k, s in self.schedules.items()},
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop(_EXTRA, None)
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if extra is not None:
            self.steps = int(extra["steps"])
            self.schedules = {k: schedule_from_dict(v) for k, v in extra["schedules"].items()}


class Bop(_Scheduled, torch.optim.Optimizer):
    """Binary optimizer (Helwegen et al. 2019, Algorithm 2) for parameters that are exactly ±1.

    Args:
        params: the binary kernels (e.g. `bnnexport.binary_parameters(model)`).
        gamma: adaptivity rate γ of the moving average; a number or a schedule
            (`bnnexport.schedules`), evaluated at every step.
        threshold: flip threshold τ; a number or a schedule.

    After each step, `state[p]["flips"]` holds how many entries of p flipped in that step.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        gamma: float | str | Schedule = 1e-4,
        threshold: float | str | Schedule = 1e-8,
    ) -> None:
        self.schedules = {"gamma": as_schedule(gamma), "threshold": as_schedule(threshold)}
        self.steps = 0
        defaults = {k: s(0) for k, s in self.schedules.items()}
        if not 0.0 < defaults["gamma"] <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {defaults['gamma']}")
        if defaults["threshold"] < 0.0:
            raise ValueError(f"threshold must be >= 0, got {defaults['threshold']}")
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._apply_schedules()
        for group in self.param_groups:
            for weight in group["params"]:
                if weight.grad is not None:
                    state = self.state[weight]
                    state["flips"] = self._update(weight, weight.grad, state, group)
        self.steps += 1
        return loss

    def _update(
        self, weight: torch.Tensor, grad: torch.Tensor, state: dict, group: dict
    ) -> torch.Tensor:
        """Update the state, flip `weight` in place, return how many entries flipped."""
        alignment = _update_momentum(weight, grad, state, group["gamma"])
        return _flip(weight, alignment, group["threshold"])


def _update_momentum(
    weight: torch.Tensor, grad: torch.Tensor, state: dict, gamma: float
) -> torch.Tensor:
    """m <- (1-γ) m + γ g in place; returns w·m in a fresh scratch tensor.

    One scratch tensor, all in place: bit-identical to m·(1-γ) + g·γ and several times faster
    than bool masks and `where` on CPU (benchmarks/optimizer.py).
    """
    if "momentum" not in state:
        state["momentum"] = torch.zeros_like(weight)
    momentum = state["momentum"]
    scratch = torch.mul(grad, gamma)
    momentum.mul_(1.0 - gamma).add_(scratch)
    return torch.mul(weight, momentum, out=scratch)


def _flip(weight: torch.Tensor, score: torch.Tensor, threshold: float | torch.Tensor):
    """Flip `weight` where score > threshold (overwrites `score`); returns the flip count."""
    flip = score.gt_(threshold)  # 1.0 / 0.0
    weight.addcmul_(weight, flip, value=-2.0)  # w - 2w: exactly -w where flipped
    # a float32 sum of 0/1 is exact up to 2^24 entries
    count = flip.sum() if flip.numel() <= 1 << 24 else torch.count_nonzero(flip)
    return count.to(torch.int64)


class ScheduledAdam(_Scheduled, torch.optim.Adam):
    """Adam whose learning rate may be a schedule; optionally clips parameters after each step.

    `clip_value=1.0` gives the latent-weight baseline's clipping to [-1, 1] (larq's weight_clip).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | str | Schedule = 1e-3,
        clip_value: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.schedules = {"lr": as_schedule(lr)}
        self.steps = 0
        self.clip_value = clip_value
        super().__init__(params, lr=self.schedules["lr"](0), **kwargs)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self._apply_schedules()
        loss = super().step(closure)
        if self.clip_value is not None:
            for group in self.param_groups:
                for param in group["params"]:
                    param.clamp_(-self.clip_value, self.clip_value)
        self.steps += 1
        return loss


Predicate = Callable[[str, nn.Parameter], bool]
Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class CaseOptimizer:
    """Give every parameter of a model to exactly one optimizer, chosen by predicate.

    Raises ValueError naming the parameter if one is claimed by two cases or by none: a silently
    untrained (or doubly trained) parameter is a bug, never a default.

    Args:
        model: the model whose parameters are distributed.
        cases: (name, predicate(param_name, param), factory(params) -> optimizer); a case that
            claims no parameter creates no optimizer.
    """

    def __init__(self, model: nn.Module, cases: list[tuple[str, Predicate, Factory]]) -> None:
        claimed: dict[str, list[nn.Parameter]] = {name: [] for name, _, _ in cases}
        for param_name, param in model.named_parameters():
            owners = [name for name, predicate, _ in cases if predicate(param_name, param)]
            if len(owners) > 1:
                raise ValueError(f"parameter {param_name!r} is claimed by {' and '.join(owners)}")
            if not owners:
                raise ValueError(f"parameter {param_name!r} is claimed by no optimizer")
            claimed[owners[0]].append(param)
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            name: factory(claimed[name]) for name, _, factory in cases if claimed[name]
        }

    def step(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != set(self.optimizers):
            raise ValueError(
                f"optimizer state holds {sorted(state_dict)}, expected {sorted(self.optimizers)}"
            )
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state_dict[name])

    def hyperparameters(self) -> dict[str, float]:
        """Current value of every scheduled hyperparameter, e.g. {'bop.gamma': 1e-4, ...}."""
        values = {}
        for name, optimizer in self.optimizers.items():
            for key in getattr(optimizer, "schedules", {}):
                values[f"{name}.{key}"] = float(optimizer.param_groups[0][key])
        return values


def _binary_ids(model: nn.Module) -> set[int]:
    return {id(p) for p in binary_parameters(model)}


def bop_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = 1e-4,
    threshold: float | str | Schedule = 1e-8,
    lr: float | str | Schedule = 1e-2,
) -> CaseOptimizer:
    """Bop for the binary kernels, Adam for every real-valued parameter (the paper's setup)."""
    return _binary_optimizer_with_adam(model, lr, lambda ps: Bop(ps, gamma, threshold))


def latent_adam(model: nn.Module, lr: float | str | Schedule = 1e-2) -> CaseOptimizer:
    """The latent-weight baseline: switches the model to latent mode, Adam on everything,
    binary layers' latent weights clipped to [-1, 1] after every step."""
    set_latent(model, True)
    binary = _binary_ids(model)
    return CaseOptimizer(
        model,
        [
            (
                "latent",
                lambda _, p: id(p) in binary,
                lambda ps: ScheduledAdam(ps, lr, clip_value=1.0),
            ),
            ("adam", lambda _, p: id(p) not in binary, lambda ps: ScheduledAdam(ps, lr)),
        ],
    )


class Bop2ndOrder(Bop):
    """Bop with a second-moment estimate ("Bop and Beyond", Suarez-Ramirez et al. 2021):

        m <- (1 - γ) m + γ g,   v <- v + σ (g² - v)   (both start at 0)
        w <- -w   iff   w · m / (sqrt(v) + ε) > τ

    Normalising m by the gradient's running RMS makes τ comparable across layers and over
    training. Args as `Bop`, plus `sigma` (σ, a number or a schedule) and `eps` (ε = 1e-10).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        gamma: float | str | Schedule = 1e-4,
        threshold: float | str | Schedule = 1e-8,
        sigma: float | str | Schedule = 1e-2,
        eps: float = 1e-10,
    ) -> None:
        super().__init__(params, gamma, threshold)
        self.schedules["sigma"] = as_schedule(sigma)
        self.eps = eps
        for group in self.param_groups:
            group.setdefault("sigma", self.schedules["sigma"](0))

    def _update(
        self, weight: torch.Tensor, grad: torch.Tensor, state: dict, group: dict
    ) -> torch.Tensor:
        if "second_moment" not in state:
            state["second_moment"] = torch.zeros_like(weight)
        second_moment = state["second_moment"]
        second_moment.add_(grad * grad - second_moment, alpha=group["sigma"])
        score = _update_momentum(weight, grad, state, group["gamma"])
        score.div_(second_moment.sqrt().add_(self.eps))
        return _flip(weight, score, group["threshold"])


class BopNormalized(Bop):
    """Bop with a layer-wise normalised threshold (Helwegen et al. 2019, discussion section):

        m <- (1 - γ) m + γ g
        w <- -w   iff   w · m > τ · mean(|m|)   (the mean over the layer's kernel)

    τ is then dimensionless (e.g. 1-3): the same τ suits layers whose gradients differ by
    orders of magnitude, where Bop's absolute τ flips some layers constantly and others never.
    """

    def _update(
        self, weight: torch.Tensor, grad: torch.Tensor, state: dict, group: dict
    ) -> torch.Tensor:
        score = _update_momentum(weight, grad, state, group["gamma"])
        return _flip(weight, score, group["threshold"] * state["momentum"].abs().mean())


def _binary_optimizer_with_adam(
    model: nn.Module, lr: float | str | Schedule, make: Factory
) -> CaseOptimizer:
    binary = _binary_ids(model)
    return CaseOptimizer(
        model,
        [
            ("bop", lambda _, p: id(p) in binary, make),
            ("adam", lambda _, p: id(p) not in binary, lambda ps: ScheduledAdam(ps, lr)),
        ],
    )


def bop2_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = 1e-4,
    threshold: float | str | Schedule = 1e-8,
    lr: float | str | Schedule = 1e-2,
    sigma: float | str | Schedule = 1e-2,
) -> CaseOptimizer:
    """`Bop2ndOrder` for the binary kernels, Adam for every real-valued parameter."""
    return _binary_optimizer_with_adam(
        model, lr, lambda ps: Bop2ndOrder(ps, gamma, threshold, sigma)
    )


def bop_normalized_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = 1e-4,
    threshold: float | str | Schedule = 1.0,
    lr: float | str | Schedule = 1e-2,
) -> CaseOptimizer:
    """`BopNormalized` (τ relative to each layer's mean |m|) for the binary kernels, Adam for
    every real-valued parameter."""
    return _binary_optimizer_with_adam(model, lr, lambda ps: BopNormalized(ps, gamma, threshold))


OPTIMIZERS: dict[str, Callable[..., CaseOptimizer]] = {
    "bop": bop_with_adam,
    "adam-latent": latent_adam,
    "bop2": bop2_with_adam,
    "bop-normalized": bop_normalized_with_adam,
}


def flip_rate(flips: int, total: int) -> float:
    """The paper's π_t = log(flips / total + e^-9) (Eq. 6); -9 means no flip at all."""
    return math.log(flips / total + math.exp(-9))


class FlipCounter:
    """Counts sign changes of every binary layer's effective kernel across one optimizer step.

    Works for Bop (the weight is the kernel) and the latent baseline (the sign of the latent
    weight is the kernel) alike.
    """

    def __init__(self, model: nn.Module) -> None:
        self.layers = binary_layers(model)
        self._before: list[torch.Tensor] = []

    @torch.no_grad()
    def before_step(self) -> None:
        self._before = [binarize(layer.weight) for _, layer in self.layers]

    @torch.no_grad()
    def after_step(self) -> dict[str, tuple[int, int]]:
        """{layer name: (flips, total)} since `before_step`."""
        counts = {}
        for (name, layer), before in zip(self.layers, self._before, strict=True):
            flips = int((binarize(layer.weight) != before).sum())
            counts[name] = (flips, before.numel())
        return counts
