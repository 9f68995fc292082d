"""PyTorch as a `converters.gate.SignProbe`: read and impose the signs of every binarization.

Every activation binarization in a bnnexport model goes through a `Quantizer` module, so forward
hooks on those modules see each binarization's input (the witness of PyTorch's signs) and can
replace its output with chosen signs (the replay of another runtime's signs). The k-th
activation binarization PyTorch computes is the k-th binarization pattern of the exported ONNX
graph (the exporter writes nodes in the order the forward pass runs them); calls on a parameter
(the kernel quantizer of a latent-weight layer) are constants in ONNX and are skipped.

A model trained with int8 float layers (`bnnexport.nn.int8`) also has activation fake
quantizers: the k-th one PyTorch calls is the k-th `QuantizeLinear -> DequantizeLinear` pair of
the graph. Given ONNX Runtime's values at those pairs (`int8`, its witness), each run imposes
them all, after checking each lies within one step of what PyTorch computes from the same
values before it: two runtimes part there only by rounding (PyTorch multiplies by 1 / scale,
ONNX Runtime divides, and a conv's float sum lands on either side of a half step), as
`converters.gate.quantized` rules for an int8 flatbuffer.

A model of your own binarizes in its own code (`torch.sign`, an STE of its own, the detach
trick), with no `Quantizer` module to hook: `TracedProbe` finds its binarizations by tracing one
forward pass (`bnnexport.nn.sign_trace`) and matches them, in forward order, with the ONNX
graph's as the normaliser writes them (`converters.normalize`: the one canonical form of every
sign idiom), each pair checked on one sample to be the same tensor (its size, and its values
within rounding at nearly every position). Its replay then reads and imposes signs as the hooks
do. Where that matching fails (`UntraceableModel`, naming why), PyTorch cannot be probed and the
gate proves the chain through ONNX Runtime instead (docs/ARCHITECTURE.md, "Sign ties in a model
of your own").

Example:
    >>> from bnnexport.stages.torch_probe import TorchProbe
    >>> probe = TorchProbe(model, "runs/demo/model.onnx")              # doctest: +SKIP
    >>> logits, inputs = probe.run(x[0])                              # doctest: +SKIP
    >>> len(inputs) == len(probe.sources)                             # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch
from torch import nn

from bnnexport.converters.gate import Witness
from bnnexport.converters.gate.twin import grid_round, twin_initializers
from bnnexport.converters.graph import OnnxGraph, load_onnx
from bnnexport.converters.patterns import binarizations_in
from bnnexport.errors import FidelityError
from bnnexport.nn.quantizers import Quantizer
from bnnexport.nn.sign_trace import SignReplay, trace_binarizations

if TYPE_CHECKING:
    from bnnexport.converters.gate.checks import Reference


class TorchProbe:
    """A bnnexport model whose binarizations can be read and imposed (see module doc)."""

    def __init__(
        self,
        model: nn.Module,
        onnx_model: str | Path | onnx.ModelProto,
        int8: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]] | None = None,
    ):
        if not isinstance(onnx_model, onnx.ModelProto):
            onnx_model = load_onnx(onnx_model)
        self.int8 = Int8Imposer(model, onnx_model, int8) if int8 is not None else None
        graph = OnnxGraph.folded(onnx_model)
        self.model = model.eval()
        # the binarizations: a k-bit quantizer (DoReFa's) writes no sign for ONNX to match
        self.quantizers = binarizing_quantizers(model)
        # k-th call -> ONNX source
        self.calls = [b.source for b in binarizations_in(graph)]
        self.sources = list(dict.fromkeys(self.calls))

    def run(
        self, x: np.ndarray, imposed: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, binarization inputs by `sources`) for one sample, with `imposed` signs."""
        seen: list[np.ndarray] = []

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
            if isinstance(args[0], nn.Parameter):
                return None
            k = len(seen)
            seen.append(args[0].detach()[0].numpy().copy())
            if imposed is None or k >= len(self.calls):
                return None
            signs = imposed[self.sources.index(self.calls[k])].reshape(output.shape[1:])
            return torch.from_numpy(np.ascontiguousarray(signs))[None].to(output.dtype)

        handles = [q.register_forward_hook(hook) for q in self.quantizers]
        if self.int8 is not None:
            handles += self.int8.hooks(x)
        try:
            with torch.no_grad():
                logits = self.model(torch.from_numpy(np.asarray(x, np.float32)[None]))
        finally:
            for handle in handles:
                handle.remove()
        if len(seen) != len(self.calls):
            raise FidelityError(
                f"PyTorch binarized {len(seen)} tensors where the ONNX model has "
                f"{len(self.calls)} binarizations: its signs cannot be matched up"
            )
        first = {}
        for source, value in zip(self.calls, seen, strict=True):
            first.setdefault(source, value)
        return logits[0].numpy(), [first[s] for s in self.sources]

    def witness(self) -> Witness:
        """PyTorch as a candidate: its logits and binarization inputs, sign(0) = +1."""

        def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            logits, values = self.run(x)
            return logits, dict(zip(self.sources, values, strict=True))

        return Witness(run=run)


