"""The NumPy reference interpreter the emulated device's stand-in runs real flatbuffers with
(tests/support/lce_reference.py): on bnnexport's own flatbuffers it computes what LCE's host
interpreter computes, sample by sample, and it refuses an op it does not know in one line.

Tolerances (docs/LCE_NOTES.md "Reference interpreter"): float
flatbuffers within 1e-4 (float32 summation order); int8 flatbuffers within one step of the int8
output's scale (the requantization is ruy's, found by experiment: observed exact). These compare
with the x86 host build's rounding; the stand-in computes with the ARM build's (`rounding="arm"`,
docs/LCE_NOTES.md "int8 on ARM"), which tests/deploy/test_bench_aarch64.py checks against LCE's
real aarch64 tool.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from bnnexport.converters.flatbuffer import input_layout, to_input_layout
from bnnexport.converters.runtimes import run_lce
from support import lce_reference
from support.stand_in import write_stand_in

pytestmark = pytest.mark.slow  # a conversion to float and to int8 flatbuffers
SAMPLES = 100
FLOAT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def converted(_trained_run_template, tmp_path_factory):
    """The 1-epoch mnist-bnn run converted for arm64, float and int8; (run, inputs, labels)."""
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx

    run = tmp_path_factory.mktemp("reference") / "run"
    shutil.copytree(_trained_run_template, run)
    export_onnx(run, samples=SAMPLES)
    convert_run(run, target="arm64", fmt="tflite")
    convert_run(run, target="arm64", float_layers="int8")
    with np.load(run / "samples.npz") as samples:
        return run, samples["inputs"][:SAMPLES], samples["labels"][:SAMPLES]


def _reference(flatbuffer, inputs):
    """The reference interpreter's outputs on NCHW samples, fed in the layout the flatbuffer
    declares, as bench feeds it (the interpreter takes its input tensor as it is)."""
    return lce_reference.load(flatbuffer).run(to_input_layout(inputs, input_layout(flatbuffer)))


def test_the_float_flatbuffer_computes_what_lces_interpreter_computes(converted):
    run, inputs, labels = converted
    ours = _reference(run / "model-arm64.tflite", inputs)
    theirs = run_lce(run / "model-arm64.tflite", inputs)
    assert ours.shape == theirs.shape == (SAMPLES, 10)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))
    assert np.abs(ours - theirs).max() < FLOAT_TOLERANCE


def test_the_int8_flatbuffer_computes_what_lces_interpreter_computes(converted):
    run, inputs, _ = converted
    flatbuffer = run / "model-arm64-int8.tflite"
    ours = _reference(flatbuffer, inputs)
    theirs = run_lce(flatbuffer, inputs)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))
    step = lce_reference.int8_output_step(flatbuffer)
    assert np.abs(ours - theirs).max() <= step * 1.001  # one step of the int8 output


def test_arms_requantization_sends_a_negative_tie_away_from_zero_where_the_hosts_rounds_up():
    """-14 * 2**30 / 2**31 = -7, then one right shift: -3.5, a tie (and +3.5, and -3.25)."""
    acc, q, shift = np.array([-14, 14, -13]), np.int64(1 << 30), np.int64(-1)
    assert lce_reference._requantize(acc, q, shift, "x86").tolist() == [-3, 4, -3]
    assert lce_reference._requantize(acc, q, shift, "arm").tolist() == [-4, 4, -3]
    with pytest.raises(ValueError, match="rounding 'risc-v'"):
        lce_reference.load(__file__, rounding="risc-v")


def test_the_interpreter_runs_any_batch_size_of_a_batch_one_flatbuffer(converted):
    run, inputs, _ = converted
    model = lce_reference.load(run / "model-arm64.tflite")
    nhwc = to_input_layout(inputs[:3], input_layout(run / "model-arm64.tflite"))
    np.testing.assert_allclose(model.run(nhwc)[1:], model.run(nhwc[1:]), atol=1e-6)


def _with_builtin(flatbuffer, old: int, new: int) -> bytes:
    """The flatbuffer's bytes with operator code `old` renamed to builtin `new` (both fields)."""
    buf = bytearray(flatbuffer.read_bytes())
    model = lce_reference._ref(bytes(buf), 0)
    for at in lce_reference._items(bytes(buf), lce_reference._get(bytes(buf), model, 1)):
        code = lce_reference._ref(bytes(buf), at)
        deprecated = lce_reference._get(bytes(buf), code, 0)
        builtin = lce_reference._get(bytes(buf), code, 3)
        if builtin is not None and struct.unpack_from("<i", buf, builtin)[0] == old:
            struct.pack_into("<i", buf, builtin, new)
            if deprecated is not None:
                struct.pack_into("<b", buf, deprecated, new)
    return bytes(buf)


def test_an_op_the_interpreter_lacks_is_one_error_line_from_the_stand_in(converted, tmp_path):
    """MAX_POOL_2D renamed to TANH (28): the stand-in names the op and exits 1, no outputs."""
    run, inputs, _ = converted
    graph = tmp_path / "tanh.tflite"
    graph.write_bytes(_with_builtin(run / "model-arm64.tflite", 17, 28))
    with pytest.raises(lce_reference.UnsupportedOp, match="BUILTIN_28"):
        lce_reference.load(graph).check_supported()
    to_input_layout(inputs[:1], input_layout(graph)).astype("<f4").tofile(tmp_path / "x.bin")
    tool = write_stand_in(tmp_path / "lce_benchmark_model", None)
    argv = [sys.executable, str(tool), f"--graph={graph}", "--num_runs=1", "--input_layer=x",
            "--input_layer_shape=1,28,28,1", f"--input_layer_value_files=x:{tmp_path / 'x.bin'}",
            f"--output_filepath={tmp_path / 'out.bin'}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"ERROR: the stand-in's reference interpreter cannot run {graph}: "
        "op BUILTIN_28 (float32) is not implemented"
    ]
    assert not (tmp_path / "out.bin").exists()


@pytest.mark.long  # three initialised zoo models, each converted float and int8: minutes
@pytest.mark.parametrize("model, size", [("binarynet", 32), ("birealnet18", 64),
                                         ("quicknet-small", 64)])  # fmt: skip
def test_the_zoo_models_compute_what_lces_interpreter_computes(model, size, tmp_path):
    """BinaryNet, Bi-Real-Net-18 and QuickNet-Small (initialised, as `bnnexport init` makes
    them), float and int8: argmax equal, outputs within 1e-5 relative (float32 order)."""
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.init import init_run

    run = tmp_path / model
    init_run(model, input_shape=(3, size, size), out=run)
    export_onnx(run, samples=16)
    convert_run(run, target="arm64", fmt="tflite")
    convert_run(run, target="arm64", float_layers="int8", max_accuracy_drop=None)
    with np.load(run / "samples.npz") as samples:
        inputs = samples["inputs"][:16]
    for name in ("model-arm64.tflite", "model-arm64-int8.tflite"):
        ours, theirs = _reference(run / name, inputs), run_lce(run / name, inputs)
        assert np.array_equal(ours.argmax(1), theirs.argmax(1)), name
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=FLOAT_TOLERANCE, err_msg=name)
