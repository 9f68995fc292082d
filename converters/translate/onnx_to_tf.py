"""ONNX -> TensorFlow: a `tf.Module` in NHWC whose binary layers LCE turns into `LceBconv2d`.

The translator walks the ONNX graph backwards from its outputs (so constant chains and
patterns absorbed into a binary layer are never emitted on their own) and writes each node as
TensorFlow ops. Binary layers (`converters.patterns`) are emitted in the exact forms of
docs/LCE_NOTES.md "Binary ops"; everything else as plain TensorFlow. An image input (a rank-4
input in ONNX's NCHW layout, `image_inputs`) is taken in the layout asked for: "nhwc", stored as
the NHWC tensor the translator works in, so the model has no TRANSPOSE at its input, or "nchw",
ONNX's own, turned NHWC inside the model; any other input (an input already channels-last, as
tf2onnx writes a Keras model, or a flat one) is taken as the ONNX model takes it. Outputs keep
ONNX's layout (docs/LCE_NOTES.md "Input layout").

Example:
    >>> from bnnexport.converters.translate.onnx_to_tf import save_saved_model
    >>> info = save_saved_model(onnx.load("model.onnx"), "/tmp/saved")  # doctest: +SKIP
    >>> info.binary_layers                                               # doctest: +SKIP
    4
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from bnnexport.converters.errors import ConverterError, InvalidModelError, UnsupportedOpError
from bnnexport.converters.graph import OnnxGraph, attributes
from bnnexport.converters.layer_map import (
    INPUT_SCOPE,
    OUTPUT_SCOPE,
    ScopeEntry,
    nearest_module,
    scope_name,
)
from bnnexport.converters.patterns import (
    NUDGE_THROUGH,
    Binarization,
    BinaryLayerMatch,
    find_binary_layers_in,
    match_binarization,
)
from bnnexport.converters.translate import tf_layers
from bnnexport.converters.translate.coverage import HANDLERS, described, first_unsupported
from bnnexport.converters.translate.tf_ops import (
    WeightStore,
    binarizing_in,
    lce_binarize,
    storing_weights,
    tf,
)
from bnnexport.converters.translate.values import Layout, Value


class _TranslateFirst(Exception):  # noqa: N818 (control flow, not an error)
    """Raised inside a node's translation: tensor `name` must be translated first."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class Translator:
    """Translates one ONNX graph into TF ops, inside a `tf.function` being traced."""

    def __init__(self, graph: OnnxGraph, layers: list[BinaryLayerMatch]):
        self.graph = graph
        self.layers = {m.node_name: m for m in layers if m.binary}
        self.values: dict[str, Value] = {}
        self.binary_emitted: list[str] = []
        # ONNX source -> the Value its binarizations read, and each int8 activation (what
        # `build_module(witness=True)` also outputs, so a runtime's signs and int8 tensors can
        # be replayed in ONNX Runtime)
        self.witnessed: dict[str, Value] = {}
        # binarization sources decided by the tie-broken accumulator (`binarized_source`)
        self.exact_sources: dict[str, None] = {}
        self._translating = False  # inside `translate`: `value` may not recurse
        # TF name scope -> the ONNX node emitted in it (converters.layer_map), in the order
        # the translations completed
        self.scopes: dict[str, ScopeEntry] = {}

    def const(self, name: str) -> np.ndarray | None:
        """A folded constant input, or None."""
        return self.graph.const(name) if name else None

    def value(self, name: str) -> Value:
        """The translated value of ONNX tensor `name` (translating its producers on demand).

        Iterative, so graph depth is not bounded by Python's recursion limit: inside a node's
        translation, asking for a tensor not translated yet abandons that attempt
        (`_TranslateFirst`); the loop translates the tensor first and tries the node again. Ops
        an abandoned attempt created are unreachable from the outputs, and TensorFlow's
        converter drops them.
        """
        if name in self.values:
            return self.values[name]
        const = self.graph.const(name)
        if const is not None:
            return Value(tf().constant(const), Layout.LOGICAL)
        if self._translating:
            raise _TranslateFirst(name)
        pending = [name]
        while pending:
            wanted = pending[-1]
            node = self.graph.producer.get(wanted)
            if node is None:
                raise InvalidModelError(f"tensor {wanted!r} has no producer in the ONNX graph")
            self._translating = True
            try:
                self.values[wanted] = self.translate(node)
            except _TranslateFirst as first:
                if first.name in pending:  # only a cyclic graph asks for itself
                    cycle = f"the ONNX graph has a cycle at {first.name!r}"
                    raise InvalidModelError(cycle) from None
                pending.append(first.name)
                continue
            finally:
                self._translating = False
            pending.pop()
        return self.values[name]

    def inputs(self, node: onnx.NodeProto) -> list[Value | None]:
        """A node's inputs: Values for computed tensors, None for constants (use `const`)."""
        return [
            None if not n or self.graph.const(n) is not None else self.value(n) for n in node.input
        ]

    def scope(self, node: onnx.NodeProto) -> str:
        """The name scope of `node`'s ops: `MODULE/NODE` (converters.layer_map)."""
        return scope_name(nearest_module(self.graph, node), node.name or node.output[0])

    def translate(self, node: onnx.NodeProto) -> Value:
        """Translate one node, its ops in the name scope named after it. The scope is entered
        as an absolute one (trailing `/`): the same name for an attempt abandoned and
        retried, and for ops made later inside another node's translation (`replay`)."""
        name = node.name or node.output[0]
        with tf().name_scope(self.scope(node) + "/"):
            value = self._translate(node, name)
        scope = self.record(node)  # once translated: conv-like nodes in execution order
        if value.is_affine and value.origin is None:
            # a pending affine map is made where it is first read: name it after this node
            value.origin = scope
        return value

    def record(self, node: onnx.NodeProto) -> str:
        """Record `node`'s scope in `scopes` (the first time) and return it."""
        scope = self.scope(node)
        module = nearest_module(self.graph, node)
        self.scopes.setdefault(
            scope, ScopeEntry(scope, node.name or node.output[0], node.op_type, module)
        )
        return scope

    def _translate(self, node: onnx.NodeProto, name: str) -> Value:
        match = self.layers.get(name)
        if match is not None:
            # the layer's own binarization is emitted with it: its ops named after it
            binarization = self.graph.producer.get(match.binarized)
            with binarizing_in(self.record(binarization) if binarization else None):
                emitted = tf_layers.binary_layer(self, node, match)
            if emitted is not None:
                self.binary_emitted.append(name)
                return emitted
        found = match_binarization(self.graph, node.output[0])
        if found is not None:
            src = self.binarized_source(found)
            return Value(lce_binarize(src.tensor), src.layout, src.perm)
        handler = HANDLERS.get(node.op_type)
        if handler is None:  # e.g. a node a binarization pattern reads, read by another node too
            raise UnsupportedOpError(name, node.op_type)
        inputs = self.inputs(node)
        try:
            return handler(self, node, inputs)
        except (ConverterError, _TranslateFirst):
            raise
        except Exception as error:  # a supported op with attributes or shapes it cannot take
            why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            raise UnsupportedOpError(name, node.op_type, why=why) from None

    def binarized_source(self, found: Binarization) -> Value:
        """The float tensor a binarization reads, with exact ties broken the way torch does
        when it is a binary conv's accumulator under a per-channel affine map (possibly
        max-pooled or flattened: both commute with sign)."""
        steps: list[onnx.NodeProto] = []
        name = found.source
        while True:
            node = self.graph.producer.get(name)
            if node is None or node.op_type not in NUDGE_THROUGH:
                break
            steps.append(node)
            name = node.input[0]
        base = self.value(name)
        if not base.is_affine:
            out = self.value(found.source)
        else:
            self.exact_sources[found.source] = None
            out = Value(base.nudged(), base.layout, base.perm)
            for step in reversed(steps):
                out = self.replay(step, out)
        return self.witnessed.setdefault(found.source, out)

    def chain(self, match: BinaryLayerMatch) -> list[onnx.NodeProto]:
        """Nodes between a binary layer's binarization and its data input, in forward order."""
        nodes, name = [], match.input_name
        while name != match.binarized:
            node = self.graph.producer[name]
            nodes.append(node)
            name = node.input[0]
        return nodes[::-1]

    def replay(self, node: onnx.NodeProto, x: Value) -> Value:
        """Apply a shape-only node (or max-pool) to `x` instead of its ONNX input, its ops
        named after that node, not after the one being translated."""
        with tf().name_scope(self.record(node) + "/"):
            return HANDLERS[node.op_type](self, node, [x, *[None] * (len(node.input) - 1)])


