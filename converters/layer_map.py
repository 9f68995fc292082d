"""Which PyTorch layer each op of an LCE flatbuffer comes from.

The translator (`converters.translate.onnx_to_tf`) emits every ONNX node's TensorFlow ops in a
name scope `MODULE/NODE`: MODULE is the PyTorch module path the exporter recorded for the node
(legacy exporter: its node name, `/features/features.2/Conv` -> `features.2`; dynamo exporter:
the node's `pkg.torch.onnx.name_scopes`), NODE the node's own name. The converters name each
flatbuffer tensor after the TensorFlow ops fused into the op that writes it, joined by `;`
(`features.3.q/Sign_1/Sign;features.2/Conv/Conv2D;...`), but cut to 50 characters, and an op
that writes a model output is named after the output instead. So:

- each op's layers come from the intact parts of its output tensor's name (the scope
  table that the translator records, `TranslationInfo.scopes`, resolves them; without it the
  MODULE part of the scope is read directly);
- a conv-like op (LceBconv2d, CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED), whose own conv
  is named last in a fused name and so is the first to be cut, is matched by position: the
  n-th such op not named is the n-th conv-like ONNX node (translation order) not named;
- any other op left without a name takes the layer of the op that feeds it.

Example:
    >>> module_path_of_name("/features/features.5/input_quantizer/Sign_1")
    'features.5.input_quantizer'
    >>> module_path_of_name("/layer1/layer1.0/conv1/Conv")
    'layer1.0.conv1'
    >>> module_path_of_name("/blocks/blocks.4/shortcut/shortcut.1/Conv")
    'blocks.4.shortcut.1'
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bnnexport.converters.flatbuffer import FlatOp, flatbuffer_ops

if TYPE_CHECKING:
    import onnx
    from bnnexport.converters.graph import OnnxGraph

TOP = "top"  # the module path of nodes the model's own forward() made, outside any submodule
INPUT_SCOPE, OUTPUT_SCOPE = "input", "output"  # the NCHW <-> NHWC transposes of serve()
CONV_NODES = ("Conv", "ConvTranspose", "MatMul", "Gemm")
CONV_OPS = ("LceBconv2d", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV")
NAME_LIMIT = 50  # the converters cut a tensor name to this many characters
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def module_path_of_name(node_name: str) -> str | None:
    """The PyTorch module path in a legacy exporter's node name, `TOP` for an op of the
    top-level forward(), None for a name no exporter wrote (e.g. a normaliser's node).

    Its scopes are the modules from the root, each named by its path from the last part that
    is not a number (`blocks.4.shortcut.1` -> `shortcut.1`, `blocks.0.0` -> `blocks.0.0`): a
    part that is its parent's name and numbers is one of the parent's numbered children."""
    if not node_name.startswith("/"):
        return None
    path = ""
    for part in (p for p in node_name.split("/")[1:-1] if p):
        parent = _unqualified(path) if path else ""
        rest = part[len(parent) + 1 :].split(".") if part.startswith(parent + ".") else []
        if path and rest and all(atom.isdigit() for atom in rest):
            path = f"{path}{part[len(parent) :]}"  # the parent's numbered child
        else:
            path = f"{path}.{part}" if path else part
    return path or TOP


def _unqualified(path: str) -> str:
    """A module path from its last part that is not a number (`a.b.3` -> `b.3`), as the
    legacy exporter names a scope."""
    atoms = path.split(".")
    last = max((k for k, atom in enumerate(atoms) if not atom.isdigit()), default=0)
    return ".".join(atoms[last:])


def module_path(node: onnx.NodeProto) -> str | None:
    """The PyTorch module path of an exported ONNX node (`module_path_of_name`), the dynamo
    exporter's metadata first."""
    for prop in node.metadata_props:
        if prop.key == _SCOPES_KEY:
            try:
                scopes = [s for s in ast.literal_eval(prop.value) if isinstance(s, str)]
            except (ValueError, SyntaxError):
                break
            # [root '', module scopes..., the op's own name]
            modules = [s for s in scopes[:-1] if s]
            return modules[-1] if modules else TOP
    return module_path_of_name(node.name)


def nearest_module(graph: OnnxGraph, node: onnx.NodeProto) -> str:
    """The node's module path; for a node no exporter named (one the normaliser made), the
    module of the nearest node after it (or before it) that has one."""
    found = module_path(node)
    if found is not None:
        return found
    seen, frontier = set(), [node]
    for _ in range(8):  # a short walk: a rewrite replaces a few nodes, never a whole layer
        ahead = []
        for current in frontier:
            for name in current.output:
                ahead += graph.consumers.get(name, [])
            for name in current.input:
                if name in graph.producer:
                    ahead.append(graph.producer[name])
        for candidate in ahead:
            if id(candidate) in seen:
                continue
            seen.add(id(candidate))
            found = module_path(candidate)
            if found is not None:
                return found
        frontier = ahead
    return TOP


def scope_name(module: str, node_name: str) -> str:
    """The TensorFlow name scope for a node: `MODULE/NODE`, both cut to the characters a scope
    may hold (`features.5/Conv` for `/features/features.5/Conv`)."""
    short = node_name.rstrip("/").rsplit("/", 1)[-1] or "node"
    clean = [re.sub(r"[^A-Za-z0-9_.\-]", "_", part) for part in (module, short)]
    return "/".join(p if p[:1].isalnum() or p[:1] == "." else f"n{p}" for p in clean)


@dataclass
class ScopeEntry:
    """One name scope of the translation: the ONNX node emitted in it and its module path."""

    scope: str
    node: str
    op_type: str
    module: str

    def to_json(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        return asdict(self)


@dataclass
class OpLayer:
    """One op of the flatbuffer (its index in the execution plan) and its source layers.

    `layer` is the PyTorch module path it is counted under; `layers` every module fused into
    it that its name shows; `how` says how `layer` was found: "name" (its tensor name),
    "order" (the n-th conv-like op), "input" (the op feeding it), or "none"."""

    index: int
    op_type: str
    layer: str
    layers: list[str]
    how: str
    binary: bool

    def to_json(self) -> dict[str, Any]:
        """The op as a JSON-ready dict."""
        return asdict(self)


def _components(names: list[str]) -> list[tuple[str, bool]]:
    """(component, intact) of every `;`-separated part of the op's output names."""
    out = []
    for name in names:
        parts = name.split(";")
        cut = len(name) >= NAME_LIMIT
        for k, part in enumerate(parts):
            if part:
                out.append((part, not (cut and k == len(parts) - 1)))
    return out


def _scope_of(component: str, intact: bool, table: dict[str, ScopeEntry]) -> str | None:
    """The recorded scope a name component was emitted in (the longest that prefixes it)."""
    if "/" not in component:
        return None
    parts = component.split("/")
    candidates = ["/".join(parts[:k]) for k in range(len(parts) - (1 if intact else 0), 0, -1)]
    for scope in candidates:
        if scope in table or scope in (INPUT_SCOPE, OUTPUT_SCOPE):
            return scope
    if not table and len(parts) >= 2:  # no table: MODULE/NODE/op by the translator's convention
        return "/".join(parts[:2])
    return None


def _layers_of(scope: str, table: dict[str, ScopeEntry]) -> list[str]:
    if scope in (INPUT_SCOPE, OUTPUT_SCOPE):
        return [f"({scope})"]
    entry = table.get(scope)
    return [entry.module if entry is not None else scope.split("/", 1)[0]]


def _is_conv(component: str, scope: str, table: dict[str, ScopeEntry]) -> bool:
    """True when an intact name part is the conv (or matmul) op of a conv-like node: the
    other ops in its scope (a bias add, a reshape) do not name the conv-like flatbuffer op."""
    entry = table.get(scope)
    node_is_conv = entry.op_type in CONV_NODES if entry is not None else True
    op = component[len(scope) + 1 :]
    return node_is_conv and bool(re.fullmatch(r"(Conv2D|DepthwiseConv2dNative|MatMul)(_\d+)?", op))


def op_layers(
    flatbuffer: str | Path | bytes,
    onnx_model: onnx.ModelProto | str | Path | None = None,
    scopes: list[ScopeEntry] | None = None,
) -> list[OpLayer]:
    """Map every op of the flatbuffer's main subgraph (in execution order) to the PyTorch
    layer(s) it comes from (module doc).

    `onnx_model` is the ONNX model the flatbuffer was converted from: its conv-like nodes, in
    graph order, name the conv-like ops whose own names were cut. `scopes` is the translator's
    table (`TranslationInfo.scopes`), when at hand: it resolves names exactly and gives the
    conv-like nodes in translation order instead. With neither, names alone are read."""
    entries = list(scopes or [])
    table = {e.scope: e for e in entries}
    convs = [e.module for e in entries if e.op_type in CONV_NODES]
    if not entries and onnx_model is not None:
        convs = conv_modules(onnx_model)
    ops = flatbuffer_ops(flatbuffer)
    result = [_by_name(op, table) for op in ops]
    _by_order(ops, result, convs)
    _by_input(ops, result)
    return result


def conv_modules(onnx_model: onnx.ModelProto | str | Path) -> list[str]:
    """The module paths of the model's Conv/MatMul/Gemm nodes, in graph order."""
    import onnx

    if not isinstance(onnx_model, onnx.ModelProto):
        onnx_model = onnx.load(str(onnx_model), load_external_data=False)
    nodes = [n for n in onnx_model.graph.node if n.op_type in CONV_NODES]
    return [module_path(n) or TOP for n in nodes]


def _by_name(op: FlatOp, table: dict[str, ScopeEntry]) -> OpLayer:
    """The op's layers from the intact parts of its output name; the primary layer is the
    conv-like node's for a conv-like op, else the first part's."""
    layers: list[str] = []
    primary = None
    conv_like = op.op_type in CONV_OPS
    for component, intact in _components(op.outputs):
        scope = _scope_of(component, intact, table)
        if scope is None:
            continue
        found = _layers_of(scope, table)
        layers += [m for m in found if m not in layers]
        if primary is None and (not conv_like or intact and _is_conv(component, scope, table)):
            primary = found[0]
    how = "name" if primary is not None else "none"
    binary = op.op_type.startswith("Lce")
    return OpLayer(op.index, op.op_type, primary or "", layers, how, binary)


def _by_order(ops: list[FlatOp], result: list[OpLayer], convs: list[str]) -> None:
    """Conv-like ops without a conv in their name: the n-th of them is the n-th conv-like
    ONNX node no op is named after (an execution order of the source model)."""
    named = {m.layer for op, m in zip(ops, result, strict=True)
             if m.how == "name" and op.op_type in CONV_OPS}  # fmt: skip
    pending = [module for module in convs if module not in named]
    for mapped in result:
        if mapped.how == "none" and mapped.op_type in CONV_OPS and pending:
            mapped.layer, mapped.how = pending.pop(0), "order"
            if mapped.layer not in mapped.layers:
                mapped.layers.insert(0, mapped.layer)


def _by_input(ops: list[FlatOp], result: list[OpLayer]) -> None:
    """Ops still without a layer take the layer of the op writing their first input."""
    writer = {name: k for k, op in enumerate(ops) for name in op.outputs}
    for k, mapped in enumerate(result):
        if mapped.how != "none":
            continue
        source = next((writer[n] for n in ops[k].inputs if n in writer and writer[n] < k), None)
        if source is not None and result[source].layer:
            mapped.layer, mapped.how = result[source].layer, "input"
            mapped.layers = mapped.layers or [mapped.layer]
