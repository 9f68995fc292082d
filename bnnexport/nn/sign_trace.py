"""The activation binarizations of any `nn.Module`, found in one forward pass, read and imposed.

A model of your own binarizes in its own code: `torch.sign`, `torch.where(x >= 0, 1, -1)`, an
`autograd.Function` STE, the detach trick `sign(x).detach() - p(x).detach() + p(x)`,
`(x >= 0).float() * 2 - 1`, bitorch's `where(sign(x) == 0, 1, sign(x))`. Each starts at a
**sign origin**: a call of the sign family (`sign`, `sgn`) or a comparison with zero
(`ge`/`gt`/`le`/`lt`, `>=`, ...) on a float tensor `x` computed from the input, `x` not itself
two-valued. Whatever follows (a `where`, casts, `* 2 - 1`, the detach trick's arithmetic, a
one-padding, a flatten) computes from the origin's output alone, so imposing signs `s` on the
binarization means calling every origin of `x` with `s` in place of `x`: `sign(s) = s`,
`(s >= 0)` holds where `s = +1`. The rest of the model (a float shortcut reading `x` too) keeps
the real `x`.

`trace_binarizations` runs one forward pass under a `TorchFunctionMode` that sees every call.
It keeps, per tensor computed from the input, the call that made it and that call's inputs. A
**binarized layer input** is the data operand of a conv, linear or matmul call that is ±1
(zeros only in whole border rows or columns: a zero padding), as discovery judges it
(`bnnexport.nn.discover`). From each one it walks back through the calls that made it, along
inputs that are two-valued (bool, or one magnitude: {0, 1}, ±1, ±a) or computed elementwise
from such a tensor (`s - p` of the detach trick, `s + 0.1` of sign(sign(x) + 0.1)), to the sign
origins it comes from: their `x` is the binarization's **source**. Sources are listed in the
order of their first origin call, the order the exporter writes the binarization nodes in.

The calls a forward pass makes are the same on every input of one shape (a model without
data-dependent control flow), so a later pass finds each origin again as the n-th call of its
function (`SignReplay`; calls of other functions in between, a hook's included, cannot shift
it); a pass whose origin reads a tensor of another shape is refused, never matched up by
guess.

Example:
    >>> import torch
    >>> from torch import nn
    >>> import torch.nn.functional as F
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.stem = nn.Conv2d(1, 4, 3)
    ...         self.w = nn.Parameter(torch.ones(2, 4, 3, 3))
    ...     def forward(self, x):
    ...         y = self.stem(x)
    ...         return F.conv2d(torch.where(y >= 0, 1.0, -1.0), self.w).mean((2, 3))
    >>> traced = trace_binarizations(Net(), torch.randn(1, 1, 8, 8))
    >>> [[o.function for o in origins] for origins in traced.origins], traced.shapes
    ([['ge']], [(4, 6, 6)])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from bnnexport.errors import FidelityError

SIGN_FUNCTIONS = {torch.sign, torch.Tensor.sign, torch.sgn, torch.Tensor.sgn}
COMPARISONS = {
    torch.ge, torch.gt, torch.le, torch.lt, torch.greater_equal, torch.greater,
    torch.less_equal, torch.less, torch.Tensor.ge, torch.Tensor.gt, torch.Tensor.le,
    torch.Tensor.lt, torch.Tensor.__ge__, torch.Tensor.__gt__, torch.Tensor.__le__,
    torch.Tensor.__lt__,
}  # fmt: skip
# calls whose first operand is a layer's data input (the weight is a parameter's)
LAYERS = {
    torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
    torch.conv_transpose3d, F.linear, torch.matmul, torch.Tensor.matmul,
    torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
}  # fmt: skip
# clamps that keep every sign (bounds lo < 0 < hi): a binarization of clamp(x) is one of x, as
# the normaliser rewrites it (`clamp-sign`), so its source is read before the clamp
CLAMPS = {torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip, F.hardtanh}
ROUNDING = 1e-6  # relative: how far a two-valued tensor's magnitudes may spread (detach trick)


@dataclass(frozen=True)
class SignOrigin:
    """One call that starts a binarization: the `nth` call (from 0) of `function` in the
    forward pass, `operand` the position of its operand among its arguments; `read`: the clamp
    call (function, nth) whose input is the source, when the operand is a clamp's output."""

    function: str
    nth: int
    operand: int
    read: tuple[str, int] | None = None


@dataclass
class TracedBinarizations:
    """What one traced forward pass showed: per binarization source (forward order) its origin
    calls and its shape (without the batch), and the binarized layer inputs no origin was found
    for (`unresolved`, by the layer call's name)."""

    origins: list[list[SignOrigin]] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


