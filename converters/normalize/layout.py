"""Passes that move layout ops out of the way between a binarization and its layer.

- ``pad-transpose``: binarization -> constant `Pad` -> `Transpose` -> layer becomes
  binarization -> `Transpose` -> `Pad` (pads permuted): tf2onnx's one-padded binary convs;
- ``reshape-transpose``: a `Reshape` just before or after a layer's binarization that only
  moves axes of length 1 (tf2onnx's `[N, 1, 1, C] -> [N, C, 1, 1]` before larq-zoo
  BinaryAlexNet's dense layers, written as 1x1 convs) becomes the `Transpose` it equals, which
  `transpose-binarized` and `transpose-sink` move and cancel and the translator reads as
  NHWC -> NCHW;
- ``transpose-binarized``: a `Transpose` or `Reshape` between a binarization and its layer (or
  the layer's Pad) is moved before the binarization (tf2onnx, NHWC), so the binarization feeds
  the layer directly;
- ``transpose-sink``: a Transpose moves below a Mul/Add by a constant, and two Transposes that
  undo each other vanish: tf2onnx's NHWC <-> NCHW pairs around each Conv cancel.

When each runs: `converters.normalize.fixpoint.PIPELINE`.
"""

from __future__ import annotations

import numpy as np
import onnx
from bnnexport.converters.graph import ONNX_DOMAINS, OnnxGraph, is_static
from bnnexport.converters.normalize.binarization import (
    binarized_source,
    canonical_binarization,
    feeds_layer,
    is_canonical,
)
from bnnexport.converters.normalize.registry import count_rewrites, rewrite
from bnnexport.converters.patterns import LAYER_OPS
from onnx import helper


