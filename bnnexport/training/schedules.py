"""Hyperparameter schedules evaluated per optimizer step (for Bop's γ and τ, Adam's lr).

A schedule is a callable `step -> value` that serialises to a small dict, so optimizer state
and checkpoints stay loadable with `torch.load(weights_only=True)`.

Text form (CLI, recipes): ``1e-4`` (constant), ``step:1e-4,0.1,100`` (x0.1 every 100 steps),
``linear:1e-4,1e-6,5000`` (linear from 1e-4 to 1e-6 over 5000 steps, then constant),
``piecewise:4e-3,100,4e-4,110,4e-5`` (4e-3 until step 100, 4e-4 until step 110, then 4e-5:
values and the steps where the next begins, alternating) and ``cosine:1e-2,50,1000`` (linear
from 0 to 1e-2 over 50 warm-up steps, then a cosine decay from 1e-2 over 1000 steps, larq-zoo's
`CosineDecayWithWarmup`).

Example:
    >>> from bnnexport.training.schedules import parse_schedule
    >>> s = parse_schedule("step:1e-4,0.1,100")
    >>> s(0), s(99), round(s(100), 12)
    (0.0001, 0.0001, 1e-05)
    >>> p = parse_schedule("piecewise:4e-3,100,4e-4,110,4e-5")
    >>> p(99), p(100), p(110)
    (0.004, 0.0004, 4e-05)
    >>> c = parse_schedule("cosine:1e-2,50,1000")
    >>> c(25), c(50), round(c(550), 12)
    (0.005, 0.01, 0.005)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, step: int) -> float:
        return self.value

    def scaled(self, factor: float) -> Constant:
        return self


@dataclass(frozen=True)
class StepDecay:
    """`initial * factor ** (step // every)`."""

    initial: float
    factor: float
    every: int

    def __call__(self, step: int) -> float:
        return self.initial * self.factor ** (step // self.every)

    def scaled(self, factor: float) -> StepDecay:
        return StepDecay(self.initial, self.factor, max(1, round(self.every * factor)))


@dataclass(frozen=True)
class LinearDecay:
    """Linear from `start` (step 0) to `end` (step `steps`), constant after."""

    start: float
    end: float
    steps: int

    def __call__(self, step: int) -> float:
        fraction = min(max(step / max(self.steps, 1), 0.0), 1.0)
        return self.start + (self.end - self.start) * fraction

    def scaled(self, factor: float) -> LinearDecay:
        return LinearDecay(self.start, self.end, max(1, round(self.steps * factor)))


@dataclass(frozen=True)
class Piecewise:
    """`values[0]` before `boundaries[0]`, `values[i]` from `boundaries[i - 1]` on."""

    values: tuple[float, ...]
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        # a schedule read back from JSON has lists; sorted boundaries are what bisect needs
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        object.__setattr__(self, "boundaries", tuple(int(b) for b in self.boundaries))
        if len(self.values) != len(self.boundaries) + 1 or list(self.boundaries) != sorted(
            self.boundaries
        ):
            raise ValueError("piecewise: one more value than boundaries, boundaries increasing")

    def __call__(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, step)]

    def scaled(self, factor: float) -> Piecewise:
        return Piecewise(self.values, tuple(max(1, round(b * factor)) for b in self.boundaries))


@dataclass(frozen=True)
class CosineDecay:
    """Linear from 0 to `peak` over `warmup` steps, then `peak` * (1 + cos(pi t / steps)) / 2
    with t the steps since the warm-up (0 from t = `steps` on)."""

    peak: float
    warmup: int
    steps: int

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.peak * step / self.warmup
        t = min(step - self.warmup, self.steps) / max(self.steps, 1)
        return self.peak * 0.5 * (1.0 + math.cos(math.pi * t))

    def scaled(self, factor: float) -> CosineDecay:
        return CosineDecay(
            self.peak, round(self.warmup * factor), max(1, round(self.steps * factor))
        )


Schedule = Constant | StepDecay | LinearDecay | Piecewise | CosineDecay
_KINDS: dict[str, type] = {
    "constant": Constant, "step": StepDecay, "linear": LinearDecay, "piecewise": Piecewise,
    "cosine": CosineDecay,
}  # fmt: skip


def as_schedule(value: float | str | dict[str, Any] | Schedule) -> Schedule:
    """Accept a number, the text form, a `to_dict` dict or a schedule."""
    if isinstance(value, (Constant, StepDecay, LinearDecay, Piecewise, CosineDecay)):
        return value
    if isinstance(value, dict):
        return schedule_from_dict(value)
    if isinstance(value, str):
        return parse_schedule(value)
    return Constant(float(value))


def parse_schedule(text: str) -> Schedule:
    """Parse the text form (see module docstring); ValueError with the accepted forms otherwise."""
    text = text.strip()
    try:
        if ":" not in text:
            return Constant(float(text))
        kind, _, args = text.partition(":")
        values = [v.strip() for v in args.split(",")]
        if kind == "step" and len(values) == 3:
            return StepDecay(float(values[0]), float(values[1]), int(float(values[2])))
        if kind == "linear" and len(values) == 3:
            return LinearDecay(float(values[0]), float(values[1]), int(float(values[2])))
        if kind == "piecewise" and len(values) % 2 == 1:
            numbers = [float(v) for v in values]
            return Piecewise(tuple(numbers[0::2]), tuple(int(b) for b in numbers[1::2]))
        if kind == "cosine" and len(values) == 3:
            return CosineDecay(float(values[0]), int(float(values[1])), int(float(values[2])))
    except ValueError:
        pass
    raise ValueError(
        f"cannot read schedule {text!r}: use a number, 'step:INITIAL,FACTOR,EVERY_STEPS', "
        "'linear:START,END,STEPS', 'piecewise:V0,STEP1,V1,...' or 'cosine:PEAK,WARMUP,STEPS'"
    )


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    kind = next(k for k, cls in _KINDS.items() if isinstance(schedule, cls))
    return {"kind": kind, **asdict(schedule)}


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}")
    return _KINDS[kind](**data)
