"""Hyperparameter schedules evaluated per optimizer step (for Bop's γ and τ, Adam's lr).

A schedule is a callable `step -> value` that serialises to a small dict, so optimizer state
and checkpoints stay loadable with `torch.load(weights_only=True)`.

Text form (CLI, recipes): ``1e-4`` (constant), ``step:1e-4,0.1,100`` (x0.1 every 100 steps;
the factor >= 0), ``linear:1e-4,1e-6,5000`` (linear from 1e-4 to 1e-6 over 5000 steps, then
constant), ``piecewise:4e-3,100,4e-4,110,4e-5`` (4e-3 until step 100, 4e-4 until step 110, then
4e-5: values and the steps where the next begins, alternating) and ``cosine:1e-2,50,1000``
(linear from 0 to 1e-2 over 50 warm-up steps, then a cosine decay from 1e-2 over 1000 steps,
larq-zoo's `CosineDecayWithWarmup`). Every schedule is monotone between its `turns()`, so
`first_step_outside` checks one whole, over a run's steps, from the ends of those stretches.

Example:
    >>> from bnnexport.optim.schedules import parse_schedule
    >>> s = parse_schedule("step:1e-4,0.1,100")
    >>> s(0), s(99), round(s(100), 12)
    (0.0001, 0.0001, 1e-05)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, step: int) -> float:
        return self.value

    def scaled(self, factor: float) -> Constant:
        return self

    def horizon(self) -> int:
        """The last step the schedule itself shapes (beyond it, see `first_step_outside`)."""
        return 0

    def turns(self) -> tuple[int, ...]:
        """The steps where the schedule may stop rising or falling (none: monotone)."""
        return ()


@dataclass(frozen=True)
class StepDecay:
    """`initial * factor ** (step // every)`."""

    initial: float
    factor: float
    every: int

    def __call__(self, step: int) -> float:
        return self.initial * self.factor ** (step // self.every)

    def scaled(self, factor: float) -> StepDecay:
        """`every` x factor rounded up: a run of factor x the steps never decays once more
        than the schedule over its own steps (rounded to the nearest, 77 steps for a 500-epoch
        recipe decaying every 100 epochs gave every 15 and a fifth decay below the floor)."""
        return StepDecay(self.initial, self.factor, max(1, math.ceil(self.every * factor - 1e-9)))

    def horizon(self) -> int:
        return self.every  # its first decay; how many more follow depends on the run

    def turns(self) -> tuple[int, ...]:
        return ()


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

    def horizon(self) -> int:
        return self.steps  # constant after

    def turns(self) -> tuple[int, ...]:
        return ()


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

    def horizon(self) -> int:
        return self.boundaries[-1] if self.boundaries else 0

    def turns(self) -> tuple[int, ...]:
        return self.boundaries  # constant between them


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

    def horizon(self) -> int:
        return self.warmup + self.steps  # 0 after

    def turns(self) -> tuple[int, ...]:
        return (self.warmup,)  # rises to the peak, then falls


# every form parse_schedule reads, for --help (counted in optimizer steps)
SCHEDULE_FORMS = (
    "a number or a schedule in optimizer steps: 'step:INITIAL,FACTOR,EVERY_STEPS', "
    "'linear:START,END,STEPS', 'piecewise:V0,STEP1,V1,...' or 'cosine:PEAK,WARMUP,STEPS'"
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
            every = int(float(values[2]))
            if every < 1 or not float(values[1]) >= 0:
                raise ValueError(f"cannot read schedule {text!r}: FACTOR must be >= 0 and "
                                 "EVERY_STEPS at least 1")  # fmt: skip
            return StepDecay(float(values[0]), float(values[1]), every)
        if kind == "linear" and len(values) == 3 and int(float(values[2])) >= 0:
            return LinearDecay(float(values[0]), float(values[1]), int(float(values[2])))
        if kind == "piecewise" and len(values) % 2 == 1:
            numbers = [float(v) for v in values]
            return Piecewise(tuple(numbers[0::2]), tuple(int(b) for b in numbers[1::2]))
        if kind == "cosine" and len(values) == 3:
            return CosineDecay(float(values[0]), int(float(values[1])), int(float(values[2])))
    except ValueError as error:
        if "EVERY_STEPS at least" in str(error):
            raise
    raise ValueError(f"cannot read schedule {text!r}: use {SCHEDULE_FORMS}")


def first_step_outside(
    schedule: Schedule, ok: Callable[[float], bool], steps: int | None = None, start: int = 0
) -> int | None:
    """The first optimizer step in [start, steps) whose value fails `ok`, or None when every
    value passes; `steps=None`: up to the schedule's own `horizon()` (a linear schedule's end,
    a step schedule's first decay), all that is known before a run's length is.

    Every schedule is monotone between its `turns()` (a step decay's factor is >= 0) and every
    range an interval, so a stretch in range at both ends is in range throughout, and the first
    step outside a stretch is found by bisection.

    Example:
        >>> first_step_outside(parse_schedule("linear:1e-2,0,10"), lambda g: 0 < g <= 1)
        10
        >>> first_step_outside(parse_schedule("step:0.5,3,100"), lambda g: g <= 1, steps=1000)
        100
        >>> first_step_outside(parse_schedule("step:1e-4,0.1,100"), lambda g: g > 0) is None
        True
        >>> first_step_outside(parse_schedule("piecewise:0.1,5,2,9,0.1"), lambda g: g <= 1)
        5
        >>> first_step_outside(parse_schedule("cosine:1e-2,50,1000"), lambda g: g > 0)
        0
    """
    last = max(start, schedule.horizon() if steps is None else steps - 1)
    ends = [t for t in schedule.turns() if start < t <= last] + [last + 1]
    low = start
    for end in ends:
        found = _first_outside_monotone(schedule, ok, low, end - 1)
        if found is not None:
            return found
        low = end
    return None


def _first_outside_monotone(
    schedule: Schedule, ok: Callable[[float], bool], low: int, high: int
) -> int | None:
    """`first_step_outside` over [low, high], where the schedule is monotone."""
    if not ok(schedule(low)):
        return low
    if ok(schedule(high)):
        return None
    inside, outside = low, high
    while outside - inside > 1:
        middle = (inside + outside) // 2
        inside, outside = (middle, outside) if ok(schedule(middle)) else (inside, middle)
    return outside


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    kind = next(k for k, cls in _KINDS.items() if isinstance(schedule, cls))
    return {"kind": kind, **asdict(schedule)}


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}")
    return _KINDS[kind](**data)