@dataclass
class TranslationInfo:
    """What the translator saw and emitted."""

    binary_layers: int
    binary_emitted: list[str]
    input_names: list[str]
    input_shapes: list[list[int]]  # the ONNX model's (NCHW for an image input)
    output_names: list[str]
    # how the image inputs are taken ("nhwc" or "nchw"); None: the model has no image input,
    # every input is taken as the ONNX model takes it
    input_layout: str | None = None
    # with `witness`: the ONNX binarization sources and int8 activations behind outputs
    # witness_000, witness_001, ...
    witness_sources: list[str] = field(default_factory=list)
    # the name scope of each translated node, in translation order (converters.layer_map)
    scopes: list[ScopeEntry] = field(default_factory=list)
    # the binarization sources whose signs the translator decides exactly, not by rounding: a
    # binary conv's integer accumulator under a per-channel affine map, tie-broken in float64
    # (`Value.nudged`); converters.gate judges a recurring split only there
    exact_sources: list[str] = field(default_factory=list)


def _static_shape(graph: OnnxGraph, info: onnx.ValueInfoProto) -> list[int]:
    dims = info.type.tensor_type.shape.dim
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims]
    if shape and shape[0] is None:
        shape[0] = 1  # a dynamic batch: LCE models run one sample at a time anyway
    if any(d is None for d in shape):
        raise InvalidModelError(f"input {info.name!r} has a dynamic non-batch dimension: {shape}")
    return [int(d) for d in shape]


