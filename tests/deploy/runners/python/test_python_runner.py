"""The python runner (deploy.runners.python) against a real sshd on 127.0.0.1 (this machine =
device): the device script copied over, run under this interpreter with LCE, its outputs fetched,
and nothing left behind."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from bnnexport.deploy.errors import DeviceTimeoutError, MissingBinaryError
from bnnexport.deploy.runners import RunSettings, Samples
from bnnexport.deploy.runners.python.python_runner import PythonRunner, run_remote_runner
from support.processes import processes_mentioning


@pytest.mark.slow
def test_the_python_runner_feeds_an_nhwc_flatbuffer_nhwc_samples_and_scores_them(
    sshd, tiny_flatbuffer, tiny_samples
):
    """bench's NCHW samples go to the device in the layout the flatbuffer declares (NHWC
    here, `Samples.fed()`): the device's outputs are the host interpreter's on NHWC inputs."""
    from bnnexport.converters.flatbuffer import input_layout
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    with np.load(tiny_samples) as data:
        inputs, labels = data["inputs"], data["labels"]
    assert input_layout(tiny_flatbuffer) == "nhwc" and inputs.shape[1:] == (32, 8, 8)
    samples = Samples(inputs, labels, 10, input_layout=input_layout(tiny_flatbuffer))
    settings = RunSettings(runs=20, remote_python=sys.executable, timeout=300)
    measured = PythonRunner().measure(sshd.client(), tiny_flatbuffer, settings, samples)
    latency = measured.latency
    assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
    reference = Interpreter(tiny_flatbuffer.read_bytes(), use_indirect_bgemm=True).predict(
        inputs.transpose(0, 2, 3, 1).copy()
    )
    np.testing.assert_allclose(measured.outputs, reference, rtol=1e-5, atol=1e-5)
    accuracy = measured.extra["device_accuracy"]
    assert accuracy["top1"] == pytest.approx(np.mean(reference.argmax(1) == labels))
    assert sshd.leftovers() == []


def test_remote_runner_without_lce_python_is_missing_binary(sshd, tiny_flatbuffer):
    with pytest.raises(MissingBinaryError, match="larq_compute_engine"):
        run_remote_runner(sshd.client(), tiny_flatbuffer, python="/nonexistent/python3")
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_timeout_stops_the_remote_runner_and_cleans_up(sshd, tiny_flatbuffer):
    with pytest.raises(DeviceTimeoutError, match="ran past 4 s") as info:
        run_remote_runner(
            sshd.client(), tiny_flatbuffer, runs=10**9, python=sys.executable, timeout=4
        )
    assert info.value.exit_code == 2
    assert sshd.leftovers() == []
    assert processes_mentioning(str(sshd.remote_tmp)) == []
