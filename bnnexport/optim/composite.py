"""The composite optimizer: Bop for a model's binary kernels, Adam for everything real-valued.

`CaseOptimizer` gives each parameter to exactly one optimizer, the role of larq's
CaseOptimizer; `bop_with_adam` (and its variants) build one for a model, `latent_adam` is the
latent-weight baseline: Adam on real weights that the layers binarize in the forward pass
(STE), clipped to [-1, 1]. `OPTIMIZERS` registers each by name (`register_optimizer`) with the
hyperparameters it takes (`Hyperparameter`): what `bnnexport train` offers and TrainConfig,
the trainer, resume, sweep and compare read.

Which parameters are binary kernels (`binary_kernels`): what `bnnexport.nn.discover.
find_binary_kernels`, the one function every stage's record comes from, decides: the ones you
name (`binary=["conv.w", "layer*.w"]`, a predicate(name, param), or a record), else those
found by tracing one forward pass of `example_input` (default: an input of the model's recorded
shape; bnnexport's own layers are also found by type in a model of unknown input shape). Finding
none is an error, never a model trained by Adam alone. Bop refuses a kernel that is not
exactly ±1 (NotBinaryError) unless `init_sign=True`, which sets it to sign(w) with
sign(0) = +1 and warns that it did.

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> model = create_model("mnist-bnn")
    >>> optimizer = bop_with_adam(model)  # γ 1e-3, τ 1e-6, Adam lr 1e-3
    >>> model(torch.randn(4, 1, 28, 28)).sum().backward()
    >>> optimizer.step()
"""

from __future__ import annotations

import warnings
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bnnexport.nn.discover import BinaryKernels, BinarySpec, find_binary_kernels
from bnnexport.nn.layers import set_latent
from bnnexport.optim.bop import (
    GAMMA,
    HYPERPARAMETER_RULES,
    LR,
    SIGMA,
    THRESHOLD,
    Bop,
    Bop2ndOrder,
    BopNormalized,
    ScheduledAdam,
    require_plus_minus_one,
)
from bnnexport.optim.schedules import SCHEDULE_FORMS, Schedule

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
        >>> from bnnexport.nn.layers import BinaryLinear
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
        self._share_adam_settings()

    def _share_adam_settings(self) -> None:
        """Adam's lr and betas as the composite's `defaults`, and betas on every group: torch's
        schedulers read them there, and OneCycleLR (cycle_momentum, its default) cycles β1 of
        every group. Bop's groups get Adam's betas as they carry an lr, never read; γ and τ are
        the only settings Bop follows."""
        adam = next((p for p in self.optimizers.values() if "betas" in p.defaults), None)
        if adam is None:
            return
        self.defaults = {"lr": adam.defaults["lr"], "betas": adam.defaults["betas"]}
        for group in self.param_groups:
            group.setdefault("betas", adam.defaults["betas"])

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
        if "betas" in self.defaults:
            part.param_groups[-1].setdefault("betas", self.defaults["betas"])
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
        self._share_adam_settings()

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


def binary_kernels(
    model: nn.Module,
    binary: BinarySpec | BinaryKernels | None = None,
    example_input: torch.Tensor | None = None,
) -> dict[str, nn.Parameter]:
    """{parameter name: parameter} of every binary kernel of `model`, the ones Bop trains.

    `binary` (names or globs, a predicate(name, param), or a `BinaryKernels` record) says which
    they are; else `example_input` (a batch the model accepts; default: one of the model's
    recorded input shape) finds them by tracing the model once (`bnnexport.nn.discover`).

    Raises:
        ConfigError when none is found (one line saying how to name them).

    Example:
        >>> from torch import nn
        >>> from bnnexport.nn.layers import BinaryLinear
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
    sigma: float | str | Schedule = SIGMA,
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


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter of an optimizer, declared once: `bnnexport train --NAME` (its help
    and default), config.json's key NAME, the range every value must stay in (`ok`, `rule`),
    whether it may follow a schedule, and its symbol in `bnnexport compare`'s labels.

    `what` names it in a refusal ("--sigma is bop2's second-moment rate; --optimizer bop has
    none"); `refused_elsewhere=False` lets it be given to an optimizer without it, unused."""

    name: str
    symbol: str
    default: float
    help: str
    what: str
    ok: Callable[[float], bool]
    rule: str
    schedulable: bool = True
    refused_elsewhere: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class OptimizerEntry:
    """A registered optimizer (`--optimizer NAME`): its factory(model, **hyperparameters,
    binary=, init_sign=) -> CaseOptimizer, the hyperparameters it takes (in this order in
    --help and compare's table), those a label shows, one line for --help, and whether it
    trains latent real weights through the STE (its factory takes no `init_sign`) rather than
    flipping signs. Calling the entry calls the factory."""

    name: str
    factory: Callable[..., CaseOptimizer]
    hyperparameters: tuple[Hyperparameter, ...]
    labelled: tuple[str, ...]
    summary: str
    latent: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hyperparameters)

    def __call__(self, model: nn.Module, *args: Any, **kwargs: Any) -> CaseOptimizer:
        return self.factory(model, *args, **kwargs)

    def build(
        self, model: nn.Module, values: dict[str, Any], kernels: Any, init_sign: bool
    ) -> CaseOptimizer:
        """The optimizer over `kernels` (a record, `binary=`) with `values` {name: value}."""
        options = {"binary": kernels}
        if not self.latent:
            options["init_sign"] = init_sign
        return self.factory(model, **values, **options)


