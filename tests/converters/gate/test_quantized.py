"""The int8 conversion and its gate (converters.gate.quantized): float layers become int8 ops
around unchanged `LceBconv2d`s, the flatbuffer is the QDQ reference's model within one step per
int8 tensor, and what breaks that is refused.

The rules of the replay are tested on ONNX Runtime alone (a witness built from the reference's
own tensors, then moved off its grid or by steps); the conversions (slow, ~8 s each) assert
the flatbuffer's op list and tensor types."""

from __future__ import annotations

import bnnexport.converters.translate.onnx_to_tf as onnx_to_tf
import bnnexport.converters.translate.tf_quantized as tf_quantized
import numpy as np
import onnx
import pytest
import torch
from bnnexport.converters.errors import (
    AccuracyDropError,
    ConversionMismatchError,
    FloatFallbackError,
    InvalidModelError,
)
from bnnexport.converters.flatbuffer import binarize_int8_directly, flatbuffer_ops, read_flatbuffer
from bnnexport.converters.gate.predicate import Witness
from bnnexport.converters.gate.quantized import (
    CachedWitness,
    QuantizedCheck,
    QuantProbe,
    activation_points,
    refuse_accuracy_drop,
)
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.normalize import normalize
from bnnexport.converters.quantize import QuantPoint, find_units, quantize
from bnnexport.converters.quantize.qdq import write_qdq
from bnnexport.converters.runtimes import ort_session
from support.converter_nets import BiRealDownsample, FloatStemBinaryBody, export

SHAPE = (1, 3, 8, 8)
INT8_LAYERS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def _samples(count: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, *SHAPE[1:])).astype(np.float32)


def _exported(net, tmp_path):
    torch.manual_seed(0)
    return export(net, SHAPE, tmp_path / "net.onnx", do_constant_folding=False)


def _convert(net, tmp_path, **options):
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    options = ConvertOptions(float_layers="int8", **options)
    path = _exported(net, tmp_path)
    return convert_onnx(path, tmp_path / "net.tflite", inputs=_samples(), options=options)


# -- the replay's rules, on ONNX Runtime alone ---------------------------------------------


def _qdq(tmp_path) -> onnx.ModelProto:
    model, _ = normalize(onnx.load(str(_exported(FloatStemBinaryBody(), tmp_path))))
    return quantize(model, _samples()).model


def _own_tensors(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, dict]:
    """ONNX Runtime's logits and int8 activations of `model` on one sample."""
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    points = list(activation_points(model))
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(p) for p in points if p not in outputs
    )
    session = ort_session(probe.SerializeToString())
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, {
        session.get_inputs()[0].name: x[None]}), strict=True))  # fmt: skip
    first = model.graph.output[0].name
    return values[first][0], {p: values[p][0] for p in points if p != first}


def _probe_with(model, moved) -> tuple[QuantProbe, QuantizedCheck]:
    """A probe whose witness is ONNX Runtime itself, its int8 tensors changed by `moved`."""

    def run(x):
        logits, tensors = _own_tensors(model, x)
        return logits, moved(dict(tensors))

    stats = QuantizedCheck()
    return QuantProbe(model, CachedWitness(Witness(run=run)), stats), stats


def _the_stem_output(model) -> str:
    return next(p for p in activation_points(model) if p.startswith("/bn0/"))


def test_the_reference_s_own_int8_tensors_pass_the_replay(tmp_path):
    model = _qdq(tmp_path)
    probe, stats = _probe_with(model, lambda tensors: tensors)
    logits, _ = probe.run(_samples(1)[0])
    assert np.isfinite(logits).all() and stats.one_step_positions == 0
    assert stats.int8_tensors == len(activation_points(model))


def test_a_tensor_one_step_off_passes_and_is_counted(tmp_path):
    model = _qdq(tmp_path)
    point = _the_stem_output(model)
    scale = activation_points(model)[point][0]

    def moved(tensors):
        tensors[point] = tensors[point].copy()
        tensors[point].reshape(-1)[7] += scale  # one step: rounding
        return tensors

    probe, stats = _probe_with(model, moved)
    probe.run(_samples(1)[0])
    assert stats.one_step_positions == 1 and stats.most_steps_in == point


