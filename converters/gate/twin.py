"""The exact-grid twin: the same ONNX graph with parameters on power-of-two grids.

Real weights round differently in every runtime, so a converted model can only be checked up to
sign ties (`converters.gate`). The twin removes rounding altogether: every float initializer is
rounded to a coarse power-of-two grid of its own magnitude (at most `BITS` significant bits);
every BatchNorm gets a variance of 4096 - eps, as float32 (`bn_variance`: var + eps is then
exactly 4096 and sqrt(var + eps) exactly 64 in float32, for PyTorch's eps 1e-5 and Keras' 1e-3
alike), a gamma of 64 x a power of two (so its scale is that power of two, negated in
every fourth channel so both signs occur) and a mean that puts its zero crossing on an integer,
and on 0 in every other channel (so a binary conv's integer accumulator lands exactly on it, and
exact +0.0 and -0.0 both reach the next sign). A BatchNorm whose gamma is a constant of the
graph (torch's `affine=False`) gets the variance whose root makes its scale a power of two near
its own instead (`_fixed_gamma`). The inputs lie on the 1/8 grid in [-1, 1]. Every
sum a runtime computes is then exact in float32 whatever its order, as long as its terms span
fewer than float32's 24 bits, and the converted twin must agree with ONNX Runtime with no sign
tie at all: a translation bug shows no matter how the real weights round. (A float conv summing
hundreds of grid values of a few hundred can exceed those bits: Bi-Real-Net-18 at 224x224 does
in its float shortcuts. LCE and ONNX Runtime then still agree exactly, and a reference that
rounds its twin otherwise is judged by tie replay, `converters.gate.checks.check_twin`.)
±1 kernels stay ±1; a per-channel kernel scale becomes a power of two.

Functions no grid makes exact (Sigmoid, Tanh, Exp, Erf) are evaluated at exactly 0, where each
value is exact (0.5, 0, 1, 0) in every runtime: the linear layer that feeds one (through biases,
scales and layout ops) gets a zero weight and bias in the twin (`zeroed_feeds`). Real-to-Binary
Net's sigmoid gates, which scale every binary conv's output, otherwise put rounded values
between binarizations, and the two runtimes' roundings flip signs that compound over its 16
blocks (docs/LCE_NOTES.md "Inexact functions"). Only float ops after the last binarization (a global
average over 7x7, a softmax) may still round.

Example:
    >>> import numpy as np
    >>> grid_round(np.array([0.3, -0.05, 1.0], np.float32))  # steps of 1/8 below 1.0
    array([0.25, 0.  , 1.  ], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.patterns import BinaryLayerMatch, find_binary_layers_in
from onnx import numpy_helper

BITS = 4  # significant bits of a twin parameter
# exact at 0 only (values 0.5, 0, 1, 0): the twin feeds them an exact 0 (`zeroed_feeds`)
EXACT_AT_ZERO = ("Sigmoid", "Tanh", "Exp", "Erf")
# a zero input gives a zero output (Mul and Div by a constant too; Add/Sub's constant is zeroed)
ZERO_PRESERVING = ("Relu", "Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze")
LINEAR = ("MatMul", "Gemm", "Conv")
LAYOUT = ("Transpose", "Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze")
BN_VARIANCE = 4096.0  # var + eps of every twin BatchNorm: its square root is exactly 64
INPUT_STEP = 1 / 8


def grid_round(values: np.ndarray, bits: int = BITS) -> np.ndarray:
    """Round to multiples of 2^(e - bits + 1), e the exponent of the largest |value|."""
    values = np.asarray(values, np.float32)
    largest = float(np.abs(values).max()) if values.size else 0.0
    if largest == 0.0 or not np.isfinite(largest):
        return np.nan_to_num(values, posinf=0.0, neginf=0.0)
    step = 2.0 ** (np.floor(np.log2(largest)) - bits + 1)
    return (np.round(values / step) * step + 0.0).astype(np.float32)  # + 0.0: no -0.0


def power_of_two(values: np.ndarray) -> np.ndarray:
    """sign(v) x the nearest power of two of |v| (0 stays 0)."""
    v = np.asarray(values, np.float64)
    out = np.sign(v) * 2.0 ** np.round(np.log2(np.where(v == 0, 1.0, np.abs(v))))
    return np.where(v == 0, 0.0, out).astype(np.float32)


def grid_inputs(inputs: np.ndarray) -> np.ndarray:
    """Inputs clipped to [-1, 1] and rounded to the 1/8 grid."""
    x = np.clip(np.nan_to_num(np.asarray(inputs, np.float32)), -1.0, 1.0)
    return (np.round(x / INPUT_STEP) * INPUT_STEP).astype(np.float32)


def bn_variance(eps: float, target: float = BN_VARIANCE) -> np.float32:
    """The float32 variance v for which v + eps is exactly `BN_VARIANCE` in float32 (and the
    float64 square root of v + eps rounds to exactly 64 in float32, for runtimes that fold in
    float64). A plain 4096 works only for eps below half of float32's spacing at 4096
    (2.4e-4): with Keras' eps = 1e-3, sqrt(4096 + eps) is 64.00001 and every runtime's folded
    BatchNorm keeps a tiny residue of its own sign at the zeros the twin puts on purpose
    (docs/LCE_NOTES.md "Real-world exports").

    >>> float(bn_variance(1e-5)), float(bn_variance(1e-3) + np.float32(1e-3))
    (4096.0, 4096.0)
    """
    eps32 = np.float32(eps)
    start = np.float32(target - eps)
    root = np.float32(np.sqrt(target))
    for v in (start, np.nextafter(start, np.float32(0)), np.nextafter(start, np.float32(1e9))):
        exact32 = np.float32(v + eps32) == np.float32(target)
        exact64 = np.float32(np.sqrt(np.float64(v) + np.float64(eps))) == root
        if exact32 and exact64:
            return np.float32(v)
    raise ValueError(f"no float32 BatchNorm variance makes var + {eps} exactly {target}")


def _batch_norm_params(
    graph: OnnxGraph, node: onnx.NodeProto, stored: set[str]
) -> dict[str, np.ndarray]:
    gamma, beta, mean, var = (graph.const(n) for n in node.input[1:5])
    if any(c is None for c in (gamma, beta, mean, var)):
        return {}
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    scale = power_of_two(gamma / np.sqrt(var.astype(np.float64) + eps))
    scale = np.where(scale == 0, np.float32(2.0**-5), scale)
    names = node.input[1:5]
    if names[0] not in stored:
        # gamma is a constant of the graph (torch's affine=False): the variance alone sets the
        # scale, so it is the one whose root is gamma / scale; a fixed 4096 would shrink every
        # value 64-fold and push the next sums past float32's 24 bits (QuickNet's stem)
        return _fixed_gamma(names, gamma, beta, mean, scale, eps)
    channel = np.arange(scale.size)
    scale = np.where(channel % 4 == 1, -scale, scale)  # both signs of scale, whatever gamma was
    beta = grid_round(beta)
    shift = beta / scale  # exact: a power of two
    # (x - mean) * scale + beta is zero at x = mean - beta / scale. Put that on an integer, so a
    # binary conv's integer accumulator lands on it exactly, and on 0 itself in every other
    # channel: there the folded bias is exactly 0 and 0 x a negative scale is -0.0, the case
    # where LCE's sign-bit rule and torch's sign(0) = +1 part (docs/ARCHITECTURE.md)
    crossing = np.where(channel % 2 == 0, 0.0, np.round(grid_round(mean) - shift))
    mean = crossing + shift
    return {
        names[0]: (scale * np.sqrt(BN_VARIANCE)).astype(np.float32),
        names[1]: beta,
        names[2]: mean.astype(np.float32),
        names[3]: np.full_like(var, bn_variance(eps), dtype=np.float32),
    }


def _fixed_gamma(
    names: Sequence[str],
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    scale: np.ndarray,
    eps: float,
) -> dict[str, np.ndarray]:
    """A BatchNorm whose gamma and beta the twin cannot set: the variance makes its scale the
    power of two `scale` (gamma a power of two too, else it is left as it is), the mean puts its
    zero crossing on an integer."""
    gamma = np.broadcast_to(np.asarray(gamma, np.float64), scale.shape)
    if not np.array_equal(power_of_two(gamma), gamma.astype(np.float32)):
        return {}
    targets = (gamma / scale) ** 2
    var = np.array([bn_variance(eps, float(t)) for t in targets.ravel()], np.float32)
    shift = np.broadcast_to(np.asarray(beta, np.float64), scale.shape) / scale
    crossing = np.round(grid_round(mean) - shift)
    return {names[2]: (crossing + shift).astype(np.float32), names[3]: var.reshape(scale.shape)}


def _binary_kernels(layers: list[BinaryLayerMatch]) -> dict[str, np.ndarray]:
    """Binary kernels with their per-channel scales rounded to powers of two."""
    out = {}
    for layer in layers:
        if layer.strict or layer.scale is None or layer.op_type == "Gemm":
            continue  # exact ±1 already (Gemm's alpha stays as it is)
        kernel = np.moveaxis(np.asarray(layer.kernel, np.float32), layer.out_axis, 0)
        scale = power_of_two(layer.scale).reshape(-1, *[1] * (kernel.ndim - 1))
        out[layer.kernel_name] = np.moveaxis(np.sign(kernel) * scale, 0, layer.out_axis)
    return out


def zeroed_feeds(
    graph: OnnxGraph, layers: list[BinaryLayerMatch] | None = None
) -> dict[str, np.ndarray]:
    """Zero weights and biases for the linear layers that feed a function of `EXACT_AT_ZERO`,
    so that the function sees exactly 0 (module doc). A function fed any other way, through a
    constant another node reads too, or through a binary layer (`layers`, found when None), is
    left as it is."""
    found = find_binary_layers_in(graph) if layers is None else layers
    binary = {layer.kernel_name for layer in found}
    zeroable = {init.name for init in graph.model.graph.initializer} - binary
    out: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        if node.op_type in EXACT_AT_ZERO:
            out.update(_zero_feed(graph, node.input[0], zeroable) or {})
    return out


def _zero_feed(graph: OnnxGraph, name: str, zeroable: set[str]) -> dict[str, np.ndarray] | None:
    """The constants to zero so that tensor `name` is exactly 0, or None."""
    zeros: dict[str, np.ndarray] = {}

    def zero(constant: str) -> bool:
        stored = _stored(graph, constant)
        if stored != constant:  # a layout of an initializer only it reads: zero the initializer
            value, owned = graph.const(stored), stored in zeroable
            constant = stored
        else:
            value = graph.const(constant)
            owned = constant in zeroable and len(graph.consumers.get(constant, [])) == 1
        if value is None or not owned:
            return False
        zeros[constant] = np.zeros_like(value, dtype=np.float32)
        return True

    while (node := graph.producer.get(name)) is not None:
        kernel = node.input[1] if node.op_type in LINEAR and len(node.input) > 1 else None
        if kernel is not None and graph.const(kernel) is not None:
            biases = [n for n in node.input[2:3] if n]
            return zeros if all(zero(n) for n in [kernel, *biases]) else None
        name = _through_zero(graph, node, zero)
        if name is None:
            return None
    return None


def _stored(graph: OnnxGraph, constant: str) -> str:
    """The initializer a folded constant is a layout of: torch exports a Linear without bias
    as a MatMul of `Transpose(weight)`, which the folded graph reads as one constant, so the
    weight to zero is the Transpose's input (zeros in any layout are zeros). Followed in the
    model's own nodes, where the layout ops still are, while each reads a tensor only it reads."""
    nodes = graph.model.graph.node
    producers = {out: node for node in nodes for out in node.output}

    def readers(name: str) -> int:
        return sum(name in n.input for n in nodes)

    while (node := producers.get(constant)) is not None and node.op_type in LAYOUT:
        if readers(constant) != 1 or readers(node.input[0]) != 1:
            break
        constant = node.input[0]
    return constant