# every registered optimizer by name, in registration order (`register_optimizer`)
OPTIMIZERS: dict[str, OptimizerEntry] = {}


def register_optimizer(entry: OptimizerEntry) -> OptimizerEntry:
    """Add `entry` to OPTIMIZERS: `bnnexport train`, `sweep`, `compare`, the trainer and
    TrainConfig read its name and hyperparameters from there. ValueError for a name taken
    already, and for a hyperparameter declared otherwise by another optimizer (config.json
    holds one key per name)."""
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimizer {entry.name!r} is registered already")
    known = all_hyperparameters()
    for hyperparameter in entry.hyperparameters:
        if known.get(hyperparameter.name, hyperparameter) != hyperparameter:
            raise ValueError(f"{entry.name}: hyperparameter {hyperparameter.name!r} is declared "
                             "otherwise by another optimizer")  # fmt: skip
    unknown = set(entry.labelled) - set(entry.names)
    if unknown:
        raise ValueError(f"{entry.name}: labels name no hyperparameter of it: {sorted(unknown)}")
    OPTIMIZERS[entry.name] = entry
    return entry


def all_hyperparameters() -> dict[str, Hyperparameter]:
    """Every registered optimizer's hyperparameters by name, in one order that keeps each
    optimizer's own (bop's γ, τ, lr and bop2's γ, τ, σ, lr give γ, τ, σ, lr).

    Example:
        >>> list(all_hyperparameters())
        ['gamma', 'threshold', 'sigma', 'lr']
    """
    order: list[str] = []
    found: dict[str, Hyperparameter] = {}
    for entry in OPTIMIZERS.values():
        names = entry.names
        for index, hyperparameter in enumerate(entry.hyperparameters):
            if hyperparameter.name in found:
                continue
            found[hyperparameter.name] = hyperparameter
            after = next((n for n in names[index + 1 :] if n in order), None)
            order.insert(order.index(after) if after else len(order), hyperparameter.name)
    return {name: found[name] for name in order}


def _declared(name: str, symbol: str, default: float, help: str, what: str, **kw: Any):
    ok, rule = HYPERPARAMETER_RULES[name]
    return Hyperparameter(name, symbol, default, help, what, ok, rule, **kw)


GAMMA_OPTION = _declared(
    "gamma", "γ", GAMMA, f"Bop adaptivity rate γ in (0, 1]: {SCHEDULE_FORMS}.",
    "adaptivity rate",
    refused_elsewhere=False,  # the latent baseline records γ and τ too (recipes set them)
)  # fmt: skip
THRESHOLD_OPTION = _declared(
    "threshold", "τ", THRESHOLD, f"Bop flip threshold τ >= 0 (finite): {SCHEDULE_FORMS}.",
    "flip threshold",
    refused_elsewhere=False,
)  # fmt: skip
LR_OPTION = _declared(
    "lr", "lr", LR,
    "Adam learning rate >= 0 for real-valued parameters (and latent weights with "
    f"adam-latent): {SCHEDULE_FORMS}.",
    "learning rate",
)  # fmt: skip
SIGMA_OPTION = _declared(
    "sigma", "σ", SIGMA,
    "bop2's second-moment rate σ in (0, 1]: v <- v + σ(g² - v); a number or a schedule. "
    "Refused with any other optimizer.",
    "second-moment rate",
)  # fmt: skip

BOP = (GAMMA_OPTION, THRESHOLD_OPTION, LR_OPTION)
BOP2 = (GAMMA_OPTION, THRESHOLD_OPTION, SIGMA_OPTION, LR_OPTION)
for _entry in (
    OptimizerEntry("bop", bop_with_adam, BOP, ("gamma", "threshold"),
                   "Bop on binary kernels + Adam on real parameters"),
    OptimizerEntry("adam-latent", latent_adam, (LR_OPTION,), ("lr",),
                   "Adam on real latent weights binarized with the STE (the baseline; binary "
                   "kernels start Glorot-uniform, a model of your own's too)", latent=True),
    OptimizerEntry("bop2", bop2_with_adam, BOP2, ("gamma", "threshold", "sigma"),
                   "Bop with a second-moment estimate v: flips where w·m / (sqrt(v) + ε) > τ"),
    OptimizerEntry("bop-normalized", bop_normalized_with_adam, BOP, ("gamma", "threshold"),
                   "Bop with τ relative to each layer's mean |m|"),
):  # fmt: skip
    register_optimizer(_entry)
