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

Which parameters are binary kernels (`binary_kernels`): what `bnnexport.discover.
find_binary_kernels`, the one function every stage's record comes from, decides: the ones you
name (`binary=["conv.w", "layer*.w"]`, a predicate(name, param), or a record), else those
found by tracing one forward pass of `example_input` (default: an input of the model's recorded
shape; bnnexport's own layers are also found by type in a model of unknown input shape). Finding
none is an error, never a model trained by Adam alone. Bop refuses a kernel that is not
exactly ±1 (NotBinaryError) unless `init_sign=True`, which sets it to sign(w) with
sign(0) = +1 and warns that it did.

Defaults, the same in Python and for `bnnexport train`: γ = 1e-3, τ = 1e-6 and Adam's lr = 1e-3
(`GAMMA`, `THRESHOLD`, `LR`; measured on mnist5k). The paper's CIFAR-10 values (γ 1e-4, τ 1e-8,
lr 1e-2, 500 epochs) are in `bnnexport recipes`.

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> from bnnexport.optimizers import bop_with_adam
    >>> model = create_model("mnist-bnn")
    >>> optimizer = bop_with_adam(model)  # γ 1e-3, τ 1e-6, Adam lr 1e-3
    >>> model(torch.randn(4, 1, 28, 28)).sum().backward()
    >>> optimizer.step()
"""

from __future__ import annotations

import math
import warnings
from collections import ChainMap
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from bnnexport.discover import BinaryKernels, BinarySpec, find_binary_kernels
from bnnexport.errors import NotBinaryError
from bnnexport.layers import BinaryLayer, set_latent
from bnnexport.quantizers import binarize
from bnnexport.schedules import (
    Constant,
    Schedule,
    as_schedule,
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
        defaults = {key: schedule(0) for key, schedule in self.schedules.items()}
        self._check_values(defaults)
        return defaults

    def _check_values(self, values: dict[str, float]) -> None:
        """Raise ValueError for a value the optimizer cannot use (subclasses override)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        group = dict(param_group)
        steps = int(group.get("steps", 0))
        own = {
            key: as_schedule(group[key])
            for key in self.schedules
            if key in group and not isinstance(group[key], torch.Tensor)
        }
        values = {key: schedule(steps) for key, schedule in own.items()}
        self._check_values(values)
        group.update(values, schedules=own, steps=steps)
        super().add_param_group(group)  # type: ignore[misc]

    def set_schedule(self, key: str, value: float | str | Schedule) -> None:
        """Replace the optimizer-wide schedule `key`; groups with their own keep theirs."""
        self.schedules[key] = schedule = as_schedule(value)
        self._check_values({key: schedule(self.steps)})
        for group in self.param_groups:  # type: ignore[attr-defined]
            if key not in group["schedules"]:
                group[key] = schedule(group["steps"])

    def _apply_schedules(self) -> None:
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
                group[key] = schedule(group["steps"])

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