def trace_binarizations(model: nn.Module, sample: torch.Tensor) -> TracedBinarizations:
    """The activation binarizations of `model` on `sample` (a batch of one), see module doc.
    The model runs in eval mode without gradients; it is not changed."""
    tracer = _Tracer(sample)
    with torch.no_grad(), tracer:
        model.eval()(sample)
    return tracer.result()


def _name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


class _Counter:
    """How many calls of each origin function a pass has made: an origin is found again by
    (function, how many calls of it came before), which calls the model makes in between, or a
    hook run inside the pass (the int8 probe's), cannot shift."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def key(self, func: Any) -> tuple[str, int] | None:
        if func not in SIGN_FUNCTIONS and func not in COMPARISONS and func not in CLAMPS:
            return None
        name = _name(func)
        nth = self.seen.get(name, 0)
        self.seen[name] = nth + 1
        return name, nth


def _keeps_signs(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a clamp call's bounds keep every sign (lo < 0 < hi)."""
    if func is F.hardtanh:
        lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
        hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
    else:
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    bounds = [float(v) for v in (lo, hi) if isinstance(v, (int, float))]
    return len(bounds) == 2 and bounds[0] < 0 < bounds[1]


def _mutated(func: Any, args: tuple, output: Any) -> torch.Tensor | None:
    """The tensor an in-place call wrote (`out[mask] = 1`, `x.add_(y)`), else None."""
    first = args[0] if args else None
    if not isinstance(first, torch.Tensor):
        return None
    if _name(func) == "__setitem__" or (_name(func).endswith("_") and output is first):
        return first
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a call's arguments or result (tuples, lists and dicts opened)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def two_valued(t: torch.Tensor) -> bool:
    """Bool, or a float tensor whose non-zero values share one magnitude (up to `ROUNDING`)."""
    if t.dtype == torch.bool:
        return True
    if not t.is_floating_point() or t.numel() == 0:
        return False
    magnitudes = t.detach().abs().reshape(-1)
    nonzero = magnitudes[magnitudes != 0]
    if nonzero.numel() == 0:
        return True
    first = nonzero[0]
    return bool(((nonzero - first).abs() <= ROUNDING * first).all())