def _pad_spec(graph: OnnxGraph, node: onnx.NodeProto) -> list[int] | None:
    """The pads of a constant-mode Pad whose pads and fill value are constants (the fill left
    where it is), or None: any other Pad (reflect/edge, computed pads, negative pads that
    crop, an `axes` input) is not one `pad_transpose` can move."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    if len(node.input) > 3 and node.input[3]:
        return None
    if len(node.input) > 2 and node.input[2] and graph.scalar(node.input[2]) is None:
        return None
    if len(node.input) > 1 and node.input[1]:
        pads = graph.constants.get(node.input[1])
    else:  # opset < 11: pads (and the value) are attributes
        pads = attrs.get("pads")
    if pads is None:
        return None
    pads = np.asarray(pads)
    if pads.dtype.kind not in "iu" or pads.ndim != 1 or np.any(pads < 0):
        return None
    return [int(p) for p in pads]


@rewrite("pad-transpose")
def pad_transpose(graph: OnnxGraph) -> int:
    """Binarize -> constant Pad -> Transpose(perm) -> layer becomes Binarize -> Transpose(perm)
    -> Pad with the pads permuted by perm: output axis k of the Transpose is input axis
    perm[k], so it gets that axis' pads, and the fill is the same everywhere. tf2onnx writes
    larq's one-padded binary convs (QuickNet) so, with the Pad on the NHWC tensor; once the
    Transpose is next to the binarization, `transpose-binarized` moves it above, and the
    translator finds binarize -> Pad on NCHW spatial axes -> Conv, a form it emits as binary.
    Only Pads after a binarization on the way to a layer move: float Pads keep the form the
    translator already reads."""
    changed = 0
    for node in list(graph.nodes):
        found = _movable_pad(graph, node)
        if found is None:
            continue
        pad, perm, pads = found
        graph.replace(node, _transposed_then_padded(graph, node, pad, perm, pads))
        graph.remove(pad)
        changed += 1
    count_rewrites(graph, "pad-transpose", changed)
    return changed


def _movable_pad(
    graph: OnnxGraph, node: onnx.NodeProto
) -> tuple[onnx.NodeProto, list[int], list[int]] | None:
    """(Pad, perm, pads) when `node` is a Transpose(perm) of a constant Pad (`_pad_spec`) of a
    canonical binarization, read by nothing else, on the way to a layer; else None."""
    perm = _perm(node) if node.op_type == "Transpose" else None
    path = graph.match_parent_path(node, ["Pad"], [0]) if perm is not None else None
    if path is None or path[0].domain not in ONNX_DOMAINS:
        return None
    (pad,) = path
    pads = _pad_spec(graph, pad)
    rank = len(perm)
    if pads is None or len(pads) != 2 * rank or sorted(perm) != list(range(rank)):
        return None
    if len(graph.consumers.get(pad.output[0], [])) != 1 or pad.output[0] in {
        o.name for o in graph.outputs
    }:
        return None
    binarization = graph.producer.get(pad.input[0])
    if binarization is None or not is_canonical(graph, binarization):
        return None
    if not feeds_layer(graph, node.output[0]):
        return None
    return pad, perm, pads


def _transposed_then_padded(
    graph: OnnxGraph,
    node: onnx.NodeProto,
    pad: onnx.NodeProto,
    perm: list[int],
    pads: list[int],
) -> list[onnx.NodeProto]:
    """Transpose(perm) of the Pad's input, then the Pad with its pads permuted by perm (begin
    and end halves alike), computing what `node` (Transpose(perm) of the Pad) computed."""
    rank = len(perm)
    moved = [pads[perm[k]] for k in range(rank)] + [pads[rank + perm[k]] for k in range(rank)]
    transposed = graph.fresh(f"{pad.input[0]}__transposed")
    shifted = helper.make_node("Transpose", [pad.input[0]], [transposed], perm=perm,
                               name=graph.fresh("Transpose"))  # fmt: skip
    inputs = [transposed, *pad.input[1:]]
    padded = helper.make_node("Pad", inputs, [node.output[0]], name=graph.fresh("Pad"))
    padded.attribute.extend(a for a in pad.attribute if a.name != "pads")
    if len(pad.input) > 1 and pad.input[1]:
        padded.input[1] = graph.add_const(np.asarray(moved, np.int64), f"{pad.input[1]}__moved")
    else:
        padded.attribute.append(helper.make_attribute("pads", moved))
    return [shifted, padded]


def _reshape_target(graph: OnnxGraph, node: onnx.NodeProto) -> list[int] | None:
    """The output shape of a Reshape whose input shape is static and whose target is a
    constant (0 copies the input's dim unless `allowzero`, -1 takes what is left), or None."""
    source = graph.shape(node.input[0])
    target = graph.constants.get(node.input[1]) if len(node.input) > 1 else None
    if not is_static(source) or target is None or np.asarray(target).ndim != 1:
        return None
    allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
    dims = [int(d) for d in np.asarray(target)]
    if allowzero and 0 in dims:
        return None  # a zero-sized tensor: nothing a layer reads
    dims = [source[k] if d == 0 and k < len(source) else d for k, d in enumerate(dims)]
    return _inferred_dims(int(np.prod(source)), dims)


def _inferred_dims(total: int, dims: list[int]) -> list[int] | None:
    """`dims` with its one -1 (if any) resolved so they hold `total` elements, or None."""
    if dims.count(-1) > 1 or any(d < -1 or d == 0 for d in dims):
        return None
    known = int(np.prod([d for d in dims if d != -1]))
    if -1 in dims:
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return dims if int(np.prod(dims)) == total else None


def unit_perm(source: list[int], target: list[int]) -> list[int] | None:
    """The perm of a Transpose equal to reshaping `source` to `target`, or None. Row-major
    order only sees the axes longer than 1, so when those keep their order (and the rank is the
    same) the reshape only moves unit axes: non-unit output axes take the non-unit input axes
    in order, unit output axes the unit input axes in order."""
    if len(source) != len(target):
        return None
    big_in = [k for k, d in enumerate(source) if d != 1]
    big_out = [k for k, d in enumerate(target) if d != 1]
    if [source[k] for k in big_in] != [target[k] for k in big_out]:
        return None
    units = iter(k for k, d in enumerate(source) if d == 1)
    bigs = iter(big_in)
    return [next(bigs) if d != 1 else next(units) for d in target]


@rewrite("reshape-transpose")
def reshape_transpose(graph: OnnxGraph) -> int:
    """Binarize -> Reshape -> layer, or Reshape -> Binarize -> layer, where the Reshape only
    moves axes of length 1 (tf2onnx's `[N, 1, 1, C] -> [N, C, 1, 1]` before larq-zoo
    BinaryAlexNet's 1x1 binary convs on a 1x1 input, its dense layers), becomes the Transpose
    it equals: the same data, and a form `transpose-binarized` and `transpose-sink` move and
    cancel, and the translator reads as NHWC -> NCHW, as for the other NHWC convs. Both orders,
    because the shapes often become static only once `fold-constants` has folded the target
    (tf2onnx computes a Keras Reshape's target from `Shape`), which may be rounds after
    `transpose-binarized` moved the Reshape above the binarization (`PIPELINE`). Only with a
    static input shape and a constant target; a Reshape that reorders data (two axes longer
    than 1 swap places) or changes the rank stays."""
    # the tensors binarized on their way to a layer (the rewrite below keeps every name)
    binarized = {
        binarized_source(graph, b)
        for b in graph.nodes
        if is_canonical(graph, b) and feeds_layer(graph, b.output[0])
    }
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "Reshape" or node.domain not in ONNX_DOMAINS:
            continue
        where = graph.producer.get(node.input[0])
        after = where is not None and is_canonical(graph, where)
        if not (after and feeds_layer(graph, node.output[0])) and (node.output[0] not in binarized):
            continue
        target = _reshape_target(graph, node)
        perm = unit_perm(graph.shape(node.input[0]), target) if target is not None else None
        if perm is None or perm == list(range(len(perm))):
            continue
        moved = helper.make_node("Transpose", [node.input[0]], [node.output[0]], perm=perm,
                                 name=graph.fresh("Transpose"))  # fmt: skip
        graph.replace(node, [moved])
        changed += 1
    count_rewrites(graph, "reshape-transpose", changed)
    return changed


@rewrite("transpose-binarized")
def transpose_binarized(graph: OnnxGraph) -> int:
    """Binarize(x) -> Transpose/Reshape -> layer (or -> Pad -> layer) becomes
    Transpose/Reshape(x) -> Binarize -> layer: the binarization is elementwise, so both orders
    give the same tensor, and the translator then sees the binarization right before the
    layer's data input (or its Pad)."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type not in ("Transpose", "Reshape"):
            continue
        where = graph.producer.get(node.input[0])
        if where is None or not is_canonical(graph, where):
            continue
        if len(graph.consumers.get(where.output[0], [])) != 1:
            continue
        readers = graph.consumers.get(node.output[0], [])
        # directly, or through a Pad (after `pad-transpose`): forms the translator emits
        padded = [p.output[0] for p in readers if p.op_type == "Pad" and len(readers) == 1]
        readers = [*readers, *(r for p in padded for r in graph.consumers.get(p, []))]
        if not any(r.op_type in LAYER_OPS for r in readers):
            continue
        source = binarized_source(graph, where)
        moved = graph.fresh(f"{source}__moved")
        shifted = helper.make_node(node.op_type, [source, *node.input[1:]], [moved],
                                   name=graph.fresh(node.op_type))  # fmt: skip
        shifted.attribute.extend(node.attribute)
        graph.replace(node, [shifted, *canonical_binarization(graph, moved, node.output[0])])
        changed += 1
    count_rewrites(graph, "transpose-binarized", changed)
    return changed


def _inverse(perm: list[int]) -> list[int]:
    return [perm.index(k) for k in range(len(perm))]


def _perm(node: onnx.NodeProto) -> list[int] | None:
    found = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return found[0] if found else None


@rewrite("transpose-sink")
def transpose_sink(graph: OnnxGraph) -> int:
    """Move a Transpose after a Mul/Add/Sub/Div by a constant (tf2onnx's BatchNorm on NHWC)
    below it, with the constant transposed to match, and drop two Transposes that undo each
    other: tf2onnx's NHWC <-> NCHW pairs around every Conv cancel, and the constants become
    per-channel on ONNX's channel axis, where the translator fuses them into the binary conv."""
    changed = 0
    outputs = {o.name for o in graph.outputs}
    progress = True
    while progress:
        progress = False
        for node in list(graph.nodes):
            if node.op_type != "Transpose" or node.output[0] in outputs:
                continue
            perm, readers = _perm(node), graph.consumers.get(node.output[0], [])
            if perm is None or len(readers) != 1:
                continue
            (reader,) = readers
            if reader.output[0] in outputs:
                continue
            if reader.op_type == "Transpose" and _perm(reader) == _inverse(perm):
                graph.remove(reader)
                graph.rename_uses(reader.output[0], node.input[0])
                graph.remove(node)  # its only reader is gone
                changed, progress = changed + 1, True
                break
            if reader.op_type not in ("Mul", "Add", "Sub", "Div"):
                continue
            k = list(reader.input).index(node.output[0])
            other = reader.input[1 - k]
            if other not in graph.constants or graph.constants[other].ndim > len(perm):
                continue
            value = graph.constants[other]
            value = value.reshape((1,) * (len(perm) - value.ndim) + value.shape)
            moved = graph.add_const(np.transpose(value, _inverse(perm)), f"{other}__moved")
            inner = graph.fresh(f"{reader.output[0]}__before")
            operands = [node.input[0], moved] if k == 0 else [moved, node.input[0]]
            # the reader becomes the op on the untransposed tensor, the Transpose follows it
            graph.replace(reader, [
                helper.make_node(reader.op_type, operands, [inner], name=graph.fresh("sunk")),
                helper.make_node("Transpose", [inner], [reader.output[0]], perm=perm,
                                 name=graph.fresh("Transpose")),
            ])  # fmt: skip
            graph.remove(node)
            changed, progress = changed + 1, True
            break
    count_rewrites(graph, "transpose-sink", changed)
    return changed