class Bop(_Scheduled, torch.optim.Optimizer):
    """Binary optimizer (Helwegen et al. 2019, Algorithm 2) for parameters that are exactly ±1.

    Per step t and parameter group, with that group's γ_t and τ_t:

        m <- (1 - γ_t) m + γ_t g        w <- -w  where  w · m > τ_t

    Args:
        params: the binary kernels (e.g. `bnnexport.binary_parameters(model)`), or parameter
            groups: dicts with "params" and optionally their own "gamma" and "threshold" (a
            number or a schedule), which override the arguments below for that group.
        gamma: adaptivity rate γ in (0, 1]; a number or a schedule (`bnnexport.schedules`),
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
        if "gamma" in values and not 0.0 < values["gamma"] <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {values['gamma']}")
        if "threshold" in values and values["threshold"] < 0.0:
            raise ValueError(f"threshold must be >= 0, got {values['threshold']}")

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
        if "lr" in values and not values["lr"] >= 0.0:
            raise ValueError(f"lr must be >= 0, got {values['lr']}")

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


Predicate = Callable[[str, nn.Parameter], bool]
Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class CaseOptimizer(torch.optim.Optimizer):
    """Give every parameter of a model to exactly one optimizer, chosen by predicate.

    Raises ValueError naming the parameter if one is claimed by two cases or by none: a silently
    untrained (or doubly trained) parameter is a bug, never a default.

    The composite is a `torch.optim.Optimizer` whose `param_groups` are its parts' groups (the
    same dicts, so a change reaches the part): torch's LR schedulers, `GradScaler` and step
    hooks wrap it as they wrap any optimizer. Bop's groups carry an `lr` of 0 that Bop never
    reads, so an LR scheduler changes Adam's lr and never Bop's γ. `state_dict()` is
    {case name: that optimizer's state dict}.

    Args:
        model: the model whose parameters are distributed.
        cases: (name, predicate(param_name, param), factory(params) -> optimizer); a case that
            claims no parameter creates no optimizer.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from bnnexport.layers import BinaryLinear
        >>> model = nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))
        >>> optimizer = bop_with_adam(model, gamma=1e-3, threshold=1e-6, lr=1e-2)
        >>> scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        >>> model(torch.randn(2, 4)).sum().backward()
        >>> optimizer.step(); scheduler.step()
        >>> optimizer.hyperparameters()
        {'bop.gamma': 0.001, 'bop.threshold': 1e-06, 'adam.lr': 0.005}
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
        # set by the functions that build one: {name: kernel} of the binary kernels
        self.binary_kernels: dict[str, nn.Parameter] = {}
        groups = [group for part in self.optimizers.values() for group in part.param_groups]
        super().__init__(groups, {})  # adds each part's group dicts themselves, not copies
        # one state for the whole: the parts' own states, looked up in turn
        self.state = ChainMap(*(part.state for part in self.optimizers.values()))  # type: ignore[assignment]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Before construction ends: a part's group. Later: a dict with a "case" key naming the
        part it goes to, e.g. {"case": "adam", "params": [...], "lr": 1e-3}."""
        if not hasattr(self, "optimizers") or any(param_group is g for g in self._part_groups()):
            super().add_param_group(param_group)
            return
        group = dict(param_group)
        case = group.pop("case", None)
        if case not in self.optimizers:
            raise ValueError(f"a new group needs 'case': one of {', '.join(self.optimizers)}")
        part = self.optimizers[case]
        part.add_param_group(group)
        super().add_param_group(part.param_groups[-1])

    def _part_groups(self) -> list[dict[str, Any]]:
        return [group for part in self.optimizers.values() for group in part.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers.values():
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def set_schedule(self, key: str, value: float | str | Schedule) -> None:
        """Replace the optimizer-wide `key` ("gamma", "threshold", "sigma", "lr") in every part
        that has it; groups that set their own keep theirs."""
        for optimizer in self.optimizers.values():
            if key in getattr(optimizer, "schedules", {}):
                optimizer.set_schedule(key, value)  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != set(self.optimizers):
            raise ValueError(
                f"optimizer state holds {sorted(state_dict)}, expected {sorted(self.optimizers)}"
            )
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state_dict[name])
        # torch's load_state_dict replaces a part's group dicts: share the new ones
        self.param_groups = self._part_groups()
        self.state = ChainMap(*(part.state for part in self.optimizers.values()))  # type: ignore[assignment]

    def hyperparameters(self) -> dict[str, float]:
        """Current value of every scheduled hyperparameter, e.g. {'bop.gamma': 1e-4, ...};
        groups after a part's first are named by index ('bop.1.gamma')."""
        values = {}
        for name, optimizer in self.optimizers.items():
            for index, group in enumerate(optimizer.param_groups):
                prefix = name if index == 0 else f"{name}.{index}"
                for key in getattr(optimizer, "schedules", {}):
                    values[f"{prefix}.{key}"] = float(group[key])
        return values


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


