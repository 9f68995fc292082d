"""No silent float: every layer meant to be binary becomes an `LceBconv2d`, or is named.

A layer whose kernel is ±1 (or ±1 times a per-channel scale) and whose input is binarized is
meant to be binary. It can end up float in four ways, each named with its reason before any
flatbuffer is kept (docs/ARCHITECTURE.md, "Conversion gate", the check "no silent float"):

- it only looks binary: a ±1 kernel behind a plain sign, or sign(w) of a weight holding zeros
  (`lookalike_layers`);
- it is a grouped binary conv LCE cannot run binary (`grouped_refusals`), or a binary
  transposed conv, which LCE has no binary form of (`transposed_refusals`);
- the model's own record lists more binary layers than the graph shows (`unrecognised_layers`:
  the recorded layers the graph lost, each by its node, its PyTorch module and the cause
  `float_cause` finds, e.g. a reflect `Pad` between the binarization and the conv);
- the translator did not emit it binary, or LCE's converter made fewer `LceBconv2d` than were
  emitted (`fallback_reasons`, after translating; `float_fallbacks` from the graph alone).

`refuse_fallbacks` raises `FloatFallbackError` naming every reason the user did not allow
(`--allow-float LAYER` or `all`), and `refuse_unknown_layers` refuses an allowed name that is
no binary layer of the model. `converters.lce.convert_onnx` runs them before TensorFlow and
again after the converters.

Example:
    >>> unrecognised_layers(None, [RecordedLayer("w", "top", "conv2d", (8, 8, 3, 3))], ["/Conv"])
    {}
    >>> refuse_fallbacks({"/conv/Conv": "why"}, allowed=["/conv/Conv"])
    ['/conv/Conv']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from bnnexport.converters.errors import FloatFallbackError, UnknownLayerError
from bnnexport.converters.graph import OnnxGraph, attributes
from bnnexport.converters.layer_map import TOP, nearest_module
from bnnexport.converters.patterns import (
    TO_LAYER,
    classify_kernel,
    find_binary_layers_in,
    find_lookalike_layers_in,
    match_binarization,
    sign_zeros,
    trace_binarized,
)
from bnnexport.converters.translate import plan_binary_groups

LCE_CONVERTER = "(LCE converter)"  # the fallback LCE's converter made, not the translator
# the layers a record's kernel can be in the graph
RECORDED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
TRANSPOSED_WHY = (
    "a binary transposed convolution (binarized input, ±1 kernel): LCE has no binary "
    "transposed conv (LceBconv2d is a forward convolution), so it would run as a float "
    "TRANSPOSE_CONV; to keep it binary, write the upsampling as a binary conv to C x stride² "
    "channels followed by a pixel shuffle written as reshape -> permute -> reshape "
    "(nn.PixelShuffle exports as DepthToSpace, which does not convert)"
)


@dataclass(frozen=True)
class RecordedLayer:
    """A binary layer (binary kernel, binarized input) as the model's own framework recorded
    it: the kernel's parameter name, the PyTorch module whose forward calls it (`TOP`: the
    model's own forward()), the call ("conv2d", "linear") and the kernel's shape."""

    kernel: str
    module: str = TOP
    op: str = ""
    shape: tuple[int, ...] = ()

    def described(self) -> str:
        """ "kernel b2.weight (conv2d in PyTorch module 'b2')"."""
        where = "the model's own forward()" if self.module == TOP else f"module {self.module!r}"
        call = f"{self.op} in " if self.op else ""
        return f"kernel {self.kernel} ({call}{where})"


def lookalike_layers(graph: OnnxGraph) -> dict[str, str]:
    """Layer -> why, for layers that look binary but are not: a ±1 kernel behind a plain sign
    the converter does not take as a binarization, or a binarized input with a kernel that is
    ±1 but for exact zeros (sign(w) of a weight holding zeros)."""
    found = {
        layer.node_name: (
            f"its ±1 kernel reads a plain {layer.seen}, which maps 0 to 0 (not a binarization): "
            "binarize with sign(sign(x) + 0.1) or where(x >= 0, 1, -1)"
        )
        for layer in find_lookalike_layers_in(graph)
    }
    found.update(padded_layers(graph))
    for match in find_binary_layers_in(graph):
        zeros = sign_zeros(match)
        if zeros:
            found[match.node_name] = (
                f"its kernel is ±1 but for {zeros} exact zeros of {match.kernel.size} values "
                "(sign(w) maps 0 to 0: ternary, not binary): binarize the weight with "
                "torch.where(w >= 0, 1.0, -1.0)"
            )
    return found


def padded_layers(graph: OnnxGraph) -> dict[str, str]:
    """Layer -> why, for a conv with a ±1 kernel that reads a binarization through a `Pad` of
    another mode than constant (reflect, edge): binary but for a padding LCE cannot do."""
    found = {}
    for node in graph.nodes:
        kernel = graph.const(node.input[1]) if len(node.input) > 1 else None
        if node.op_type != "Conv" or kernel is None or kernel.dtype.kind != "f":
            continue
        pad = _mode_pad(graph, node)
        if pad is not None and classify_kernel(kernel, 0)[2] == 0:
            found[node.name or node.output[0]] = _pad_cause(graph, pad)
    return found


def grouped_refusals(graph: OnnxGraph) -> dict[str, str]:
    """Binary layer -> why, for grouped binary convs LCE cannot run binary
    (`converters.translate.groups.plan_binary_groups`)."""
    why = {}
    nodes = {node.name or node.output[0]: node for node in graph.nodes}
    for match in find_binary_layers_in(graph):
        node = nodes[match.node_name]
        group = int(attributes(node).get("group", 1)) if match.op_type == "Conv" else 1
        if match.binary and group > 1:
            plan = plan_binary_groups(match.kernel.shape[1] * group, group)
            if plan.kind == "refuse":
                why[match.node_name] = plan.why
    return why


def transposed_refusals(graph: OnnxGraph) -> dict[str, str]:
    """ConvTranspose node -> why, for every transposed conv whose input is binarized and whose
    kernel is ±1 (or ±1 times a scale per output channel): meant binary, and LCE cannot run
    it so."""
    why = {}
    for node in graph.nodes:
        kernel = graph.const(node.input[1]) if len(node.input) > 1 else None
        if node.op_type != "ConvTranspose" or kernel is None or kernel.dtype.kind != "f":
            continue
        strict, scale, _, _ = classify_kernel(kernel, 1)  # its kernel is [in, out / group, ...]
        if (strict or scale is not None) and trace_binarized(graph, node.input[0]) is not None:
            why[node.name or node.output[0]] = TRANSPOSED_WHY
    return why


def unrecognised_layers(
    graph: OnnxGraph | None, recorded: Sequence[RecordedLayer], binary: Sequence[str]
) -> dict[str, str]:
    """Layer -> why, for each layer the model's own record lists as binary that the graph does
    not show binary (none when the graph shows as many binary layers as the record): the
    layer's ONNX node (found by its PyTorch module and kernel shape) with the cause
    (`float_cause`), or "(unrecognised) KERNEL" where no node of the graph matches."""
    if len(binary) >= len(recorded) or graph is None:
        return {}
    counts = f"the model's record lists {len(recorded)} binary layers, the ONNX graph shows "
    counts += f"{len(binary)}"
    why = {}
    for layer, node in _lost_layers(graph, recorded, set(binary)):
        if node is None:
            name, cause = f"(unrecognised) {layer.kernel}", _UNRECOGNISED
        else:
            name, cause = node.name or node.output[0], float_cause(graph, node)
        why[name] = f"{layer.described()} is binary in the record, float in the graph ({counts})"
        why[name] += f": {cause}"
    return why or {"(unrecognised)": f"{counts}: {_UNRECOGNISED}"}


_UNRECOGNISED = (
    "its binarization is written in a form the normaliser does not recognise "
    "(docs/LCE_NOTES.md 'Real-world exports' lists the forms it takes)"
)


def _lost_layers(
    graph: OnnxGraph, recorded: Sequence[RecordedLayer], binary: set[str]
) -> list[tuple[RecordedLayer, onnx.NodeProto | None]]:
    """The recorded layers whose node in the graph is not binary (or that have none), each with
    its node: the first unclaimed layer node of its module and kernel shape, in graph order,
    else the first of its kernel shape in any module."""
    nodes = [n for n in graph.nodes if n.op_type in RECORDED_OPS and _kernel_shape(graph, n)]
    claimed: set[int] = set()
    lost = []
    for layer in recorded:
        fits = [n for n in nodes if id(n) not in claimed and _fits(graph, n, layer.shape)]
        same = [n for n in fits if nearest_module(graph, n) == layer.module]
        node = (same or fits or [None])[0]
        if node is not None:
            claimed.add(id(node))
        if node is None or (node.name or node.output[0]) not in binary:
            lost.append((layer, node))
    return lost


def _kernel_shape(graph: OnnxGraph, node: onnx.NodeProto) -> tuple[int, ...] | None:
    kernel = graph.const(node.input[1]) if len(node.input) > 1 else None
    return tuple(kernel.shape) if kernel is not None and kernel.dtype.kind == "f" else None


def _fits(graph: OnnxGraph, node: onnx.NodeProto, shape: tuple[int, ...]) -> bool:
    """Whether `node`'s kernel can be a parameter of `shape` (a dense layer's constant may be
    the parameter transposed: x @ w.t(), or the exporter's [in, out] MatMul)."""
    found = _kernel_shape(graph, node)
    return not shape or found in (tuple(shape), tuple(shape)[::-1])


