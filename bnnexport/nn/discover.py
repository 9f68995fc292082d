"""The binary kernels of any `nn.Module`, from one forward pass PyTorch runs itself.

A binary kernel is a parameter Bop trains: a conv or linear kernel that is ±1 at every moment.
`find_binary_kernels` decides which they are once, when a model is made or first trained; the
decision is a `BinaryKernels` record that every later stage reads (docs/ARCHITECTURE.md "The
record of binary kernels").

How it is found (`trace_layers`): a copy of the model whose weights (2 or more dimensions) hold
random signs with random magnitudes in [0.5, 1.5) runs one forward pass under a
`TorchFunctionMode` that sees every conv, linear and matmul call with its operands. The weight
operand is tied to the parameter it is computed from through autograd's graph (the leaf
parameter with as many entries as the operand), or, computed outside the graph (a bare
`torch.where(w >= 0, 1.0, -1.0)`), to the parameter whose random signs it carries. Then, per
call:

- the operand is ±1 (or ±1 times one positive scale per output channel) although its parameter
  holds random magnitudes: the forward pass **binarizes** the parameter (an STE, sign, the
  detach trick, mean|w| x sign(w)): a binary kernel, whatever the layer's input;
- the operand is the parameter itself (or a view of it), or a real function of it: a binary
  kernel **used as it is** when the call's input is binarized (every value ±1; zeros only in
  whole border rows or columns, a zero padding), or when the parameter already holds ±1 in the
  model (bnnexport's `BinaryConv2d` on a first layer's real input). It must then hold ±1 itself.

No ONNX export is involved, so a model the exporter cannot export trains with Bop; parameters
are never matched by name. Where one weight is computed from two parameters of its size, the
answer is not the trace's to give: the error says to name the kernels (`binary=`,
`train --binary`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> import torch.nn.functional as F
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.stem = nn.Conv2d(1, 8, 3)
    ...         self.w = nn.Parameter(torch.randn(8, 8, 3, 3))
    ...     def forward(self, x):
    ...         sign = lambda t: torch.where(t >= 0, 1.0, -1.0)
    ...         return F.conv2d(sign(self.stem(x)), sign(self.w)).mean((2, 3))
    >>> record = find_binary_kernels(Net(), torch.randn(1, 1, 8, 8))
    >>> [(k.name, k.binarized, k.binary_input) for k in record], record.parameters
    ([('w', True, True)], 576)
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from bnnexport.errors import (
    BnnExportError,
    CheckpointError,
    ConfigError,
    InputShapeError,
    ModelCodeError,
    NoBinaryKernelError,
)
from bnnexport.imports import user_frame

BinarySpec = Iterable[str] | str | Callable[[str, nn.Parameter], bool]

# Fewer random signs than this could be carried by two parameters alike.
MIN_SIGNS = 16

# the calls whose second operand is a weight: {function: op name}
_WEIGHT_SECOND = {
    torch.conv1d: "conv1d", torch.conv2d: "conv2d", torch.conv3d: "conv3d",
    torch.conv_transpose1d: "conv_transpose1d", torch.conv_transpose2d: "conv_transpose2d",
    torch.conv_transpose3d: "conv_transpose3d", F.linear: "linear",
}  # fmt: skip
# the calls either of whose operands may be the weight
_MATMULS = {
    torch.matmul: "matmul", torch.Tensor.matmul: "matmul", torch.Tensor.__matmul__: "matmul",
    torch.mm: "matmul", torch.Tensor.mm: "matmul",
}  # fmt: skip


@dataclass(frozen=True)
class LayerCall:
    """One conv/linear/matmul call of a traced forward pass.

    `weight` is the parameter the weight operand is computed from (None: not a parameter's;
    `sources` lists them all when several of its size are), `kernel` how: ``"binarized"``
    (±1, or ±1 times a scale per output channel, although the parameter is not), ``"as-is"``
    (the parameter or a view of it) or ``"computed"`` (a real function of it). `holds_pm1`:
    the parameter holds ±1 in the model itself. `macs` are the call's multiply-accumulates for
    one sample.
    """

    op: str
    module: str
    weight: str | None
    kernel: str
    binary_input: bool
    holds_pm1: bool
    weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    macs: int
    sources: tuple[str, ...] = ()

    @property
    def binary_kernel(self) -> bool:
        """Whether the call's weight is a binary kernel (the rules of the module docstring)."""
        if self.weight is None:
            return False
        return self.kernel == "binarized" or self.binary_input or self.holds_pm1

    @property
    def binary(self) -> bool:
        """Both operands binary: what LCE runs as a binary layer (binary MACs)."""
        return self.binary_kernel and self.binary_input