def test_a_tensor_two_steps_off_is_refused(tmp_path):
    model = _qdq(tmp_path)
    point = _the_stem_output(model)
    scale = activation_points(model)[point][0]

    def moved(tensors):
        tensors[point] = tensors[point].copy()
        tensors[point].reshape(-1)[7] += 2 * scale
        return tensors

    probe, _ = _probe_with(model, moved)
    with pytest.raises(ConversionMismatchError, match="2 steps from the reference"):
        probe.run(_samples(1)[0])


def test_a_tensor_off_the_reference_s_grid_is_refused(tmp_path):
    model = _qdq(tmp_path)
    point = _the_stem_output(model)
    scale = activation_points(model)[point][0]
    probe, _ = _probe_with(model, lambda t: {**t, point: t[point] + 0.4 * scale})
    with pytest.raises(ConversionMismatchError, match="not on the reference's grid"):
        probe.run(_samples(1)[0])


def test_an_accuracy_drop_beyond_the_limit_is_one_line():
    accuracy = {"labelled": 100, "float_top1": 0.95, "int8_top1": 0.92, "top1_drop_points": 3.0}
    refuse_accuracy_drop(accuracy, 3.0)  # at the limit: kept
    refuse_accuracy_drop(accuracy, None)  # no limit
    refuse_accuracy_drop({"top1_drop_points": None}, 0.0)  # no label: nothing to judge
    with pytest.raises(AccuracyDropError) as refused:
        refuse_accuracy_drop(accuracy, 1.0)
    assert "\n" not in str(refused.value) and "3.00 points" in str(refused.value)


# -- conversions -----------------------------------------------------------------------------


def _typed(path) -> list[tuple[str, list[str], list[str]]]:
    return [(op.op_type, op.input_types, op.output_types) for op in flatbuffer_ops(path)]


@pytest.fixture(scope="module")
def stem_body(tmp_path_factory):
    """FloatStemBinaryBody converted with its float layers in int8 (one conversion, ~8 s)."""
    return _convert(FloatStemBinaryBody(), tmp_path_factory.mktemp("stem-body"))


@pytest.mark.slow
def test_a_float_stem_binary_body_and_float_head_become_int8_ops_around_lce_bconv2d(stem_body):
    result = stem_body
    ops = _typed(result.output)
    layers = [op for op in ops if op[0] in INT8_LAYERS]
    assert len(layers) == 2  # the stem and the head (a 1x1 conv: its kernel per channel)
    for _, inputs, outputs in layers:
        assert inputs[:3] == ["INT8", "INT8", "INT32"] and outputs == ["INT8"]
    assert result.lce_bconv2d == result.binary_layers == 2
    # the stem's int8 output is binarized as it is: no DEQUANTIZE between them
    assert next(op for op in ops if op[0] == "LceQuantize")[1] == ["INT8"]
    assert ops[0][1] == ["FLOAT32"] and ops[-1][2] == ["FLOAT32"]  # float io by default
    gate = result.gates[0]
    assert (gate.reference, gate.candidate, gate.argmax_agreement) == (
        "ONNX Runtime int8", "LCE int8", 1.0
    )  # fmt: skip
    assert result.int8["int8_ops"] == 2 and result.int8["ranges"] == "calibrated"
    assert result.twin and result.twin[0].max_abs_diff == 0.0  # the float graph's twin


