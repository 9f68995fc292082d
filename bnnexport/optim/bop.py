"""Bop, the latent-free binary optimizer, its variants, and the scheduled Adam beside it.

Bop (Helwegen et al., "Latent Weights Do Not Exist: Rethinking Binarized Neural Network
Optimization", NeurIPS 2019, Algorithm 2) keeps one exponential moving average m of the gradient
per binary weight and flips the weight when the average is strong enough and points the same way:

    m <- (1 - γ) m + γ g        (m starts at 0)
    w <- -w   iff   w · m > τ   (equivalently |m| > τ and sign(m) = sign(w))

`Bop2ndOrder` ("Bop and Beyond") normalises m by the gradient's running RMS; `BopNormalized`
(bnnexport's own) makes τ relative to each layer's mean |m|. Every hyperparameter is a number
or a schedule (`bnnexport.optim.schedules`), per parameter group. `bnnexport.training.
composite` puts them beside Adam for the real-valued parameters.

Defaults, the same in Python and for `bnnexport train`: γ = 1e-3, τ = 1e-6 and Adam's lr = 1e-3
(`GAMMA`, `THRESHOLD`, `LR`; measured on mnist5k). The paper's CIFAR-10 values (γ 1e-4, τ 1e-8,
lr 1e-2, 500 epochs) are in `bnnexport recipes`.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([1.0, -1.0, 1.0]))
    >>> bop = Bop([w], gamma=1.0, threshold=0.5)
    >>> w.grad = torch.tensor([1.0, 0.2, -1.0])
    >>> bop.step(); w.tolist()  # w·m > τ flips the first weight only
    [-1.0, -1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from bnnexport.errors import NotBinaryError
from bnnexport.optim.schedules import (
    Constant,
    Schedule,
    as_schedule,
    first_step_outside,
    schedule_from_dict,
    schedule_to_dict,
)

_EXTRA = "bnnexport"  # key of our own additions in an optimizer state dict


# One set of defaults for Python and the CLI (TrainConfig takes these): 1e-3 / 1e-6 flip enough
# within a few mnist5k epochs; the paper's 1e-4 / 1e-8 need its 500 CIFAR-10 epochs.
GAMMA = 1e-3


THRESHOLD = 1e-6


# 1e-2 (the paper's CIFAR value) overfits mnist5k's 4,000 images: 0.941 vs 0.957 test
# accuracy after 5 epochs; the CIFAR recipes set 1e-2 explicitly.
LR = 1e-3


SIGMA = 1e-2  # Bop2ndOrder's second-moment rate


def _positive_in_float32(value: float) -> bool:
    """In (0, 1], and still above 0 once rounded to float32, the precision Bop's moving
    averages compute in (a γ of 1e-300 is 0 there: m would never move)."""
    return 0.0 < value <= 1.0 and bool(np.float32(value) > 0)


def _finite_non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0.0


# The range every value of each scheduled hyperparameter must stay in, at every step, for the
# optimizers and for `bnnexport train` alike (bnnexport.training.config): (test, rule in words).
# τ and lr >= 0 as torch's Adam takes lr (a warm-up or a cosine decay reaches 0); τ = inf or
# nan would never flip anything.
HYPERPARAMETER_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "gamma": (_positive_in_float32, "must be in (0, 1] (and above 0 in float32)"),
    "threshold": (_finite_non_negative, "must be a finite number >= 0"),
    "lr": (_finite_non_negative, "must be a finite number >= 0"),
    "sigma": (_positive_in_float32, "must be in (0, 1] (and above 0 in float32)"),
}


def check_hyperparameters(values: dict[str, float]) -> None:
    """ValueError naming the first value outside its `HYPERPARAMETER_RULES` range.

    Example:
        >>> check_hyperparameters({"gamma": 1e-300})
        Traceback (most recent call last):
        ...
        ValueError: gamma must be in (0, 1] (and above 0 in float32), got 1e-300
    """
    for key, value in values.items():
        ok, rule = HYPERPARAMETER_RULES[key]
        if not ok(value):
            raise ValueError(f"{key} {rule}, got {value:g}")


class _Scheduled:
    """Mixin: hyperparameters given per optimizer or per parameter group, as numbers or schedules.

    `self.schedules` holds the optimizer-wide settings (the constructor's arguments); a
    parameter group that names a hyperparameter itself keeps its own value or schedule
    (`group["schedules"]`), and the optimizer-wide one applies only to groups that did not.
    Every group counts its own steps (`group["steps"]`), and a schedule is evaluated at that
    count before each step. A constant is written into the group once, so the group's value is
    the truth afterwards, as for any torch optimizer (a torch LR scheduler may change it).
    """

    schedules: dict[str, Schedule]
    steps: int

    def _init_schedules(self, values: dict[str, Any]) -> dict[str, float]:
        """Set the optimizer-wide schedules; returns their step-0 values (the defaults)."""
        self.schedules = {key: as_schedule(value) for key, value in values.items()}
        self.steps = 0
        for key, schedule in self.schedules.items():
            self._check_course(key, schedule, 0)
        return {key: schedule(0) for key, schedule in self.schedules.items()}

    def _check_values(self, values: dict[str, float]) -> None:
        """Raise ValueError for a value the optimizer cannot use (subclasses override)."""

    def _check_course(self, key: str, schedule: Schedule, start: int) -> None:
        """ValueError naming the first step from `start` on, over the schedule's own course
        (`schedules.first_step_outside`), whose value `_check_values` refuses."""

        def ok(value: float) -> bool:
            try:
                self._check_values({key: value})
            except ValueError:
                return False
            return True

        step = first_step_outside(schedule, ok, start=start)
        if step is not None:
            try:
                self._check_values({key: schedule(step)})
            except ValueError as error:
                where = f" at step {step} of {schedule_to_dict(schedule)}"
                raise ValueError(f"{error}{where if step != start else ''}") from None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's; a setting the group does not give itself is the optimizer-wide one as it
        is now (after `set_schedule` too), and a group added later counts its steps from the
        optimizer's, so the optimizer-wide schedules go on where they are."""
        group = dict(param_group)
        steps = int(group.get("steps", getattr(self, "steps", 0)))
        own = {
            key: as_schedule(group[key])
            for key in self.schedules
            if key in group and not isinstance(group[key], torch.Tensor)
        }
        for key, schedule in own.items():
            self._check_course(key, schedule, steps)
        values = {key: own.get(key, default)(steps) for key, default in self.schedules.items()}
        group.update(values, schedules=own, steps=steps)
        super().add_param_group(group)  # type: ignore[misc]

    def set_schedule(self, key: str, value: float | str | Schedule) -> None:
        """Replace the optimizer-wide schedule `key`; groups with their own keep theirs, and a
        group added later takes the new one."""
        schedule = as_schedule(value)
        self._check_course(key, schedule, self.steps)
        self.schedules[key] = schedule
        self.defaults[key] = schedule(self.steps)  # type: ignore[attr-defined]
        for group in self.param_groups:  # type: ignore[attr-defined]
            if key not in group["schedules"]:
                group[key] = schedule(group["steps"])

    def _apply_schedules(self) -> None:
        """Every group's values for the coming step; ValueError naming the step, before any
        group changes, when one leaves its range."""
        coming = []
        for group in self.param_groups:  # type: ignore[attr-defined]
            for key, default in self.schedules.items():
                schedule = group["schedules"].get(key, default)
                if isinstance(schedule, Constant):
                    continue  # written once: a torch scheduler or the user may change it
                if f"initial_{key}" in group:  # torch's LRScheduler marks the groups it drives
                    raise ValueError(
                        f"{key} follows a bnnexport schedule ({schedule_to_dict(schedule)}) and a "
                        f"torch scheduler: give {key} as a number to use a torch scheduler"
                    )
                value = schedule(group["steps"])
                try:
                    self._check_values({key: value})
                except ValueError as error:
                    where = f" at step {group['steps']} of {schedule_to_dict(schedule)}"
                    raise ValueError(f"{error}{where}") from None
                coming.append((group, key, value))
        for group, key, value in coming:
            group[key] = value

    def _count_step(self) -> None:
        for group in self.param_groups:  # type: ignore[attr-defined]
            group["steps"] += 1
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()  # type: ignore[misc]
        for group in state["param_groups"]:  # torch made a new dict per group: replace, not edit
            group["schedules"] = {k: schedule_to_dict(s) for k, s in group["schedules"].items()}
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
        for group in self.param_groups:  # type: ignore[attr-defined]
            # state dicts from before per-group settings hold neither key
            saved = group.get("schedules") or {}
            group["schedules"] = {k: schedule_from_dict(v) for k, v in saved.items()}
            group.setdefault("steps", self.steps)
            for key, default in self.defaults.items():  # type: ignore[attr-defined]
                group.setdefault(key, default)


def require_plus_minus_one(kernels: dict[str, torch.Tensor]) -> None:
    """Raise NotBinaryError naming the first kernel that is not exactly ±1, with its count of
    other values and the two ways out."""
    for name, kernel in kernels.items():
        off = int((kernel.detach().abs() != 1).sum())
        if off:
            raise NotBinaryError(
                f"Bop flips signs only, and {name} has {off} of {kernel.numel()} values that are "
                "not ±1: initialise it with torch.where(w >= 0, 1.0, -1.0), or pass "
                "init_sign=True (train --init-sign) to have bop_with_adam do so"
            )


class Bop(_Scheduled, torch.optim.Optimizer):
    """Binary optimizer (Helwegen et al. 2019, Algorithm 2) for parameters that are exactly ±1.

    Per step t and parameter group, with that group's γ_t and τ_t:

        m <- (1 - γ_t) m + γ_t g        w <- -w  where  w · m > τ_t

    Args:
        params: the binary kernels (e.g. `bnnexport.binary_parameters(model)`), or parameter
            groups: dicts with "params" and optionally their own "gamma" and "threshold" (a
            number or a schedule), which override the arguments below for that group.
        gamma: adaptivity rate γ in (0, 1]; a number or a schedule (`bnnexport.optim.schedules`),
            evaluated at every step, for every group that did not set its own.
        threshold: flip threshold τ >= 0; a number or a schedule, likewise.

    Every group also holds `lr` = 0.0, which Bop never reads: torch's LR schedulers scale every
    group's `lr`, so one attached to a composite (`CaseOptimizer`) changes Adam's lr and
    leaves γ alone. After each step, `state[p]["flips"]` holds how many entries of p flipped.

    Example (the first kernel with its own γ and τ):
        >>> import torch
        >>> first, rest = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
        >>> bop = Bop([{"params": [first], "gamma": 1e-1, "threshold": 0.0}, {"params": [rest]}],
        ...           gamma=1e-4, threshold=1e-8)
        >>> first.grad, rest.grad = torch.full((4,), 1e-5), torch.full((4,), 1e-5)
        >>> bop.step()  # first: w·m = 1e-6 > 0 flips; rest: w·m = 1e-9 <= 1e-8 does not
        >>> first.tolist(), rest.tolist()
        ([-1.0, -1.0, -1.0, -1.0], [1.0, 1.0, 1.0, 1.0])
        >>> [(g["gamma"], g["threshold"]) for g in bop.param_groups]
        [(0.1, 0.0), (0.0001, 1e-08)]
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        gamma: float | str | Schedule = GAMMA,
        threshold: float | str | Schedule = THRESHOLD,
    ) -> None:
        self._init(params, {"gamma": gamma, "threshold": threshold})

    def _init(self, params: Any, schedules: dict[str, Any]) -> None:
        defaults = self._init_schedules(schedules)
        torch.optim.Optimizer.__init__(self, params, {**defaults, "lr": 0.0})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, refusing a parameter that is not exactly ±1 (NotBinaryError): Bop only
        flips signs, so anything else would stay as it is forever."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        index = sum(len(group["params"]) for group in self.param_groups)
        require_plus_minus_one({f"parameter {index + k}": p for k, p in enumerate(params)})
        super().add_param_group({**param_group, "params": params})

    def _check_values(self, values: dict[str, float]) -> None:
        check_hyperparameters({k: v for k, v in values.items() if k in ("gamma", "threshold")})

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
        self._count_step()
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
    """Adam whose learning rate may be a schedule, per optimizer or per parameter group;
    optionally clips parameters after each step.

    `clip_value=1.0` gives the latent-weight baseline's clipping to [-1, 1] (larq's weight_clip).
    A torch LR scheduler may drive a group whose lr is a number; one whose lr is a schedule
    refuses it (ValueError at the next step) rather than let two schedules fight.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | str | Schedule = 1e-3,
        clip_value: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.clip_value = clip_value
        defaults = self._init_schedules({"lr": lr})
        super().__init__(params, lr=defaults["lr"], **kwargs)

    def _check_values(self, values: dict[str, float]) -> None:
        check_hyperparameters({k: v for k, v in values.items() if k == "lr"})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self._apply_schedules()
        loss = super().step(closure)
        if self.clip_value is not None:
            for group in self.param_groups:
                for param in group["params"]:
                    param.clamp_(-self.clip_value, self.clip_value)
        self._count_step()
        return loss