@dataclass
class Trace:
    """What one forward pass showed: every layer call, in order; the output shape (without the
    batch) of every module that holds parameters of its own, and how many calls had been made
    when it returned (`finished`: where it belongs in the order of calls)."""

    calls: list[LayerCall] = field(default_factory=list)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BinaryKernel:
    """One binary kernel: its parameter's name and shape; `binarized` (the forward pass
    binarizes it; False: used as it is, so it holds ±1 itself) and `binary_input` (its layer's
    input is binarized) as the trace saw them, None when the kernel was named, not traced;
    `layer`: where it is used, ``module: op``."""

    name: str
    shape: tuple[int, ...]
    binarized: bool | None = None
    binary_input: bool | None = None
    layer: str = ""

    @property
    def size(self) -> int:
        """Its number of weights."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class BinaryKernels:
    """The record of a model's binary kernels: decided once, read by every stage.

    `found_by` says how: ``"tracing"`` (`find_binary_kernels`), ``"named"`` (`binary=`,
    `train --binary`) or ``"layer type"`` (bnnexport's own layers in a model of unknown input
    shape). Stored in the checkpoint, config.json and the packed file (`to_json`).
    """

    kernels: tuple[BinaryKernel, ...]
    found_by: str

    def __iter__(self) -> Iterator[BinaryKernel]:
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    @property
    def names(self) -> list[str]:
        """The kernels' parameter names, in the order the forward pass uses them."""
        return [kernel.name for kernel in self.kernels]

    @property
    def parameters(self) -> int:
        """The number of binary weights."""
        return sum(kernel.size for kernel in self.kernels)

    def to_json(self) -> dict[str, Any]:
        """{"found_by": ..., "kernels": [{name, shape, binarized, binary_input, layer}, ...]}."""
        kernels = [
            {"name": k.name, "shape": list(k.shape), "binarized": k.binarized,
             "binary_input": k.binary_input, "layer": k.layer}
            for k in self.kernels
        ]  # fmt: skip
        return {"found_by": self.found_by, "kernels": kernels}

    @classmethod
    def from_json(cls, data: Any, source: str = "record") -> BinaryKernels:
        """The record `to_json` wrote; CheckpointError (one line) for anything else."""
        try:
            kernels = tuple(
                BinaryKernel(
                    name=str(k["name"]), shape=tuple(int(d) for d in k["shape"]),
                    binarized=k.get("binarized"), binary_input=k.get("binary_input"),
                    layer=str(k.get("layer", "")),
                )
                for k in data["kernels"]
            )  # fmt: skip
            return cls(kernels, str(data["found_by"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CheckpointError(f"{source}: malformed record of binary kernels") from None

    def require_in(self, model: nn.Module, source: str) -> BinaryKernels:
        """This record, once every kernel is a parameter of `model` with the recorded shape
        (CheckpointError naming the first that is not)."""
        params = dict(model.named_parameters())
        for kernel in self.kernels:
            param = params.get(kernel.name)
            if param is None or tuple(param.shape) != kernel.shape:
                found = "missing" if param is None else f"of shape {list(param.shape)}"
                raise CheckpointError(
                    f"{source}: the binary kernel {kernel.name!r} {list(kernel.shape)} it "
                    f"records is {found} in {type(model).__name__}"
                )
        return self

    def select(self, model: nn.Module) -> dict[str, nn.Parameter]:
        """{name: parameter} of the recorded kernels in `model`."""
        params = dict(model.named_parameters())
        return {name: params[name] for name in self.names}


def find_binary_kernels(
    model: nn.Module,
    example_input: torch.Tensor | None = None,
    binary: BinarySpec | None = None,
    trace: Trace | None = None,
) -> BinaryKernels:
    """The record of `model`'s binary kernels: the one decision every stage reads.

    `binary` names them (parameter names or shell-style globs, or a predicate(name, param));
    else they are found by tracing `example_input` (a batch the model accepts; default: one
    standard-normal input of `model.bnnexport_config["input_shape"]`), or read from `trace`,
    one `trace_layers` already took of this model (the summary's, which need not trace twice).
    A model of unknown input shape is searched for bnnexport's own binary layers by type.
    `model` is left unchanged.

    Raises:
        NoBinaryKernelError when none is found; ConfigError when a kernel could be either of
        two parameters; InputShapeError when the model cannot take `example_input`.
    """
    if trace is None:
        if example_input is None:
            example_input = default_input(model)
        trace = trace_layers(model, example_input) if example_input is not None else None
    if binary is not None:
        kernels, how = _named(model, select_binary(model, binary), trace), "named"
    elif trace is not None:
        kernels, how = _traced(model, trace), "tracing"
    else:
        kernels, how = _by_layer_type(model), "layer type"
    if not kernels:
        hint = _HINTS[how]
        raise NoBinaryKernelError(
            f"no binary kernel in {type(model).__name__} {hint}; a binary kernel is the ±1 "
            "kernel of a conv/linear layer, binarized in forward or with a binarized input: "
            "name yours with binary=[...] (train --binary NAME[,NAME])"
        )
    return BinaryKernels(tuple(kernels), how)


_HINTS = {
    "tracing": "found by tracing its forward pass",
    "named": "named",
    "layer type": "(without example_input, a model of unknown input shape is searched for "
    "bnnexport's BinaryConv2d/BinaryLinear only: pass example_input=a batch it takes)",
}


def default_input(model: nn.Module, seed: int = 0) -> torch.Tensor | None:
    """One seeded standard-normal input of the model's recorded input shape, or None."""
    shape = getattr(model, "bnnexport_config", {}).get("input_shape")
    if not shape:
        return None
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, *[int(v) for v in shape], generator=generator)


def select_binary(model: nn.Module, binary: BinarySpec) -> list[str]:
    """The parameter names `binary` selects: names or shell-style globs (each must match), or
    a predicate(name, param).

    Example:
        >>> select_binary(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), "*.weight")
        ['0.weight', '1.weight']

    Raises:
        ConfigError naming a name or glob that matches no parameter of the model.
    """
    params = dict(model.named_parameters())
    if callable(binary):
        return [name for name, param in params.items() if binary(name, param)]
    patterns = [binary] if isinstance(binary, str) else list(binary)
    chosen: dict[str, None] = {}
    for pattern in patterns:
        matched = [name for name in params if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigError(
                f"{type(model).__name__} has no parameter {pattern!r}; it has "
                f"{', '.join(params) or 'none'}"
            )
        chosen.update(dict.fromkeys(matched))
    return list(chosen)


def _traced(model: nn.Module, trace: Trace) -> list[BinaryKernel]:
    params = dict(model.named_parameters())
    found: dict[str, BinaryKernel] = {}
    for call in trace.calls:
        if call.binary_kernel and len(call.sources) > 1:
            raise ConfigError(
                f"the {call.op} kernel in {call.module or 'the model'} is computed from "
                f"{' and '.join(call.sources)}: name the binary kernels yourself "
                "(binary=[...], train --binary NAME[,NAME])"
            )
        if call.binary_kernel and call.weight not in found:
            found[call.weight] = _kernel(call.weight, params[call.weight], call)  # type: ignore[index]
    return list(found.values())


def _named(model: nn.Module, names: list[str], trace: Trace | None) -> list[BinaryKernel]:
    params = dict(model.named_parameters())
    first = {}
    for call in trace.calls if trace is not None else []:
        first.setdefault(call.weight, call)
    return [_kernel(name, params[name], first.get(name)) for name in names]


def _by_layer_type(model: nn.Module) -> list[BinaryKernel]:
    from bnnexport.nn.layers import binary_layers

    return [
        BinaryKernel(f"{name}.weight" if name else "weight", tuple(layer.weight.shape),
                     binarized=layer.latent, binary_input=layer.input_quantizer is not None,
                     layer=f"{name}: {type(layer).__name__}")
        for name, layer in binary_layers(model)
    ]  # fmt: skip


def _kernel(name: str, param: nn.Parameter, call: LayerCall | None) -> BinaryKernel:
    if call is None:
        return BinaryKernel(name, tuple(param.shape))
    return BinaryKernel(
        name, tuple(param.shape), binarized=call.kernel == "binarized",
        binary_input=call.binary_input, layer=f"{call.module or '(model)'}: {call.op}",
    )  # fmt: skip


def trace_layers(model: nn.Module, example_input: torch.Tensor) -> Trace:
    """Every conv/linear/matmul call one forward pass of `example_input` makes (see the module
    docstring), on a marked copy in eval mode; `model` is left unchanged.

    Raises:
        InputShapeError (one line) when the model cannot take `example_input`;
        ConfigError when a binary kernel could be either of two parameters.
    """
    holds_pm1 = {
        name: bool((p.detach().abs() == 1).all())
        for name, p in model.named_parameters()
        if p.dim() >= 2 and p.is_floating_point()
    }
    probe = _marked_copy(model)
    recorder = _Recorder(probe, holds_pm1, batch=int(example_input.shape[0]))
    with recorder.hooks(), torch.enable_grad(), recorder:
        try:
            probe(example_input)
        except BnnExportError:
            raise
        except Exception as error:  # the model's forward may raise anything
            raise _forward_error(model, example_input, error) from None
    return recorder.trace


def _forward_error(model: nn.Module, example_input: torch.Tensor, error: Exception) -> ConfigError:
    """A forward pass that raised, in one line: the model's own error (its type, message, file
    and line) when its own code raised it (`bnnexport.imports.user_frame`), else that it cannot
    take the input: every torch call of the pass goes through the recorder, so an error torch
    raises (a channel count, a size) ends in library frames, never in the model's."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    frame = user_frame(error)
    if frame is None:
        return InputShapeError(
            f"{type(model).__name__} cannot take an input of shape "
            f"{list(example_input.shape)}: {type(error).__name__}: {first}"
        )
    return ModelCodeError(
        f"{type(model).__name__}'s own code raised {type(error).__name__}: {first} ({frame}): "
        "an error in the model, not in its input"
    )


def _marked_copy(model: nn.Module, seed: int = 0) -> nn.Module:
    """A copy of `model` in eval mode whose weights (2 or more dimensions) hold random signs
    with random magnitudes in [0.5, 1.5), every float parameter requiring a gradient."""
    from bnnexport.nn.layers import set_precision

    probe = copy.deepcopy(model).eval()
    set_precision(probe, "float32")  # a bf16 product is no conv call the trace could see
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in probe.parameters():
            if not param.is_floating_point():
                continue
            param.requires_grad_(True)
            if param.dim() >= 2:
                signs = torch.where(torch.rand(param.shape, generator=generator) < 0.5, -1.0, 1.0)
                magnitudes = 0.5 + torch.rand(param.shape, generator=generator)
                param.copy_((signs * magnitudes).to(param.dtype))
    return probe


class _Recorder(TorchFunctionMode):
    """Records every layer call of one forward pass (`trace_layers`)."""

    def __init__(self, probe: nn.Module, holds_pm1: dict[str, bool], batch: int) -> None:
        super().__init__()
        self.probe, self.holds_pm1, self.batch = probe, holds_pm1, batch
        self.params = {id(p): name for name, p in probe.named_parameters()}
        self.trace = Trace()
        self.stack: list[str] = [""]

    def hooks(self) -> Any:
        """A context in which the module being run is known (`self.stack`)."""
        import contextlib

        stack = contextlib.ExitStack()
        for name, module in self.probe.named_modules():
            stack.callback(module.register_forward_pre_hook(self._enter(name)).remove)
            stack.callback(module.register_forward_hook(self._leave(module)).remove)
        return stack

    def _enter(self, name: str) -> Callable[..., None]:
        return lambda _module, _args: self.stack.append(name)

    def _leave(self, module: nn.Module) -> Callable[..., None]:
        own = any(True for _ in module.parameters(recurse=False))

        def leave(_module: nn.Module, _args: Any, output: Any) -> None:
            name = self.stack.pop()
            if own and isinstance(output, torch.Tensor) and name not in self.trace.outputs:
                self.trace.outputs[name] = list(output.shape[1:])
                self.trace.finished[name] = len(self.trace.calls)

        return leave

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        output = func(*args, **(kwargs or {}))
        if func in _WEIGHT_SECOND and len(args) >= 2:
            op = _WEIGHT_SECOND[func]  # a transposed conv's weight is [in, out / groups, ...]
            self._record(op, args[0], args[1], 1 if "transpose" in op else 0, output)
        elif func in _MATMULS and len(args) >= 2:
            first, second = args[0], args[1]
            if self._sources(second) or not self._sources(first):
                self._record("matmul", first, second, -1, output)
            else:
                self._record("matmul", second, first, -2, output)
        return output

    def _record(self, op: str, x: Any, weight: Any, out_axis: int, output: Any) -> None:
        if not all(isinstance(t, torch.Tensor) for t in (x, weight, output)) or weight.dim() < 2:
            return
        sources = [n for n in self._sources(weight) if self._numel(n) == weight.numel()]
        binary_input = binarized_input(x)
        name = sources[0] if sources else None
        kernel = self._kind(name, weight, out_axis) if name else "none"
        self.trace.calls.append(
            LayerCall(
                op=op, module=self.stack[-1], weight=name, kernel=kernel,
                binary_input=binary_input,
                holds_pm1=self.holds_pm1.get(name, False) if name else False,
                weight_shape=tuple(weight.shape), output_shape=tuple(output.shape[1:]),
                macs=_macs(op, x, weight, output, out_axis) // max(self.batch, 1),
                sources=tuple(sources),
            )
        )  # fmt: skip

    def _numel(self, name: str) -> int:
        return self.probe.get_parameter(name).numel()

    def _kind(self, name: str, weight: torch.Tensor, out_axis: int) -> str:
        param = self.probe.get_parameter(name)
        if weight.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
            return "as-is"
        # rounding of the detach trick's (a - w) + w is relative to the latent weight w
        slack = ROUNDING * float(param.detach().abs().max())
        return "binarized" if _binary_or_scaled(weight.detach(), out_axis, slack) else "computed"

    def _sources(self, tensor: Any) -> list[str]:
        """The parameters `tensor` is computed from, by autograd's graph; for a tensor outside
        it (`torch.where(w >= 0, 1.0, -1.0)` has no gradient), the parameters of its shape
        whose random signs it carries."""
        if not isinstance(tensor, torch.Tensor):
            return []
        if id(tensor) in self.params:
            return [self.params[id(tensor)]]
        if tensor.grad_fn is None and tensor.numel() >= MIN_SIGNS:
            signs = torch.sign(tensor.detach())
            return [
                name for name, param in self.probe.named_parameters()
                if param.shape == tensor.shape and torch.equal(torch.sign(param.detach()), signs)
            ]  # fmt: skip
        found: dict[str, None] = {}
        seen: set[Any] = set()
        pending = [tensor.grad_fn]
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf
            if variable is not None and id(variable) in self.params:
                found[self.params[id(variable)]] = None
            pending.extend(parent for parent, _ in node.next_functions)
        order = list(self.params.values())
        return sorted(found, key=order.index)  # the model's order, whatever the graph's


# How far from ±1 (relative) a binarized value may lie: the straight-through "detach trick"
# (sign(x).detach() - p(x).detach() + p(x)) is ±1 only up to the rounding of (s - p) + p
# (docs/LCE_NOTES.md "Real-world exports"). No real-valued tensor is this close to ±1 throughout.
ROUNDING = 1e-6


def binarized_input(x: torch.Tensor) -> bool:
    """Every value ±1 (up to `ROUNDING`), except zeros that fill whole border rows or columns
    (a zero padding)."""
    values = x.detach()
    if not values.is_floating_point() or values.numel() == 0:
        return False
    plus_minus_one = (values.abs() - 1).abs() <= ROUNDING
    if bool(plus_minus_one.all()):
        return True
    zeros = values == 0
    if values.dim() < 3 or not bool((plus_minus_one | zeros).all()):
        return False
    rows = zeros.transpose(-2, 0).reshape(zeros.shape[-2], -1).all(dim=1)
    columns = zeros.transpose(-1, 0).reshape(zeros.shape[-1], -1).all(dim=1)
    padding = rows[:, None] | columns[None, :]
    return bool((~zeros | padding).all()) and bool(plus_minus_one.any())


def _binary_or_scaled(weight: torch.Tensor, out_axis: int, slack: float = 0.0) -> bool:
    """±1, or ±1 times one positive scale per output channel (along `out_axis`), up to a
    relative `ROUNDING` or an absolute `slack`."""
    magnitudes = weight.abs().movedim(out_axis, 0).reshape(weight.shape[out_axis], -1)
    first = magnitudes[:, :1]
    tolerance = torch.clamp(ROUNDING * first, min=slack)
    return bool((magnitudes > 0).all()) and bool(((magnitudes - first).abs() <= tolerance).all())


def _macs(
    op: str, x: torch.Tensor, weight: torch.Tensor, output: torch.Tensor, out_axis: int
) -> int:
    """Multiply-accumulates of one call, for the whole batch."""
    if op.startswith("conv_transpose"):  # every input value meets out / groups x kernel taps
        return int(x.numel() * weight[0].numel())
    if op.startswith("conv"):
        per_output = weight[0].numel()  # in_channels / groups x kernel size
    elif op == "linear":
        per_output = weight.shape[-1]
    else:  # x @ w: w is [in, out]; w @ x: w is [out, in]
        per_output = weight.shape[-2] if out_axis == -1 else weight.shape[-1]
    return int(output.numel() * per_output)
