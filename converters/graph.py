"""An ONNX graph with its constants folded, in numpy: what both the pattern finder and the
translator walk.
 The torch exporter leaves constant subgraphs that are not folded (docs/LCE_NOTES.md "PyTorch to
 ONNX": `F.pad(x,
value=1)` exports a Pad whose pads come from a Shape/ConstantOfShape/Concat/Slice/Cast chain).
`Graph` evaluates every node whose inputs are all constants (initializers, Constant nodes, or
`Shape`
of a tensor with a static shape) with numpy, so later passes only see real tensors.

Example:
    >>> import onnx
    >>> graph = Graph(onnx.load("model.onnx"))           # doctest: +SKIP
    >>> graph.constants["/Cast_output_0"]                 # doctest: +SKIP
    array([0, 0, 1, 1, 0, 0, 1, 1])
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from converters.errors import InvalidModelError


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Load and check an ONNX file, raising `InvalidModelError` for anything unreadable."""
    path = Path(path)
    if not path.is_file():
        raise InvalidModelError(f"no such ONNX file: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as error:  # protobuf raises several types for truncated/foreign bytes
        raise InvalidModelError(f"{path} is not a readable ONNX model ({error})") from None
    if not model.graph.node:
        raise InvalidModelError(f"{path} is not an ONNX model (no graph nodes)")
    return model


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain Python values (strings decoded)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        out[attr.name] = value
    return out


def _slice(data, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _unsqueeze(data, axes):
    out = data
    for axis in sorted(int(a) % (data.ndim + len(axes)) for a in axes):
        out = np.expand_dims(out, axis)
    return out


# numpy evaluation of the ops that appear in constant subgraphs; (inputs, attrs) -> outputs
_FOLDERS: dict[str, Callable[[list, dict], np.ndarray]] = {
    "Identity": lambda i, a: i[0],
    "Cast": lambda i, a: i[0].astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"])),
    "ConstantOfShape": lambda i, a: np.full(
        [int(d) for d in i[0]],
        a["value"].reshape(-1)[0] if "value" in a else np.float32(0),
    ),
    "Concat": lambda i, a: np.concatenate(i, axis=a["axis"]),
    "Reshape": lambda i, a: i[0].reshape(
        [int(d) if d != 0 else i[0].shape[k] for k, d in enumerate(i[1])]
    ),
    "Transpose": lambda i, a: np.transpose(i[0], a.get("perm")),
    "Slice": lambda i, a: _slice(i[0], *i[1:]),
    "Unsqueeze": lambda i, a: _unsqueeze(i[0], i[1] if len(i) > 1 else a["axes"]),
    "Squeeze": lambda i, a: np.squeeze(
        i[0], tuple(int(x) for x in (i[1] if len(i) > 1 else a["axes"]))
    ),
    "Gather": lambda i, a: np.take(i[0], i[1], axis=a.get("axis", 0)),
    "Add": lambda i, a: i[0] + i[1],
    "Sub": lambda i, a: i[0] - i[1],
    "Mul": lambda i, a: i[0] * i[1],
    "Div": lambda i, a: (i[0] // i[1]) if i[0].dtype.kind in "iu" else i[0] / i[1],
    "Neg": lambda i, a: -i[0],
    "Abs": lambda i, a: np.abs(i[0]),
    "Sign": lambda i, a: np.sign(i[0]),
    "Equal": lambda i, a: i[0] == i[1],
    "Less": lambda i, a: i[0] < i[1],
    "Greater": lambda i, a: i[0] > i[1],
    "GreaterOrEqual": lambda i, a: i[0] >= i[1],
    "LessOrEqual": lambda i, a: i[0] <= i[1],
    "Not": lambda i, a: np.logical_not(i[0]),
    "Where": lambda i, a: np.where(i[0], i[1], i[2]),
    "Expand": lambda i, a: i[0] * np.ones([int(d) for d in i[1]], dtype=i[0].dtype),
    "Range": lambda i, a: np.arange(i[0], i[1], i[2]).astype(i[0].dtype),
}


def _copy(info: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    return out


class Graph:
    """ONNX graph view: constants folded with numpy, producers/consumers, static shapes."""

    def __init__(self, model: onnx.ModelProto):
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # inference is a help for folding `Shape`, never a requirement
            inferred = model
        self.model = model  # not the inferred copy: one copy of the weights is enough
        self.constants: dict[str, np.ndarray] = {
            init.name: numpy_helper.to_array(init) for init in model.graph.initializer
        }
        self.shapes: dict[str, list[int | None]] = {}
        known = inferred.graph
        for info in [*known.value_info, *known.input, *known.output]:
            dims = info.type.tensor_type.shape.dim
            self.shapes[info.name] = [
                d.dim_value if d.HasField("dim_value") else None for d in dims
            ]
        initializer_names = set(self.constants)
        # copies (small), so that nothing here keeps the inferred model (all its weights) alive
        self.inputs = [_copy(i) for i in known.input if i.name not in initializer_names]
        self.outputs = [_copy(o) for o in known.output]
        graph = model.graph
        del inferred, known
        self.nodes: list[onnx.NodeProto] = []  # nodes left after folding, in graph order
        self._fold(graph.node)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)

    def _fold(self, nodes) -> None:
        for node in nodes:
            if node.op_type == "Constant":
                attrs = attributes(node)
                value = next(iter(attrs.values()))
                self.constants[node.output[0]] = np.asarray(value)
                continue
            if node.op_type == "Shape":
                shape = self.shapes.get(node.input[0])
                if shape is not None and all(d is not None for d in shape):
                    self.constants[node.output[0]] = np.asarray(shape, dtype=np.int64)
                    continue
            folder = _FOLDERS.get(node.op_type)
            inputs = [name for name in node.input if name]
            if folder is not None and inputs and all(name in self.constants for name in inputs):
                values = [self.constants[name] for name in node.input if name]
                try:
                    self.constants[node.output[0]] = np.asarray(folder(values, attributes(node)))
                    continue
                except Exception:  # leave it for the translator to report
                    pass
            self.nodes.append(node)

    def const(self, name: str) -> np.ndarray | None:
        """The folded value of tensor `name`, or None when it depends on a graph input."""
        return self.constants.get(name)