class UntraceableModel(Exception):
    """PyTorch's binarizations of a model of your own could not be matched with the ONNX
    graph's (why, in one line): the gate then proves the chain through ONNX Runtime."""


# matched on one sample: at least this fraction of positions within VALUE_RTOL of the tensor's
# largest value (a tie upstream moves a few positions, another tensor moves nearly all)
MATCHED_FRACTION = 0.9
VALUE_RTOL = 1e-3


class TracedProbe:
    """A model of your own as a `converters.gate.SignProbe` (module doc): its binarizations
    traced in PyTorch, matched with the normalised ONNX graph's on `sample`; `int8` as for
    `TorchProbe`. UntraceableModel when they cannot be matched."""

    def __init__(
        self,
        model: nn.Module,
        onnx_model: str | Path | onnx.ModelProto,
        sample: np.ndarray,
        int8: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]] | None = None,
    ):
        if not isinstance(onnx_model, onnx.ModelProto):
            onnx_model = load_onnx(onnx_model)
        self.model = model.eval()
        self.int8 = Int8Imposer(model, onnx_model, int8) if int8 is not None else None
        sample = np.asarray(sample, np.float32)
        try:
            self.traced = trace_binarizations(self.model, torch.from_numpy(sample[None]))
        except Exception as error:  # the model's own code, run under the trace
            raise UntraceableModel(f"tracing its forward pass failed: {error}") from None
        self.sources = _matched_sources(self, onnx_model, sample)

    def run(
        self, x: np.ndarray, imposed: list[np.ndarray | None] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, binarization inputs by `sources`) for one sample, with `imposed` signs (an
        entry None: PyTorch's own there)."""
        replay = SignReplay(self.traced, imposed)
        handles = [] if self.int8 is None else self.int8.hooks(x)
        try:
            with torch.no_grad(), replay:
                logits = self.model(torch.from_numpy(np.asarray(x, np.float32)[None]))
        finally:
            for handle in handles:
                handle.remove()
        return logits[0].numpy(), replay.values()

    def witness(self) -> Witness:
        """PyTorch as a candidate: its logits and binarization inputs, sign(0) = +1."""

        def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            logits, values = self.run(x)
            return logits, dict(zip(self.sources, values, strict=True))

        return Witness(run=run)


def _matched_sources(probe: TracedProbe, onnx_model: onnx.ModelProto, x: np.ndarray) -> list[str]:
    """The normalised ONNX graph's binarization source for each traced one, in order: the next
    ONNX source (forward order; ONNX may have more) of the same size whose values on sample `x`
    match (MATCHED_FRACTION within VALUE_RTOL), PyTorch given ONNX Runtime's signs at the
    binarizations matched before it (so a tie upstream cannot part the two). UntraceableModel
    when one has no match."""
    from bnnexport.converters.gate.checks import binarization_inputs
    from bnnexport.converters.normalize import normalize

    traced = probe.traced
    if traced.unresolved:
        raise UntraceableModel(
            f"no sign origin found for the binarized input of {', '.join(traced.unresolved)}"
        )
    normalised = normalize(onnx_model)[0]
    found = binarizations_in(OnnxGraph.folded(normalised))
    candidates = list(dict.fromkeys(b.source for b in found))
    theirs = binarization_inputs(normalised, candidates, x[None]) if candidates else {}
    matched: list[str] = []
    imposed: list[np.ndarray | None] = [None] * len(traced.origins)
    for k in range(len(traced.origins)):
        mine = probe.run(x, imposed)[1][k]
        start = candidates.index(matched[-1]) + 1 if matched else 0
        match = next((c for c in candidates[start:] if _same_tensor(mine, theirs[c][0])), None)
        if match is None:
            raise UntraceableModel(
                f"PyTorch's binarization {k + 1} of {len(traced.origins)} (a tensor of shape "
                f"{list(traced.shapes[k])}) matches none of the ONNX graph's "
                f"{len(candidates)} binarizations in order"
            )
        matched.append(match)
        imposed[k] = np.where(theirs[match][0] < 0, -1.0, 1.0).astype(np.float32)
    return matched


def _same_tensor(mine: np.ndarray, theirs: np.ndarray) -> bool:
    if mine.size != theirs.size:
        return False
    mine, theirs = mine.reshape(-1).astype(np.float64), theirs.reshape(-1).astype(np.float64)
    scale = max(float(np.abs(theirs).max(initial=0.0)), 1e-30)
    close = np.abs(mine - theirs) <= VALUE_RTOL * scale
    return float(close.mean()) >= MATCHED_FRACTION


def sign_probe(
    model: nn.Module,
    onnx_model: str | Path | onnx.ModelProto,
    sample: np.ndarray,
    int8: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]] | None = None,
) -> TorchProbe | TracedProbe:
    """PyTorch as the gate's sign probe: hooks on bnnexport's `Quantizer`s where the model is
    built of them, else its traced binarizations (`TracedProbe`, which may raise
    UntraceableModel)."""
    if has_quantizers(model):
        return TorchProbe(model, onnx_model, int8)
    return TracedProbe(model, onnx_model, sample, int8)