def _int8_conv_kernels(path) -> list[np.ndarray]:
    """The int8 constant 4-D tensors (conv kernels, OHWI) a flatbuffer stores."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(bytearray(path.read_bytes()), 0)
    graph, found = model.Subgraphs(0), []
    for k in range(graph.TensorsLength()):
        tensor = graph.Tensors(k)
        data = model.Buffers(tensor.Buffer())
        if tensor.Type() == schema.TensorType.INT8 and tensor.ShapeLength() == 4:
            if data.DataLength():  # a constant, not an activation
                found.append(data.DataAsNumpy().view(np.int8).reshape(tensor.ShapeAsNumpy()))
    return found


@pytest.mark.slow
def test_the_stem_s_kernel_in_the_flatbuffer_is_the_reference_s_taps_moved_included(
    stem_body,
):
    """The QDQ reference rounds some of a conv's taps the other way (each window keeps its
    sum: `kernel_integers`); TFLite derives its integers from the float kernel again: it must
    find the same ones, not the plainly rounded ones."""
    model, _ = normalize(onnx.load(str(stem_body.output.with_name("net.onnx"))))
    reference = quantize(model, _samples())  # as `_convert` made it
    points = {t: QuantPoint(**p) for t, p in reference.report.tensor_points.items()}
    plain, _ = write_qdq(model, find_units(OnnxGraph.folded(model)), points, window_sums=set())
    stem, plain_stem = (next(v for v in OnnxGraph(m).constants.values()
                             if v.dtype == np.int8 and v.ndim == 4)
                        for m in (reference.model, plain))  # fmt: skip
    assert (stem != plain_stem).any()  # taps moved: the flatbuffer can tell the two apart
    found = [k for k in _int8_conv_kernels(stem_body.output) if k.shape[1:3] == (3, 3)]
    assert len(found) == 1
    assert np.array_equal(found[0], stem.transpose(0, 2, 3, 1))  # OIHW -> OHWI


@pytest.fixture(scope="module")
def bireal_down(tmp_path_factory):
    """BiRealDownsample converted with its float layers in int8 (one conversion)."""
    return _convert(BiRealDownsample(), tmp_path_factory.mktemp("bireal-down"), twin=False)


@pytest.mark.slow
def test_a_bireal_block_s_float_shortcut_conv_runs_in_int8_from_the_stream(bireal_down):
    result = bireal_down
    ops = _typed(result.output)
    layers = [op for op in ops if op[0] in INT8_LAYERS]
    assert len(layers) == 3 and all(op[1][0] == "INT8" for op in layers)
    assert result.lce_bconv2d == result.binary_layers == 2
    assert ("AVERAGE_POOL_2D", ["INT8"], ["INT8"]) in ops  # quantized before the pool
    assert result.gates[0].argmax_agreement == 1.0


@pytest.mark.slow
def test_a_binarization_of_an_int8_tensor_a_float_add_reads_too_reads_it_as_int8(bireal_down):
    """The stem's int8 output is read by the first block's binarization and by the residual
    ADD: LCE's converter binarizes its dequantized copy, whose zero point LCE's ARM build
    makes a ~1e-9 residue of either sign; the conversion rewires the LceQuantize to the int8
    tensor (docs/LCE_NOTES.md "int8 on ARM")."""
    ops = flatbuffer_ops(bireal_down.output)
    dequantized = {op.outputs[0]: op for op in ops if op.op_type == "DEQUANTIZE"}
    binarizations = [op for op in ops if op.op_type == "LceQuantize"]
    stem = dequantized[next(op.inputs[0] for op in ops if op.op_type == "ADD"
                            and op.inputs[0] in dequantized)]  # fmt: skip
    assert [op.inputs[0] for op in binarizations].count(stem.inputs[0]) == 1
    assert [op for op in binarizations if op.inputs[0] in dequantized] == []
    assert bireal_down.int8["binarizations_rewired_to_int8"] == 1
    assert bireal_down.gates[0].argmax_agreement == 1.0


def _binarizations_watched(flatbuffer, *, unrewire: bool) -> tuple[bytes, list[tuple]]:
    """The flatbuffer through TF's `flatbuffer_utils` with every `LceQuantize`'s input and
    output a model output, and each `LceQuantize`'s (input's zero point or None for a float
    input); with `unrewire`, each one that reads an int8 tensor a `DEQUANTIZE` reads too put
    back on that DEQUANTIZE's float output, as LCE's converter wrote it."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(read_flatbuffer(flatbuffer)))
    graph = model.subgraphs[0]
    kinds = [model.operatorCodes[op.opcodeIndex] for op in graph.operators]
    dequantizing = {op.inputs[0]: op.outputs[0] for op, code in zip(graph.operators, kinds,
                    strict=True) if code.builtinCode == DEQUANTIZE}  # fmt: skip
    binarizations = [op for op, code in zip(graph.operators, kinds, strict=True)
                     if code.customCode == b"LceQuantize"]  # fmt: skip
    for op in binarizations if unrewire else []:
        op.inputs[0] = dequantizing.get(op.inputs[0], op.inputs[0])
    graph.outputs = np.array([i for op in binarizations for i in (op.inputs[0], op.outputs[0])],
                             np.int32)  # fmt: skip
    quantization = [graph.tensors[op.inputs[0]].quantization for op in binarizations]
    zeros = [int(q.zeroPoint[0]) if q is not None and q.zeroPoint is not None else None
             for q in quantization]  # fmt: skip
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)), zeros