def binary_kernels(
    model: nn.Module,
    binary: BinarySpec | BinaryKernels | None = None,
    example_input: torch.Tensor | None = None,
) -> dict[str, nn.Parameter]:
    """{parameter name: parameter} of every binary kernel of `model`, the ones Bop trains.

    `binary` (names or globs, a predicate(name, param), or a `BinaryKernels` record) says which
    they are; else `example_input` (a batch the model accepts; default: one of the model's
    recorded input shape) finds them by tracing the model once (`bnnexport.discover`).

    Raises:
        ConfigError when none is found (one line saying how to name them).

    Example:
        >>> from torch import nn
        >>> from bnnexport.layers import BinaryLinear
        >>> list(binary_kernels(nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))))
        ['0.weight']
        >>> list(binary_kernels(nn.Linear(4, 2), binary=["weight"]))
        ['weight']
    """
    if isinstance(binary, BinaryKernels):
        return binary.require_in(model, type(model).__name__).select(model)
    return find_binary_kernels(model, example_input, binary).select(model)


@torch.no_grad()
def set_to_sign(kernels: dict[str, torch.Tensor]) -> list[str]:
    """Set every kernel that is not ±1 to sign(w) with sign(0) = +1; returns their names."""
    changed = [name for name, k in kernels.items() if bool((k.abs() != 1).any())]
    for name in changed:
        kernel = kernels[name]
        kernel.copy_(torch.where(kernel >= 0, 1.0, -1.0).to(kernel.dtype))
    if changed:
        warnings.warn(
            f"init_sign: set {len(changed)} binary kernel(s) to sign(w), ties to +1: "
            + ", ".join(changed),
            stacklevel=5,  # the caller of bop_with_adam (torch.no_grad adds a frame)
        )
    return changed


def latent_adam(
    model: nn.Module,
    lr: float | str | Schedule = LR,
    *,
    binary: BinarySpec | None = None,
    example_input: torch.Tensor | None = None,
) -> CaseOptimizer:
    """The latent-weight baseline: switches bnnexport's layers to latent mode, Adam on
    everything, the binary kernels' latent weights clipped to [-1, 1] after every step.

    A model of your own must binarize its kernels in its forward pass (an STE) itself; its
    kernels are found as for `bop_with_adam` (`binary_kernels`).
    """
    set_latent(model, True)
    kernels = binary_kernels(model, binary, example_input)
    ids = {id(p) for p in kernels.values()}
    optimizer = CaseOptimizer(
        model,
        [
            (
                "latent",
                lambda _, p: id(p) in ids,
                lambda ps: ScheduledAdam(ps, lr, clip_value=1.0),
            ),
            ("adam", lambda _, p: id(p) not in ids, lambda ps: ScheduledAdam(ps, lr)),
        ],
    )
    optimizer.binary_kernels = kernels
    return optimizer


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
        sigma: float | str | Schedule = 1e-2,
        eps: float = 1e-10,
    ) -> None:
        self.eps = eps
        self._init(params, {"gamma": gamma, "threshold": threshold, "sigma": sigma})

    def _check_values(self, values: dict[str, float]) -> None:
        super()._check_values(values)
        if "sigma" in values and not 0.0 < values["sigma"] <= 1.0:
            raise ValueError(f"sigma must be in (0, 1], got {values['sigma']}")

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
    flips unchanged (tests/training/test_bop_variants.py checks it).

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