def has_quantizers(model: nn.Module) -> bool:
    """Whether `model` quantizes through bnnexport's `Quantizer` modules (a bnnexport model),
    whose hooks see every binarization; else it is a model of your own."""
    return any(isinstance(m, Quantizer) for m in model.modules())


class Int8Imposer:
    """Hooks that impose ONNX Runtime's int8 activations on a model's fake quantizers (module
    doc); FidelityError when the two do not line up, ConversionMismatchError when a value is
    more than one step from PyTorch's."""

    def __init__(
        self,
        model: nn.Module,
        onnx_model: onnx.ModelProto,
        witness: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]],
    ):
        from bnnexport.converters.gate.quantized import activation_points

        self.points = activation_points(onnx_model)  # graph order: the forward pass's order
        self.quantizers = activation_quantizers(model)
        self.witness = witness
        if len(self.quantizers) != len(self.points):
            raise FidelityError(
                f"PyTorch has {len(self.quantizers)} activation fake quantizers where the ONNX "
                f"model has {len(self.points)} int8 activations: they cannot be matched up"
            )

    def hooks(self, x: np.ndarray) -> list[torch.utils.hooks.RemovableHandle]:
        """The hooks imposing ONNX Runtime's values on sample `x`, one call of each quantizer."""
        theirs = self.witness(x)[1]
        names, calls = list(self.points), []

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            name = names[len(calls) % len(names)]  # the k-th call is the k-th pair
            calls.append(name)
            self._check_grid(name, module)
            value = np.asarray(theirs[name], np.float32).reshape(output.shape[1:])
            self._check(name, value, output.detach()[0].numpy())
            return torch.from_numpy(np.ascontiguousarray(value))[None].to(output.dtype)

        return [q.register_forward_hook(hook) for q in self.quantizers]

    def _check_grid(self, name: str, quantizer: nn.Module) -> None:
        """ConversionMismatchError unless the pair `name` quantizes with the quantizer's own
        scale and zero point (a coarser grid would pass the one-step rule in its own steps)."""
        from bnnexport.converters.errors import ConversionMismatchError

        scale, zero = self.points[name][:2]
        mine = float(quantizer.scale.reshape(-1)[0]), int(quantizer.zero_point.reshape(-1)[0])
        if not (np.isclose(scale, mine[0], rtol=1e-6, atol=0.0) and zero == mine[1]):
            raise ConversionMismatchError(
                f"int8 activation {name!r} has scale {scale:.6g} and zero point {zero} in the "
                f"ONNX model, {mine[0]:.6g} and {mine[1]} in PyTorch",
                {"int8_tensor": name, "onnx": [scale, zero], "pytorch": list(mine)},
            )

    def _check(self, name: str, theirs: np.ndarray, mine: np.ndarray) -> None:
        from bnnexport.converters.gate.quantized import refuse_beyond_one_step

        apart = np.abs(theirs.astype(np.float64) - mine) / self.points[name][0]
        refuse_beyond_one_step(
            name, apart, ("ONNX Runtime", "PyTorch's"),
            "given the same values before it (at most one step is rounding)",
        )  # fmt: skip


