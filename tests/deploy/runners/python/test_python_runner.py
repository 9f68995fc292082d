"""The python runner (deploy.runners.python) against a real sshd on 127.0.0.1 (this machine =
device): the device script copied over, run under this interpreter with LCE, its outputs fetched,
and nothing left behind."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from support.processes import processes_mentioning

from deploy.errors import DeviceTimeoutError, MissingBinaryError
from deploy.runners.python.python_runner import run_remote_runner


@pytest.mark.slow
def test_remote_runner_measures_latency_and_accuracy_on_the_device(
    sshd, tiny_flatbuffer, tiny_samples
):
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    result, outputs = run_remote_runner(
        sshd.client(),
        tiny_flatbuffer,
        samples=tiny_samples,
        runs=20,
        python=sys.executable,
        timeout=300,
    )
    latency = result["latency_ms"]
    assert result["runtime"] == "lce-python" and latency["runs"] == 20
    assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
    with np.load(tiny_samples) as data:
        inputs, labels = data["inputs"], data["labels"]
    reference = Interpreter(tiny_flatbuffer.read_bytes(), use_indirect_bgemm=True).predict(
        inputs.transpose(0, 2, 3, 1).copy()
    )
    np.testing.assert_allclose(outputs, reference, rtol=1e-5, atol=1e-5)
    assert result["accuracy"]["top1"] == pytest.approx(np.mean(reference.argmax(1) == labels))
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