def _binary_optimizer_with_adam(
    model: nn.Module,
    lr: float | str | Schedule,
    make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
    groups: list[dict[str, Any]] | None,
    options: dict[str, Any],
) -> CaseOptimizer:
    """Binary kernels to `make(param_groups)`, everything else to Adam.

    `groups`: Bop parameter groups of their own (dicts with "params" and any of the variant's
    hyperparameters); the binary kernels they do not name form one last group that follows
    the optimizer-wide settings. `options`: binary, example_input, init_sign (`bop_with_adam`).
    """
    kernels = binary_kernels(model, options.get("binary"), options.get("example_input"))
    if options.get("init_sign"):
        set_to_sign(kernels)
    require_plus_minus_one(kernels)
    binary = {id(p) for p in kernels.values()}
    groups = [dict(g) for g in groups or []]
    grouped: set[int] = set()
    for group in groups:
        group["params"] = list(group["params"])
        for param in group["params"]:
            if id(param) not in binary:
                raise ValueError("a Bop parameter group holds a parameter that is not binary")
            if id(param) in grouped:
                raise ValueError("a parameter is in two Bop parameter groups")
            grouped.add(id(param))

    def make_groups(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        rest = [p for p in params if id(p) not in grouped]
        return make([*groups, {"params": rest}] if rest else groups)

    optimizer = CaseOptimizer(
        model,
        [
            ("bop", lambda _, p: id(p) in binary, make_groups),
            ("adam", lambda _, p: id(p) not in binary, lambda ps: ScheduledAdam(ps, lr)),
        ],
    )
    optimizer.binary_kernels = kernels
    return optimizer


def bop_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = GAMMA,
    threshold: float | str | Schedule = THRESHOLD,
    lr: float | str | Schedule = LR,
    groups: list[dict[str, Any]] | None = None,
    *,
    binary: BinarySpec | None = None,
    example_input: torch.Tensor | None = None,
    init_sign: bool = False,
) -> CaseOptimizer:
    """Bop for the binary kernels, Adam for every real-valued parameter (the paper's setup).

    Defaults: γ = 1e-3, τ = 1e-6, Adam lr = 1e-3, as `bnnexport train`'s. Which parameters are
    binary kernels: see `binary_kernels` (`binary=` names or a predicate, or `example_input` to
    find them in a model of your own; bnnexport's own layers are found without either). Every
    kernel must be exactly ±1 (NotBinaryError otherwise) unless `init_sign=True`, which sets it
    to sign(w), ties to +1, and warns naming it. After construction, `.binary_kernels` maps
    each kernel's name to the parameter.

    `groups` gives some kernels their own γ / τ, e.g.
    `[{"params": [model.features[2].weight], "gamma": 1e-2}]`; the rest follow `gamma` and
    `threshold`.

    Example (a model of your own, its kernel used as it is and set to ±1 first):
        >>> import torch, torch.nn.functional as F
        >>> from torch import nn
        >>> class Net(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = nn.Parameter(torch.randn(10, 16))
        ...     def forward(self, x):
        ...         return F.linear(torch.where(x >= 0, 1.0, -1.0), self.w)
        >>> net = Net()
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     optimizer = bop_with_adam(net, example_input=torch.randn(1, 16), init_sign=True)
        >>> list(optimizer.binary_kernels), str(said[0].message)
        (['w'], 'init_sign: set 1 binary kernel(s) to sign(w), ties to +1: w')
    """
    options = {"binary": binary, "example_input": example_input, "init_sign": init_sign}
    return _binary_optimizer_with_adam(
        model, lr, lambda ps: Bop(ps, gamma, threshold), groups, options
    )


def bop2_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = GAMMA,
    threshold: float | str | Schedule = THRESHOLD,
    lr: float | str | Schedule = LR,
    sigma: float | str | Schedule = 1e-2,
    groups: list[dict[str, Any]] | None = None,
    **options: Any,
) -> CaseOptimizer:
    """`Bop2ndOrder` for the binary kernels, Adam for every real-valued parameter; `options`
    (binary, example_input, init_sign) as for `bop_with_adam`."""
    return _binary_optimizer_with_adam(
        model, lr, lambda ps: Bop2ndOrder(ps, gamma, threshold, sigma), groups, options
    )


def bop_normalized_with_adam(
    model: nn.Module,
    gamma: float | str | Schedule = GAMMA,
    threshold: float | str | Schedule = 1.0,
    lr: float | str | Schedule = LR,
    groups: list[dict[str, Any]] | None = None,
    **options: Any,
) -> CaseOptimizer:
    """`BopNormalized` (τ relative to each layer's mean |m|) for the binary kernels, Adam for
    every real-valued parameter; `options` as for `bop_with_adam`."""
    return _binary_optimizer_with_adam(
        model, lr, lambda ps: BopNormalized(ps, gamma, threshold), groups, options
    )


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
