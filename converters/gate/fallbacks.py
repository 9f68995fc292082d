"""No silent float: every layer meant to be binary becomes an `LceBconv2d`, or is named.

A layer whose kernel is ±1 (or ±1 times a per-channel scale) and whose input is binarized is
meant to be binary. It can end up float in four ways, each named with its reason before any
flatbuffer is kept (docs/ARCHITECTURE.md, "Conversion gate", the check "no silent float"):

- it only looks binary: a ±1 kernel behind a plain sign, or sign(w) of a weight holding zeros
  (`lookalike_layers`);
- it is a grouped binary conv LCE cannot run binary (`grouped_refusals`);
- the model's own record lists more binary layers than the graph shows (`unrecognised_layers`);
- the translator did not emit it binary, or LCE's converter made fewer `LceBconv2d` than were
  emitted (`fallback_reasons`, after translating; `float_fallbacks` from the graph alone).

`refuse_fallbacks` raises `FloatFallbackError` naming every reason the user did not allow
(`--allow-float LAYER` or `all`), and `refuse_unknown_layers` refuses an allowed name that is
no binary layer of the model. `converters.lce.convert_onnx` runs them before TensorFlow and
again after the converters.

Example:
    >>> unrecognised_layers(found=2, expected=2)
    {}
    >>> refuse_fallbacks({"/conv/Conv": "why"}, allowed=["/conv/Conv"])
    ['/conv/Conv']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from converters.errors import FloatFallbackError, UnknownLayerError
from converters.graph import OnnxGraph, attributes
from converters.patterns import find_binary_layers_in, find_lookalike_layers_in, sign_zeros
from converters.translate import plan_binary_groups

LCE_CONVERTER = "(LCE converter)"  # the fallback LCE's converter made, not the translator


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
    for match in find_binary_layers_in(graph):
        zeros = sign_zeros(match)
        if zeros:
            found[match.node_name] = (
                f"its kernel is ±1 but for {zeros} exact zeros of {match.kernel.size} values "
                "(sign(w) maps 0 to 0: ternary, not binary): binarize the weight with "
                "torch.where(w >= 0, 1.0, -1.0)"
            )
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


def unrecognised_layers(found: int, expected: int) -> dict[str, str]:
    """{"(unrecognised)": why} when the graph shows fewer binary layers than the model's own
    record of binary kernels says it has, else {}."""
    if found >= expected:
        return {}
    return {
        "(unrecognised)": (
            f"the model's record lists {expected} binary layers, the ONNX graph shows {found}: "
            f"{expected - found} binarization(s) are written in a form the normaliser does not "
            "recognise (docs/LCE_NOTES.md 'Real-world exports' lists the forms it takes)"
        )
    }


def float_fallbacks(
    graph: OnnxGraph, emitted: Sequence[str], histogram: dict[str, int]
) -> dict[str, str]:
    """Layer -> why it is not an `LceBconv2d`, for every binary or binary-looking layer."""
    binary = [m.node_name for m in find_binary_layers_in(graph) if m.binary]
    known = {**lookalike_layers(graph), **grouped_refusals(graph)}
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