def image_inputs(graph: OnnxGraph) -> list[str]:
    """The graph's image inputs: rank 4, in ONNX's NCHW layout. A rank-4 input that only
    Transposes to NCHW read is channels-last already (tf2onnx's NHWC input of a Keras model):
    no image input in this sense, it is taken as it is."""
    found = []
    for info in graph.inputs:
        if len(info.type.tensor_type.shape.dim) != 4:
            continue
        readers = graph.consumers.get(info.name, ())
        to_nchw = [
            n for n in readers
            if n.op_type == "Transpose" and list(attributes(n).get("perm", [])) == [0, 3, 1, 2]
        ]  # fmt: skip
        if not readers or len(to_nchw) < len(readers):
            found.append(info.name)
    return found


def _input_value(arg, layout: str | None) -> Value:  # noqa: ANN001 (a traced tf.Tensor)
    """The Value of a traced input: an image input stored NHWC, as given ("nhwc") or turned so
    at the input ("nchw"); any other input (`layout` None) as it is."""
    if layout == "nhwc":
        return Value(arg, Layout.NHWC)
    if layout == "nchw":
        return Value(tf().transpose(arg, [0, 2, 3, 1]), Layout.NHWC)
    return Value(arg, Layout.LOGICAL)


def _nhwc(shape: list[int]) -> list[int]:
    return [shape[0], shape[2], shape[3], shape[1]]


def build_module(  # noqa: ANN201
    model: onnx.ModelProto, witness: bool = False, input_layout: str = "nchw"
):
    """Build a `tf.Module` whose `concrete` function computes the ONNX graph in NHWC, its image
    inputs taken in `input_layout` ("nhwc" or "nchw"; module doc).

    Returns (module, TranslationInfo). With `witness`, `concrete` also outputs every binarization's
    input (in ONNX's logical layout) as `witness_NNN`, after the model's outputs: a diagnostic
    model for `converters.gate`, whose extra outputs may stop LCE fusing a bconv with the
    binarization after it.
    """
    if input_layout not in ("nhwc", "nchw"):
        raise ValueError(f"input layout must be nhwc or nchw, got {input_layout!r}")
    graph = OnnxGraph.folded(model)
    unsupported = first_unsupported(graph)
    if unsupported is not None:  # the first in graph order, before TensorFlow traces anything
        raise unsupported
    tensorflow = tf()
    layers = find_binary_layers_in(graph)
    signature = _Signature.of(graph, input_layout)
    traced, weights = _Traced(), WeightStore()
    serve = _serving(graph, layers, signature, witness, weights, traced)
    module = tensorflow.Module()
    # the function itself is not the module's: saving would trace it again for the attribute,
    # where the signature (`concrete`) is all the converters read
    function = tensorflow.function(serve, input_signature=signature.specs(), autograph=False)
    try:
        with storing_weights(weights):  # large float kernels as variables (WeightStore)
            concrete = function.get_concrete_function()
    except Exception:
        if traced.errors:
            raise traced.errors[0] from None
        raise
    module.weights = weights.variables  # tracked, so the SavedModel saves them
    module.concrete = concrete
    info = TranslationInfo(
        binary_layers=len(layers),
        binary_emitted=list(traced.emitted),
        input_names=signature.names,
        input_shapes=signature.shapes,
        output_names=signature.outputs,
        input_layout=signature.image_layout,
        witness_sources=list(traced.witnessed),
        scopes=list(traced.scopes),
        exact_sources=list(traced.exact),
    )
    return module, info