def _is_zero(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return bool(value.reshape(()) == 0)
    return False


@dataclass
class _Made:
    """How a tensor computed from the input was made: that call's inputs computed from the
    input; whether it is two-valued; the id of its source when it is a sign origin's output;
    whether it is computed elementwise from a two-valued or derived tensor (`derived`)."""

    inputs: list[torch.Tensor]
    two_valued: bool
    origin: int | None = None
    derived: bool = False
    clamp: tuple[tuple[str, int], torch.Tensor] | None = None  # a sign-keeping clamp's input


class _Tracer(TorchFunctionMode):
    """Records the forward pass for `trace_binarizations`."""

    def __init__(self, sample: torch.Tensor) -> None:
        super().__init__()
        self.made: dict[int, _Made] = {}
        self.keep: list[torch.Tensor] = [sample]  # ids stay unique while the pass runs
        self.data = {id(sample)}
        self.sources: dict[int, torch.Tensor] = {}  # source id -> tensor, first origin order
        self.origins: dict[int, list[SignOrigin]] = {}
        self.layer_inputs: list[tuple[str, torch.Tensor]] = []
        self.counter = _Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        key = self.counter.key(func)
        output = func(*args, **kwargs)
        inputs = [t for t in _tensors((args, kwargs)) if id(t) in self.data]
        if not inputs:
            return output
        origin = self._origin(func, args, key) if key is not None else None
        mutated = _mutated(func, args, output)
        for out in [mutated] if mutated is not None else list(_tensors(output)):
            self._record(func, out, inputs, origin)
        if func in CLAMPS and isinstance(output, torch.Tensor) and _keeps_signs(func, args, kwargs):
            self.made[id(output)].clamp = (key, args[0])
        if func in LAYERS and isinstance(args[0], torch.Tensor) and id(args[0]) in self.data:
            self.layer_inputs.append((f"{_name(func)} #{len(self.layer_inputs) + 1}", args[0]))
        return output

    def _record(
        self, func: Any, out: torch.Tensor, inputs: list[torch.Tensor], origin: int | None
    ) -> None:
        """How `out` was made; an in-place write adds to what made the tensor before."""
        before = self.made.get(id(out))
        inputs = [t for t in inputs if t is not out] + (before.inputs if before else [])
        self.keep.append(out)
        self.data.add(id(out))
        derived = func not in LAYERS and any(
            self._two_valued_or_derived(t) for t in inputs if t.numel() == out.numel()
        )
        self.made[id(out)] = _Made(inputs, two_valued(out), origin, derived and origin is None)

    def _two_valued_or_derived(self, t: torch.Tensor) -> bool:
        made = self.made.get(id(t))
        if made is None:  # the input itself
            return two_valued(t)
        return made.two_valued or made.derived

    def _origin(self, func: Any, args: tuple, key: tuple[str, int]) -> int | None:
        """The id of the source when this call is a sign origin (module doc), else None."""
        if func in SIGN_FUNCTIONS:
            operand = 0
        elif func in COMPARISONS and len(args) == 2:
            operand = 0 if _is_zero(args[1]) else 1 if _is_zero(args[0]) else None
        else:
            return None
        x = args[operand] if operand is not None else None
        if not isinstance(x, torch.Tensor) or id(x) not in self.data:
            return None
        if not x.is_floating_point() or self._two_valued_or_derived(x):
            return None  # a binarized tensor binarized again: the same binarization
        read, made = None, self.made.get(id(x))
        if made is not None and made.clamp is not None:
            read, x = made.clamp
        self.sources.setdefault(id(x), x)
        self.origins.setdefault(id(x), []).append(SignOrigin(*key, operand, read))
        return id(x)

    def _sources_of(self, layer_input: torch.Tensor) -> set[int]:
        """The sources a binarized layer input comes from: the origins found walking back along
        two-valued or derived inputs. A branch that ends elsewhere carries no binarization (the
        detach trick's polynomial compares x with -1 and 1, too)."""
        found: set[int] = set()
        pending, seen = [layer_input], set()
        while pending:
            tensor = pending.pop()
            made = self.made.get(id(tensor))
            if id(tensor) in seen or made is None:
                continue
            seen.add(id(tensor))
            if made.origin is not None:
                found.add(made.origin)
            else:
                pending.extend(t for t in made.inputs if self._two_valued_or_derived(t))
        return found

    def result(self) -> TracedBinarizations:
        from bnnexport.nn.discover import binarized_input

        reached: set[int] = set()
        unresolved = []
        for name, tensor in self.layer_inputs:
            if not binarized_input(tensor):
                continue
            sources = self._sources_of(tensor)
            if len(sources) != 1:
                unresolved.append(name)
            else:
                reached |= sources
        order = [s for s in self.sources if s in reached]
        return TracedBinarizations(
            origins=[self.origins[s] for s in order],
            shapes=[tuple(self.sources[s].shape[1:]) for s in order],
            unresolved=unresolved,
        )


class SignReplay(TorchFunctionMode):
    """One forward pass that reads each binarization source at its first origin and, given
    `imposed` signs (one array per source, None: none; an entry None: that source's own),
    calls every origin with them in place of the source (module doc). FidelityError when an
    origin's operand has another shape than the trace saw (the pass took another path)."""

    def __init__(
        self, traced: TracedBinarizations, imposed: list[np.ndarray | None] | None
    ) -> None:
        super().__init__()
        self.traced, self.imposed = traced, imposed
        self.at = {
            (origin.function, origin.nth): (k, origin)
            for k, origins in enumerate(traced.origins)
            for origin in origins
        }
        # the calls whose first operand is a source's value: its clamp's, else its origin's
        self.reads = {
            origin.read or (origin.function, origin.nth): (k, 0 if origin.read else origin.operand)
            for k, origins in enumerate(traced.origins)
            for origin in origins
        }
        self.seen: list[np.ndarray | None] = [None] * len(traced.origins)
        self.counter = _Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        key = self.counter.key(func)
        if key in self.reads:
            self._read(*self.reads[key], args, key)
        if key not in self.at:
            return func(*args, **(kwargs or {}))
        k, origin = self.at[key]
        x = args[origin.operand]
        if self.imposed is not None and self.imposed[k] is not None:
            signs = np.ascontiguousarray(self.imposed[k], dtype=np.float32)
            replaced = torch.from_numpy(signs).reshape(x.shape).to(x.dtype)
            args = tuple(replaced if i == origin.operand else a for i, a in enumerate(args))
        return func(*args, **(kwargs or {}))

    def _read(self, k: int, operand: int, args: tuple, key: tuple[str, int]) -> None:
        """Keep source k's value, the operand of call `key`, if it is the first read; a tensor
        of another shape than the trace saw is FidelityError (the pass took another path)."""
        x = args[operand] if operand < len(args) else None
        if not isinstance(x, torch.Tensor) or tuple(x.shape[1:]) != self.traced.shapes[k]:
            raise FidelityError(
                f"call {key[1] + 1} of {key[0]} in the model's forward pass reads another "
                f"tensor than its traced pass did (binarization {k + 1}): its signs cannot be "
                "matched up"
            )
        if self.seen[k] is None:
            self.seen[k] = x.detach()[0].numpy().copy()

    def values(self) -> list[np.ndarray]:
        """Each source's value at its first origin, in the traced order."""
        missing = [k for k, v in enumerate(self.seen) if v is None]
        if missing:
            raise FidelityError(
                f"the model's forward pass reached {len(self.seen) - len(missing)} of its "
                f"{len(self.seen)} traced binarizations: its signs cannot be matched up"
            )
        return [v for v in self.seen if v is not None]