DEQUANTIZE = 6  # TFLite's BuiltinOperator.DEQUANTIZE


def _every_output(interpreter, x: np.ndarray) -> list[np.ndarray]:
    """Each output of a many-output flatbuffer for the samples `x`, stacked over samples."""
    per_sample = [interpreter.predict(sample[None]) for sample in x]
    return [np.stack([np.asarray(s[k]) for s in per_sample]) for k in range(len(per_sample[0]))]


def test_rewiring_the_binarizations_of_a_truncated_flatbuffer_is_refused():
    with pytest.raises(InvalidModelError, match="truncated or corrupt flatbuffer"):
        binarize_int8_directly(b"TFL3TFL3")


@pytest.mark.slow
def test_an_int8_binarization_takes_the_dequantized_tensor_s_signs_on_the_host(bireal_down):
    """LCE's x86 interpreter binarizes the int8 stem tensor (`q < z` is -1) to exactly the
    words it makes of the float copy the converter had the `LceQuantize` read (`x < 0`), values
    at the zero point included: the rewire changes no sign where DEQUANTIZE maps the zero
    point to 0 (docs/LCE_NOTES.md "int8 on ARM")."""
    from bnnexport.converters.flatbuffer import input_layout, to_input_layout
    from bnnexport.converters.runtimes import lce_interpreter

    theirs, their_zeros = _binarizations_watched(bireal_down.output, unrewire=True)
    ours, zeros = _binarizations_watched(bireal_down.output, unrewire=False)
    assert binarize_int8_directly(theirs)[1] == 1 and binarize_int8_directly(ours)[1] == 0
    assert their_zeros.count(None) == len(zeros) and zeros.count(None) == len(zeros) - 1
    # NCHW samples in the layout the flatbuffer declares (NHWC: arm64's default)
    x = to_input_layout(_samples(32, seed=1), input_layout(bireal_down.output))
    found = [_every_output(lce_interpreter(f), x) for f in (theirs, ours)]
    stem = next(k for k, zero in enumerate(zeros) if zero is not None)
    assert (found[1][2 * stem] == zeros[stem]).sum() > 0  # where ARM's DEQUANTIZE differs
    assert all(words.dtype == np.int32 for words in found[1][1::2])
    for theirs_words, our_words in zip(found[0][1::2], found[1][1::2], strict=True):
        assert np.array_equal(theirs_words, our_words)


@pytest.mark.slow
def test_int8_io_takes_and_gives_int8(tmp_path):
    from bnnexport.converters.runtimes import open_model

    result = _convert(FloatStemBinaryBody(), tmp_path, io="int8", twin=False)
    ops = _typed(result.output)
    assert ops[0][0] != "QUANTIZE" and ops[0][1][0] == "INT8"
    assert ops[-1][0] != "DEQUANTIZE" and ops[-1][2] == ["INT8"]
    model = open_model("lce", result.output)
    assert model.int8_io and model.run(_samples(2)).dtype == np.float32
    assert result.int8["io"] == "int8"


@pytest.mark.slow
def test_a_zero_point_negated_in_the_translator_is_refused(tmp_path, monkeypatch):
    """A translator mistake in the quantized path: the fake quantization's range computed
    with the zero point's sign flipped. The flatbuffer still has every int8 op."""
    real = tf_quantized.quantized_range
    monkeypatch.setattr(tf_quantized, "quantized_range", lambda s, z: real(s, -np.asarray(z)))
    with pytest.raises(ConversionMismatchError) as refused:
        _convert(FloatStemBinaryBody(), tmp_path, twin=False)
    assert not (tmp_path / "net.tflite").exists()
    assert "int8 tensor" in str(refused.value)