@dataclass(frozen=True)
class _Signature:
    """The traced function's inputs (the ONNX graph's: names, static shapes, and each one's
    layout, None for an input that is no image input) and its outputs' ONNX names."""

    names: list[str]
    shapes: list[list[int]]
    layouts: list[str | None]
    outputs: list[str]

    @classmethod
    def of(cls, graph: OnnxGraph, input_layout: str) -> _Signature:
        """The signature of `graph` with its image inputs (`image_inputs`) in `input_layout`."""
        shapes = [_static_shape(graph, i) for i in graph.inputs]
        names = [i.name for i in graph.inputs]
        images = image_inputs(graph)
        layouts = [input_layout if name in images else None for name in names]
        return cls(names, shapes, layouts, [o.name for o in graph.outputs])

    @property
    def image_layout(self) -> str | None:
        """How the image inputs are taken (None: the graph has none)."""
        return next((layout for layout in self.layouts if layout is not None), None)

    def specs(self) -> list:
        """The `tf.TensorSpec` of each input, `input_K`: NHWC for an image input taken so."""
        tensorflow = tf()
        return [
            tensorflow.TensorSpec(
                _nhwc(shape) if layout == "nhwc" else shape, tensorflow.float32, name=f"input_{k}"
            )
            for k, (shape, layout) in enumerate(zip(self.shapes, self.layouts, strict=True))
        ]


@dataclass
class _Traced:
    """What the translator emitted while the function was traced (`TranslationInfo`'s lists),
    and the error it raised: tf.function may wrap it, and it is re-raised as it is."""

    emitted: list[str] = field(default_factory=list)
    witnessed: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    scopes: list[ScopeEntry] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


def _serving(
    graph: OnnxGraph,
    layers: list[BinaryLayerMatch],
    signature: _Signature,
    witness: bool,
    weights: WeightStore,
    traced: _Traced,
) -> Callable[..., dict]:
    """The Python function `build_module` traces: one fresh `Translator` computes the graph's
    outputs (`output_K`, then with `witness` every binarization's input, `witness_NNN`) from
    the inputs of `signature`, and records what it emitted in `traced`."""
    tensorflow = tf()

    def serve(*args):
        weights.restart()
        translator = Translator(graph, layers)
        with tensorflow.name_scope(INPUT_SCOPE + "/"):
            for name, arg, layout in zip(signature.names, args, signature.layouts, strict=True):
                translator.values[name] = _input_value(arg, layout)
        try:
            values = [translator.value(o) for o in signature.outputs]
            with tensorflow.name_scope(OUTPUT_SCOPE + "/"):
                result = {f"output_{k}": v.logical() for k, v in enumerate(values)}
            if witness:
                for k, value in enumerate(translator.witnessed.values()):
                    result[f"witness_{k:03d}"] = value.logical()
                traced.witnessed[:] = translator.witnessed
        except Exception as error:  # tf.function may wrap it; keep ours to re-raise as is
            if isinstance(error, UnsupportedOpError):
                described(graph, error)  # handlers name the node; module, hint, list added here
            traced.errors.append(error)
            raise
        traced.emitted[:] = translator.binary_emitted
        traced.exact[:] = translator.exact_sources
        traced.scopes[:] = translator.scopes.values()
        return result

    return serve


def save_saved_model(
    model: onnx.ModelProto, directory: str | Path, witness: bool = False, input_layout: str = "nchw"
) -> TranslationInfo:
    """Translate `model` (its image inputs in `input_layout`) and save it as a TensorFlow
    SavedModel in `directory`."""
    module, info = build_module(model, witness, input_layout)
    tf().saved_model.save(module, str(directory), signatures={"serving_default": module.concrete})
    return info