def binarizing_quantizers(model: nn.Module) -> list[Quantizer]:
    """The `Quantizer` modules of `model` that binarize (precision 1), in module order."""
    return [m for m in model.modules() if isinstance(m, Quantizer) and m.precision == 1]


def activation_quantizers(model: nn.Module) -> list[nn.Module]:
    """The activation fake quantizers of `model` (torch.ao's FakeQuantize), in module order."""
    return [m for m in model.modules() if hasattr(m, "fake_quant_enabled")]


def twin_model(model: nn.Module, twin: onnx.ModelProto) -> nn.Module:
    """A copy of `model` with the twin ONNX graph's float initializers loaded by name (the
    exporter names them after the state dict): PyTorch's own exact-grid twin.

    Two kinds of initializer carry no such name. A scalar one is a constant of the model's own
    code (a Clip bound, DoReFa's 3 levels, folded by the exporter): the copy keeps its own. A
    parameter the exporter reshaped (PReLU's slopes, unsqueezed to [C, 1, 1] and folded) is
    found by value: it goes into every parameter of its size, not loaded by name, whose twin
    value it is (`converters.gate.twin.grid_round`, ±1 kept). Where the twin's grid moved a
    constant, or a value went to a parameter that is not its own, the two twins differ and
    the twin check refuses; it cannot pass because of it.
    """
    copy = deepcopy(model).eval()
    state = copy.state_dict()
    loaded = {k: v for k, v in twin_initializers(twin).items() if k in state or v.size != 1}
    unnamed = {k: v for k, v in state.items() if k not in loaded and v.is_floating_point()}
    with torch.no_grad():
        for name in sorted(set(loaded) - set(state)):
            targets = _twin_targets(loaded.pop(name), unnamed)
            if not targets:
                raise FidelityError(
                    f"the ONNX initializer {name!r} is not a PyTorch parameter or buffer: "
                    "PyTorch's exact-grid twin cannot be built"
                )
            loaded.update(targets)
        for name, value in loaded.items():
            state[name].copy_(torch.from_numpy(value.copy()).reshape(state[name].shape))
    return copy


def _twin_targets(value: np.ndarray, unnamed: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """{parameter: `value`} for each tensor of `unnamed` that the twin maps to `value`."""
    found = {}
    for name, tensor in unnamed.items():
        if tensor.numel() != value.size:
            continue
        own = tensor.detach().cpu().numpy().astype(np.float32).ravel()
        twin = own if np.all(np.abs(own) == 1.0) else grid_round(own)
        if np.array_equal(twin, value.ravel()):
            found[name] = value
    return found


def twin_outputs(model: nn.Module) -> Callable[[onnx.ModelProto, np.ndarray], np.ndarray]:
    """PyTorch's own exact-grid twin (`converters.gate.twin`, `twin_model`), run on inputs."""

    def run(twin: onnx.ModelProto, inputs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return twin_model(model, twin)(torch.from_numpy(np.asarray(inputs, np.float32))).numpy()

    return run


def twin_probe(model: nn.Module) -> Callable[[onnx.ModelProto], TorchProbe]:
    """A `TorchProbe` of PyTorch's own exact-grid twin, for `converters.gate.checks.check_twin`."""
    return lambda twin: TorchProbe(twin_model(model, twin), twin)


def torch_reference(
    model: torch.nn.Module,
    onnx_path: Path,
    sample: np.ndarray,
    outputs: Callable[[np.ndarray], np.ndarray],
) -> Reference:
    """PyTorch as a `converters.gate.checks.Reference`: its `outputs` on NCHW samples, sign probe
    and exact-grid twin. A model of your own gets the probe of its traced binarizations, matched
    with the ONNX graph on `sample`, and no twin (its initializers are not its parameters);
    where they cannot be matched, it is checked through ONNX Runtime (`Reference.unprobed`)."""
    from bnnexport.converters.gate.checks import Reference

    if has_quantizers(model):
        return Reference(
            name="PyTorch", outputs=outputs, probe=lambda: TorchProbe(model, onnx_path),
            twin_outputs=twin_outputs(model), twin_probe=twin_probe(model),
        )  # fmt: skip
    try:
        probe = sign_probe(model, onnx_path, sample)
    except UntraceableModel as why:
        return Reference(name="PyTorch", outputs=outputs, unprobed=str(why))
    return Reference(name="PyTorch", outputs=outputs, probe=lambda: probe)