@pytest.mark.slow
def test_a_kernel_integer_one_step_off_in_the_translator_is_refused(tmp_path, monkeypatch):
    """One tap of the stem's kernel a step off (its scale, set by the largest tap, unchanged):
    every int8 tensor stays within one step of the reference's, so only the kernel check
    sees it."""
    real = onnx_to_tf.Translator.const

    def nudged(self, name):
        kernel = real(self, name)
        if kernel is None or kernel.shape != (32, 3, 3, 3):
            return kernel
        kernel = kernel.copy()
        row = kernel[0].reshape(-1)
        tap = int(np.abs(row).argmin())  # the smallest tap: the scale does not move
        row[tap] += np.abs(row).max() / 127  # one step of channel 0
        kernel[0] = row.reshape(kernel[0].shape)
        return kernel

    monkeypatch.setattr(onnx_to_tf.Translator, "const", nudged)
    with pytest.raises(ConversionMismatchError, match="int8 kernel of '/stem/Conv'.* at 1 of"):
        _convert(FloatStemBinaryBody(), tmp_path, twin=False)
    assert not (tmp_path / "net.tflite").exists()


@pytest.mark.slow
def test_a_float_layer_left_float_in_the_flatbuffer_is_refused(tmp_path, monkeypatch):
    """The translator forgetting a quantization point: the stem conv stays a float op."""
    real = tf_quantized.dequantize
    first = []

    def forgetting(tr, node, inputs):
        if not first:
            first.append(node.output[0])
            return inputs[0]
        return real(tr, node, inputs)

    monkeypatch.setitem(onnx_to_tf.HANDLERS, "DequantizeLinear", forgetting)
    with pytest.raises(FloatFallbackError, match="stayed float ops"):
        _convert(FloatStemBinaryBody(), tmp_path, twin=False)
    assert not (tmp_path / "net.tflite").exists()


@pytest.mark.slow
def test_an_int8_model_losing_accuracy_is_refused_in_one_line(tmp_path):
    from bnnexport.converters.lce import ConvertOptions, convert_onnx
    from bnnexport.converters.runtimes import run_onnx

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(16 * 6 * 6, 10))  # fmt: skip
    path = _exported(net, tmp_path)
    x = _samples(64)
    labels = run_onnx(path, x).argmax(1)  # the float model's own answers: 100 % top-1
    assert len(set(labels)) > 3
    crushed = np.zeros((4, *SHAPE[1:]), np.float32)  # ranges [0, 0]: inputs clipped to >= 0
    options = ConvertOptions(float_layers="int8", calibration=crushed, twin=False)
    with pytest.raises(AccuracyDropError) as refused:
        convert_onnx(path, tmp_path / "net.tflite", inputs=x, labels=labels, options=options)
    assert "\n" not in str(refused.value) and "points of top-1" in str(refused.value)
    assert not (tmp_path / "net.tflite").exists()


@pytest.mark.slow
def test_the_gate_quantizes_a_float_input_exactly_as_lce_s_interpreter_does(tmp_path):
    """Pixels k / 255 scaled to [-1, 1] at scale 2 / 255 lie exactly half a step between two
    integers (every MNIST pixel does); the int8 the reference is given for a QUANTIZE op must be
    the interpreter's own rounding of them (half to even), not half away from zero
    (docs/LCE_NOTES.md "int8 around binary layers")."""
    import tensorflow as tf
    from bnnexport.converters.gate.quantized import tflite_quantize
    from bnnexport.converters.runtimes import lce_interpreter

    @tf.function(input_signature=[tf.TensorSpec([1, 256], tf.float32)])
    def quantized(x):
        return tf.quantization.fake_quant_with_min_max_vars(x, -1.0, 1.0) * 1.0

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [quantized.get_concrete_function()], quantized
    )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.inference_output_type = tf.int8
    flatbuffer = converter.convert()
    interpreter = lce_interpreter(flatbuffer)
    scale, zero = interpreter.output_scales[0], interpreter.output_zero_points[0]
    x = (np.arange(256, dtype=np.float32) / 127.5 - 1.0)[None]
    theirs = interpreter.predict(x).astype(np.int64)
    ties = np.abs(np.abs(x * np.float32(1 / scale)) % 1 - 0.5) < 1e-4
    assert ties.sum() > 100  # most inputs are exactly half a step between two integers
    assert np.array_equal(tflite_quantize(x, scale, zero), theirs)