def _through_zero(
    graph: OnnxGraph, node: onnx.NodeProto, zero: Callable[[str], bool]
) -> str | None:
    """The one varying input of `node` at which 0 in gives 0 out, once `zero` has zeroed the
    constants added to it; None when there is no such input."""
    inputs = [n for n in node.input if n]
    varying = [n for n in inputs if graph.const(n) is None]
    if len(varying) != 1 or node.op_type not in ("Add", "Sub", "Mul", "Div", *ZERO_PRESERVING):
        return None
    if node.op_type in ("Add", "Sub") and not all(zero(n) for n in inputs if n not in varying):
        return None
    if node.op_type == "Div" and node.input[0] != varying[0]:
        return None  # c / x is not 0 at x = 0
    return varying[0]


def _unshared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy where `Identity(initializer)` nodes become initializers of their own.

    The torch exporter writes equal tensors once and the others as Identity nodes (a fresh
    BatchNorm's weight and running variance are both ones); the twin sets them apart.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name: i for i in model.graph.initializer}
    kept = []
    for node in model.graph.node:  # in graph order, so chains resolve front to back
        if node.op_type == "Identity" and node.input[0] in inits:
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            model.graph.initializer.append(copy)
            inits[copy.name] = copy
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def exact_grid_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose float initializers lie on power-of-two grids (module doc)."""
    twin = _unshared(model)
    graph = OnnxGraph.folded(twin)
    layers = find_binary_layers_in(graph)
    fixed: dict[str, np.ndarray] = _binary_kernels(layers)
    stored = {init.name for init in twin.graph.initializer}
    for node in graph.nodes:
        if node.op_type == "BatchNormalization":
            fixed.update(_batch_norm_params(graph, node, stored))
    fixed.update(zeroed_feeds(graph, layers))
    for k, init in enumerate(twin.graph.initializer):
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        value = numpy_helper.to_array(init)
        new = fixed.get(init.name)
        if new is None:
            new = value if np.all(np.abs(value) == 1.0) else grid_round(value)
        new = numpy_helper.from_array(new.astype(np.float32), init.name)
        twin.graph.initializer[k].CopyFrom(new)
    return twin


def twin_initializers(twin: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The twin's float initializers by name (to load into another copy of the model)."""
    return {
        init.name: numpy_helper.to_array(init)
        for init in twin.graph.initializer
        if init.data_type == onnx.TensorProto.FLOAT
    }