def float_cause(graph: OnnxGraph, node: onnx.NodeProto) -> str:
    """Why a layer the record calls binary is float in the graph, and what to write instead:
    a transposed conv; a `Pad` that is not a constant 0 or ±1 between its binarization and it;
    else the node its input comes from, which is no binarization the normaliser knows."""
    if node.op_type == "ConvTranspose":
        return TRANSPOSED_WHY
    pad = _mode_pad(graph, node)
    if pad is not None:
        return _pad_cause(graph, pad)
    source = node.input[0]
    for _ in range(32):  # back through the ops a binarization may pass on its way to a layer
        producer = graph.producer.get(source)
        if producer is None or producer.op_type not in TO_LAYER:
            break
        source = producer.input[0]
    if producer is None:
        return f"its input is the graph's input {source!r}, which is not binarized"
    name = producer.name or producer.output[0]
    return f"its input comes from {producer.op_type} node {name!r}: {_UNRECOGNISED}"


def _mode_pad(graph: OnnxGraph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The first Pad of another mode than constant on the way from `node`'s input back to a
    binarization (through the ops a binarization may pass to reach a layer); None when there
    is none, or no binarization behind it."""
    source, pad = node.input[0], None
    for _ in range(32):
        if pad is not None and match_binarization(graph, source) is not None:
            return pad
        producer = graph.producer.get(source)
        if producer is None or producer.op_type not in TO_LAYER:
            return None
        if producer.op_type == "Pad" and _pad_mode(producer) != "constant" and pad is None:
            pad = producer
        source = producer.input[0]
    return None


def _pad_mode(node: onnx.NodeProto) -> str:
    mode = attributes(node).get("mode", "constant")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def _pad_cause(graph: OnnxGraph, pad: onnx.NodeProto) -> str:
    """A reflect or edge (replicate) Pad between a binarization and its conv: what LCE pads
    with, and the same function written so it converts: the padding before the binarization
    (it copies values, and the sign of a copy is the copy of the sign)."""
    mode = _pad_mode(pad)
    torch_mode = {"edge": "replicate"}.get(mode, mode)
    pads = graph.const(pad.input[1]) if len(pad.input) > 1 and pad.input[1] else None
    pads = [int(p) for p in (pads if pads is not None else attributes(pad).get("pads", []))]
    spatial = (pads[3], pads[7], pads[2], pads[6]) if len(pads) == 8 else tuple(pads)
    where = f"Pad node {(pad.name or pad.output[0])!r} pads its binarized input in {mode} mode"
    where += f" (padding_mode={torch_mode!r}, F.pad {spatial})"
    lce = (
        "LCE's binary conv pads a binarized input only with a constant: 0 (torch's "
        "padding_mode='zeros') or +1"
    )
    if mode == "reflect":
        fix = (
            f"pad before the sign instead, F.pad(x, {spatial}, mode='reflect'), then the sign "
            "and the conv with padding=0: the same function, and it converts"
        )
    else:
        fix = (
            "pad before the sign instead, with slices: torch.cat([x[..., :1], x, x[..., -1:]], "
            "-1) for the width and likewise (dim -2) for the height, then the sign and the "
            "conv with padding=0: the same function, and it converts"
        )
    return f"{where}; {lce}; {fix}"


def float_fallbacks(
    graph: OnnxGraph, emitted: Sequence[str], histogram: dict[str, int]
) -> dict[str, str]:
    """Layer -> why it is not an `LceBconv2d`, for every binary or binary-looking layer."""
    binary = [m.node_name for m in find_binary_layers_in(graph) if m.binary]
    known = {**lookalike_layers(graph), **grouped_refusals(graph), **transposed_refusals(graph)}
    return fallback_reasons(known, binary, emitted, histogram)


def fallback_reasons(
    lookalikes: dict[str, str],
    binary: Sequence[str],
    emitted: Sequence[str],
    histogram: dict[str, int],
) -> dict[str, str]:
    """`float_fallbacks` from what it needs of the graph: the reasons known before translating
    (look-alike layers, grouped convs LCE cannot run binary) and its binary layers."""
    why = dict(lookalikes)
    for name in binary:
        if name not in emitted:
            why.setdefault(name, "the translator has no binary form for the ops around it")
    if histogram.get("LceBconv2d", 0) < len(emitted):
        why[LCE_CONVERTER] = (
            f"LCE made {histogram.get('LceBconv2d', 0)} of the {len(emitted)} binary layers "
            "emitted an LceBconv2d"
        )
    return why


def refuse_unknown_layers(allowed: Sequence[str], layers: Sequence[str], onnx_path: Path) -> None:
    """UnknownLayerError for a name in `allowed` that is none of the model's binary (or
    binary-looking) `layers` nor "all": a misspelt layer would otherwise be allowed silently,
    and the one meant refused or kept binary. The LCE converter's own fallback, which the
    fallback error names "(LCE converter)", may be allowed too."""
    known = {*layers, "all", LCE_CONVERTER}
    unknown = [name for name in allowed if name not in known]
    if unknown:
        listed = ", ".join(sorted(set(layers))) if layers else "none"
        raise UnknownLayerError(
            f"--allow-float {unknown[0]!r}: {onnx_path.name} has no binary layer of that name; "
            f"its binary layers (ONNX node names): {listed} (or 'all')"
        )


def refuse_fallbacks(why: dict[str, str], allowed: Sequence[str]) -> list[str]:
    """The allowed fallbacks; FloatFallbackError naming every other one."""
    refused = {k: v for k, v in why.items() if "all" not in allowed and k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {v}" for k, v in refused.items())
        raise FloatFallbackError(
            f"{len(refused)} binary layer(s) would stay float: {listed} "
            "(--allow-float LAYER or --allow-float all keeps them float)"
        )
    return sorted(why)