class Bop2ndOrder(Bop):
    """Bop with a second-moment estimate ("Bop and Beyond", Suarez-Ramirez et al. 2021):

        m <- (1 - γ) m + γ g,   v <- v + σ (g² - v)   (both start at 0)
        w <- -w   iff   w · m / (sqrt(v) + ε) > τ

    Normalising m by the gradient's running RMS makes τ comparable across layers and over
    training. Args as `Bop`, plus `sigma` (σ in (0, 1], a number or a schedule; a parameter
    group may set its own "sigma" as it may set "gamma" and "threshold") and `eps` (ε = 1e-10).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        gamma: float | str | Schedule = GAMMA,
        threshold: float | str | Schedule = THRESHOLD,
        sigma: float | str | Schedule = SIGMA,
        eps: float = 1e-10,
    ) -> None:
        self.eps = eps
        self._init(params, {"gamma": gamma, "threshold": threshold, "sigma": sigma})

    def _check_values(self, values: dict[str, float]) -> None:
        super()._check_values(values)
        check_hyperparameters({k: v for k, v in values.items() if k == "sigma"})

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
    """Bop whose threshold is relative to the layer's own momentum (`--optimizer bop-normalized`):

        m <- (1 - γ) m + γ g
        w <- -w   iff   w · m > τ · mean(|m|)   (the mean over the whole kernel of the layer)

    What it normalises: Bop's τ is compared with m itself, so it carries the units of the
    layer's gradients, and a layer whose gradients are 100x smaller needs a 100x smaller τ to
    flip as often. Dividing by the layer's mean |m| makes τ a pure number (1-3 are sensible:
    flip the weights whose momentum is that many times stronger than the layer's average),
    so one τ suits every layer; scaling all of a layer's gradients by any c > 0 leaves its
    flips unchanged (tests/optim/test_bop_variants.py checks it).

    Reference: Algorithm 2 of Helwegen et al., "Latent Weights Do Not Exist" (NeurIPS 2019),
    with τ replaced by τ·mean|m|. The layer-mean form is bnnexport's own variant, not a
    published optimizer and with no published accuracy; the published way to make the test
    scale-free is `Bop2ndOrder`'s per-weight RMS (Suarez-Ramirez et al., "Bop and Beyond").
    """

    def _update(
        self, weight: torch.Tensor, grad: torch.Tensor, state: dict, group: dict
    ) -> torch.Tensor:
        score = _update_momentum(weight, grad, state, group["gamma"])
        return _flip(weight, score, group["threshold"] * state["momentum"].abs().mean())
