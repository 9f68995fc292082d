"""ONNX Runtime as a `converters.gate.SignProbe`: read and impose every binarization's signs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bnnexport.converters.gate.predicate import Witness
from bnnexport.converters.graph import OnnxGraph, load_onnx
from bnnexport.converters.patterns import binarizations_in
from bnnexport.converters.runtimes import check_input_shape, ort_session


class OnnxProbe:
    """The ONNX model in ONNX Runtime, rewired so every binarization's signs can be imposed.

    For each binarization input `x` (non-constant source of a binarization pattern) the graph
    gets inputs `tie_mask_k`, `tie_value_k` and feeds its binarizations `Where(mask, value, x)`;
    `x` itself becomes an output. It runs in `converters.runtimes.ort_session`, as `run_onnx` does.
    `extra` names tensors the witness also gives (by name): a QDQ model's int8 activations, for a
    reference that imposes them (`bnnexport.stages.torch_probe.TorchProbe`).
    """

    def __init__(self, onnx_path: str | Path | onnx.ModelProto, extra: Sequence[str] = ()):
        model = onnx_path if isinstance(onnx_path, onnx.ModelProto) else load_onnx(onnx_path)
        own = {o.name for o in model.graph.output}  # an extra tensor among them: the logits
        model, self.sources = _rewired(model)
        self.logits = [t for t in extra if t in own]
        self.extra = [t for t in extra if t not in own and t not in self.sources]
        make_info = onnx.helper.make_tensor_value_info
        model.graph.output.extend(make_info(t, onnx.TensorProto.FLOAT, None) for t in self.extra)
        self.session = ort_session(model.SerializeToString())
        self.input = self.session.get_inputs()[0]

    def run(
        self, x: np.ndarray, imposed: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        feed = imposing_feed(self.input, x, len(self.sources), imposed)
        outputs = self.session.run(None, feed)
        return outputs[0][0], [o[0] for o in outputs[1:]]

    def witness(self) -> Witness:
        """ONNX Runtime as a candidate: its logits and binarization inputs, sign(0) = +1 (and
        the `extra` tensors)."""

        def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            logits, values = self.run(x)
            found = dict(zip([*self.sources, *self.extra], values, strict=True))
            return logits, {**found, **dict.fromkeys(self.logits, logits)}

        return Witness(run=run)


def imposing_feed(
    session_input: Any, x: np.ndarray, sources: int, imposed: list[np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The feed of a session made by `imposable`: sample `x` (repeated to a fixed batch) on
    `session_input`, and for each of the `sources` binarization inputs its `tie_mask_k` and
    `tie_value_k`: the `imposed` signs (broadcast over the batch axis), or nothing imposed."""
    check_input_shape(session_input.shape, np.asarray(x)[None], "the ONNX model")
    batch = session_input.shape[0] if isinstance(session_input.shape[0], int) else 1
    feed = {session_input.name: np.repeat(x[None].astype(np.float32), batch, axis=0)}
    for k in range(sources):
        mask, value = np.zeros(1, dtype=bool), np.zeros(1, dtype=np.float32)
        if imposed is not None:
            value = np.asarray(imposed[k], np.float32)[None]
            mask = np.ones(value.shape, dtype=bool)
        feed[f"tie_mask_{k}"], feed[f"tie_value_{k}"] = mask, value
    return feed


def _rewired(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of `model` with the probe's inputs and outputs, and its binarization sources."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for k, node in enumerate(model.graph.node):  # the rewiring finds nodes by name
        node.name = node.name or f"__node_{k}"
    graph = OnnxGraph.folded(model)
    consumers: dict[str, list[str]] = {}
    for found in binarizations_in(graph):
        consumers.setdefault(found.source, []).append(found.nodes[0])
    return imposable(model, consumers, "tie"), list(consumers)


def imposable(
    model: onnx.ModelProto, readers: Mapping[str, Sequence[str]], prefix: str
) -> onnx.ModelProto:
    """A copy of `model` in which, for the k-th tensor `t` of `readers`, the nodes named in
    `readers[t]` read `Where(PREFIX_mask_k, PREFIX_value_k, t)` (named `t__PREFIX_chosen`)
    instead of `t`, and `t` is an extra output (after the model's own, in `readers`' order):
    the probe's way to impose chosen values at chosen tensors. Nodes must be named."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    position = {node.name: k for k, node in enumerate(model.graph.node)}
    nodes = list(model.graph.node)
    make_info = onnx.helper.make_tensor_value_info
    for k, (source, names) in enumerate(readers.items()):
        chosen = f"{source}__{prefix}_chosen"
        for node in nodes:
            if node.name in names:
                node.input[:] = [chosen if v == source else v for v in node.input]
        model.graph.input.extend(
            [
                make_info(f"{prefix}_mask_{k}", onnx.TensorProto.BOOL, None),
                make_info(f"{prefix}_value_{k}", onnx.TensorProto.FLOAT, None),
            ]
        )
        model.graph.output.append(make_info(source, onnx.TensorProto.FLOAT, None))
    inserts = sorted(
        ((min(position[n] for n in names), k, s) for k, (s, names) in enumerate(readers.items())),
        reverse=True,
    )
    for at, k, source in inserts:  # right before the first reader, so the order stays valid
        where = onnx.helper.make_node(
            "Where",
            [f"{prefix}_mask_{k}", f"{prefix}_value_{k}", source],
            [f"{source}__{prefix}_chosen"],
            name=f"{source}__{prefix}_chosen",
        )
        nodes.insert(at, where)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
