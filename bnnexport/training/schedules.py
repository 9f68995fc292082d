"""Hyperparameter schedules evaluated per optimizer step (for Bop's γ and τ, Adam's lr).

A schedule is a callable `step -> value` that serialises to a small dict, so optimizer state
and checkpoints stay loadable with `torch.load(weights_only=True)`.

Text form (CLI, recipes): ``1e-4`` (constant), ``step:1e-4,0.1,100`` (x0.1 every 100 steps;
the factor >= 0), ``linear:1e-4,1e-6,5000`` (linear from 1e-4 to 1e-6 over 5000 steps, then
constant). Every schedule is monotone, so `first_step_outside` checks one whole, over a run's
steps, from its two ends.

Example:
    >>> from bnnexport.training.schedules import parse_schedule
    >>> s = parse_schedule("step:1e-4,0.1,100")
    >>> s(0), s(99), round(s(100), 12)
    (0.0001, 0.0001, 1e-05)
"""

from __future__ import annotations

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

    def horizon(self) -> int:
        return self.every  # its first decay; how many more follow depends on the run


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


Schedule = Constant | StepDecay | LinearDecay
_KINDS: dict[str, type] = {"constant": Constant, "step": StepDecay, "linear": LinearDecay}


def as_schedule(value: float | str | dict[str, Any] | Schedule) -> Schedule:
    """Accept a number, the text form, a `to_dict` dict or a schedule."""
    if isinstance(value, (Constant, StepDecay, LinearDecay)):
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
    except ValueError as error:
        if "EVERY_STEPS at least" in str(error):
            raise
    raise ValueError(
        f"cannot read schedule {text!r}: use a number, 'step:INITIAL,FACTOR,EVERY_STEPS' "
        "or 'linear:START,END,STEPS'"
    )


def first_step_outside(
    schedule: Schedule, ok: Callable[[float], bool], steps: int | None = None, start: int = 0
) -> int | None:
    """The first optimizer step in [start, steps) whose value fails `ok`, or None when every
    value passes; `steps=None`: up to the schedule's own `horizon()` (a linear schedule's end,
    a step schedule's first decay), all that is known before a run's length is.

    Every schedule is monotone (a step decay's factor is >= 0) and every range an interval, so
    a schedule in range at both ends is in range throughout, and the first step outside is
    found by bisection.

    Example:
        >>> first_step_outside(parse_schedule("linear:1e-2,0,10"), lambda g: 0 < g <= 1)
        10
        >>> first_step_outside(parse_schedule("step:0.5,3,100"), lambda g: g <= 1, steps=1000)
        100
        >>> first_step_outside(parse_schedule("step:1e-4,0.1,100"), lambda g: g > 0) is None
        True
    """
    last = max(start, schedule.horizon() if steps is None else steps - 1)
    if not ok(schedule(start)):
        return start
    if ok(schedule(last)):
        return None
    inside, outside = start, last
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
