"""converters.translate.worker: the exact-grid twin translated in a second process gives the
translation this process gives, falls back to this process when the worker fails, and a
conversion with it writes the flatbuffer and the twin's reports a conversion without it does."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from support.converter_nets import FloatStemBinaryBody, export, grid_inputs, snap_to_grid

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("seeded")]  # TensorFlow and LCE run

SHAPE = (1, 3, 8, 8)


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return export(snap_to_grid(FloatStemBinaryBody().eval()), SHAPE,
                  tmp_path_factory.mktemp("worker") / "net.onnx")  # fmt: skip


@pytest.fixture(scope="module")
def twin(onnx_path):
    from bnnexport.converters.gate.twin import exact_grid_twin
    from bnnexport.converters.normalize import normalize

    return exact_grid_twin(normalize(onnx.load(onnx_path))[0])


@pytest.fixture()
def worker():
    from bnnexport.converters.translate.worker import TranslationWorker

    started = TranslationWorker()
    yield started
    started.close()


def test_the_worker_translates_as_this_process_does(twin, worker):
    from bnnexport.converters.translate import translate
    from bnnexport.converters.translate.worker import in_background

    for layout in ("nhwc", "nchw"):
        pending = in_background(twin, worker, float_model=False, input_layout=layout)
        assert pending.in_worker
        here = translate(twin, float_model=False, input_layout=layout)
        there = pending.result()
        assert there.flatbuffer == here.flatbuffer
        assert there.info == here.info


def test_a_dead_worker_leaves_the_translation_to_this_process(twin, worker, monkeypatch):
    from bnnexport.converters.translate import translate
    from bnnexport.converters.translate.worker import in_background

    pending = in_background(twin, worker, float_model=False, input_layout="nhwc")
    worker.close()  # killed before it answers
    assert pending.result().flatbuffer == translate(twin, False, input_layout="nhwc").flatbuffer
    assert not worker.alive()


def test_a_request_given_up_ends_the_worker_and_the_next_one_starts_afresh(twin):
    from bnnexport.converters.translate import translate
    from bnnexport.converters.translate.worker import in_background, shared_worker

    first = shared_worker()
    in_background(twin, first, float_model=False).cancel()
    assert not first.alive()
    second = shared_worker()
    assert second is not first and second.alive()
    pending = in_background(twin, second, float_model=False)
    assert pending.result().flatbuffer == translate(twin, float_model=False).flatbuffer
    assert shared_worker() is second  # answered: reused
    second.close()


def test_a_conversion_with_the_worker_is_the_conversion_without_it(onnx_path, tmp_path):
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    x = grid_inputs(16, SHAPE)
    results = {
        flag: convert_onnx(
            onnx_path,
            tmp_path / f"{flag}.tflite",
            inputs=x,
            options=ConvertOptions(twin_worker=flag),
        )  # fmt: skip
        for flag in (True, False)
    }
    assert (tmp_path / "True.tflite").read_bytes() == (tmp_path / "False.tflite").read_bytes()
    with_worker, without = (
        [dataclasses.asdict(r) for r in results[flag].twin] for flag in (True, False)
    )
    assert with_worker == without and len(without) == 1
    assert results[True].twin[0].max_abs_diff == 0.0
    assert np.isfinite(results[True].stage_seconds["twin"])


def test_small_models_one_core_and_little_memory_keep_the_twin_here(monkeypatch):
    from bnnexport.converters.translate import worker

    monkeypatch.setattr(worker, "available_memory", lambda: 64 << 30)
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert worker.worthwhile(100 << 20)
    assert not worker.worthwhile(worker.MIN_MODEL_BYTES - 1)
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda _pid: {0})
    assert not worker.worthwhile(100 << 20)
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(worker, "available_memory", lambda: 1 << 30)
    assert not worker.worthwhile(100 << 20)


def test_a_translation_the_worker_refuses_raises_its_error_here(worker):
    """The worker answers an error with a line; the translation is made again here, which
    raises the error itself, with its type (what the CLI turns into one line and exit 2)."""
    from bnnexport.converters.errors import UnsupportedOpError
    from bnnexport.converters.translate.worker import in_background
    from onnx import TensorProto, helper

    erf = helper.make_node("Erf", ["x"], ["y"], name="n0")  # an op the translator does not take
    graph = helper.make_graph(
        [erf], "erf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="'n0' of op type Erf"):
        in_background(model, worker, float_model=False).result()
    assert worker.alive() and not worker.busy  # it answered, and takes the next request


def test_a_worker_ended_mid_translation_leaves_no_temporary_saved_model(
    twin, tmp_path, monkeypatch
):
    """`close` while the child writes its SavedModel: SIGTERM unwinds it through the temporary
    directory, which is removed (a SIGKILL would leave hundreds of MB in /tmp per conversion)."""
    import time

    from bnnexport.converters.translate.worker import TranslationWorker, in_background

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the child's temporary directories go here
    worker = TranslationWorker()
    in_background(twin, worker, float_model=False)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("bnnexport-saved-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(tmp_path.glob("bnnexport-saved-*")), "the child never started translating"
    worker.close()
    assert worker.wait(120) == 0
    assert not list(tmp_path.glob("bnnexport-saved-*"))
