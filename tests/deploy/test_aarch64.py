"""The device path against a genuine aarch64 user space (deploy/emulator.py under qemu-user,
the `arm_device` fixture of tests/support/aarch64_device.py).

The real SSH client talks to an aarch64 sshd; `uname -m`, `/proc/cpuinfo` naming the host's CPU
(so the device says it is emulated), the ELF check, upload and clean-up, and the Python runner's
refusal (LCE has no aarch64 wheel) all meet the real thing. The accuracy protocol of
`lce_benchmark_model` (deploy/runners/lce_benchmark_model/chunked_accuracy.py) runs against:
- LCE's real aarch64 tool when BNNEXPORT_LCE_BENCHMARK_AARCH64 names it (`make test` does where
  ../shared/tools has it): a real LCE flatbuffer at batch N, outputs compared with the host's
  LCE interpreter;
- and, for what only a fake can do (a tool that aborts on a wrong input file, writes outputs of
  the wrong size, or lacks --output_filepath), the aarch64 Python stand-in, which honours the
  documented flags and file formats and computes a small NumPy model whose outputs this test
  knows, so wrong chunking, ordering or concatenation shows up as wrong numbers. These tests
  test the protocol with a fake whichever tool the session has.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bnnexport.deploy.errors import (
    DeviceAuthError,
    DeviceError,
    MissingBinaryError,
    RemoteCommandError,
    WrongArchitectureError,
)
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import run_lce_benchmark
from bnnexport.deploy.runners.lce_benchmark_model.chunked_accuracy import (
    AccuracyJob,
    DeviceOptions,
    run_on_device,
)
from bnnexport.deploy.runners.python.python_runner import run_remote_runner
from support.stand_in import REAL_BINARY, stand_in_outputs, write_stand_in


@pytest.fixture
def stand_in(arm_device, tmp_path):
    """(binary, graph, log): the stand-in script, a 10-class "graph", the device-side log."""
    log = arm_device.host_tmp.parent / "stand-in.log"
    log.unlink(missing_ok=True)

    def make(writes_outputs: bool = True) -> Path:
        name = "lce_benchmark_model" if writes_outputs else "lce_benchmark_model_07"
        return write_stand_in(
            tmp_path / name, f"{Path(arm_device.remote_tmp).parent}/stand-in.log", writes_outputs
        )

    graph = tmp_path / "model-b4.json"
    graph.write_text(json.dumps({"classes": 10}))
    return make, graph, log


def _invocations(log: Path) -> list[dict[str, str]]:
    lines = log.read_text().splitlines() if log.is_file() else []
    return [dict(a[2:].split("=", 1) for a in json.loads(line) if "=" in a) for line in lines]


# --- the device itself -----------------------------------------------------------------------


def test_device_is_aarch64_and_says_it_is_emulated(arm_device):
    identity = arm_device.client().identity()
    assert identity.machine == "aarch64"
    assert "aarch64" in identity.uname and identity.os.startswith("Debian")
    assert identity.emulated.startswith("uname -m says aarch64 but /proc/cpuinfo describes an")


def test_login_takes_only_the_session_key(arm_device):
    with pytest.raises(DeviceAuthError, match="Permission denied"):
        arm_device.client(identity_file=arm_device.other_key).run(["true"])


@pytest.mark.slow
def test_upload_round_trip_and_cleanup(arm_device, tmp_path):
    client = arm_device.client()
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 64)
    with client.workdir() as work:
        client.put(tmp_path / "a.bin", f"{work}/a.bin")
        assert arm_device.leftovers() != []
        # a genuine aarch64 tool reads the uploaded file on the device
        digest = client.run(["sha256sum", f"{work}/a.bin"]).stdout.split()[0]
        client.get(f"{work}/a.bin", tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()
    assert digest == hashlib.sha256((tmp_path / "a.bin").read_bytes()).hexdigest()
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_x86_binary_is_refused_before_upload(arm_device, tiny_flatbuffer):
    if platform.machine() != "x86_64":
        pytest.skip("needs an x86_64 host binary to upload")
    with pytest.raises(WrongArchitectureError, match="built for x86_64 but the device is aarch64"):
        run_lce_benchmark(arm_device.client(), tiny_flatbuffer, binary=shutil.which("true"))
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_x86_binary_on_the_device_path_is_refused(arm_device, tiny_flatbuffer):
    if platform.machine() != "x86_64":
        pytest.skip("needs an x86_64 host binary to place on the device")
    folder = arm_device.host_tmp.parent / "x86-bin"
    folder.mkdir(exist_ok=True)
    shutil.copy(shutil.which("true"), folder / "lce_benchmark_model")
    client = arm_device.client(remote_path=[f"{Path(arm_device.remote_tmp).parent}/x86-bin"])
    with pytest.raises(WrongArchitectureError, match="x86_64 but the device is aarch64"):
        run_lce_benchmark(client, tiny_flatbuffer)
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_python_runner_is_refused_without_lce_on_aarch64(arm_device, tiny_flatbuffer):
    client = arm_device.client()
    assert client.run(["python3", "-c", "import numpy"], timeout=120).returncode == 0
    with pytest.raises(MissingBinaryError, match="LCE has no pip wheel for Linux aarch64"):
        run_remote_runner(client, tiny_flatbuffer)
    assert arm_device.leftovers() == []


# --- the accuracy protocol with a fake lce_benchmark_model (the stand-in, whatever the tool) ---


@pytest.mark.slow
def test_stand_in_outputs_come_back_in_sample_order(arm_device, stand_in):
    samples = 6  # two chunks of 4, the last one padded: order, padding and joining all show
    make, graph, log = stand_in
    inputs = np.random.default_rng(samples).standard_normal((samples, 1, 3, 2)).astype(np.float32)
    job = AccuracyJob(graph, inputs, batch=4, outputs_per_sample=10)
    run = run_on_device(arm_device.client(), graph, DeviceOptions(binary=make(), runs=3), job)
    np.testing.assert_allclose(run.outputs, stand_in_outputs(inputs, 10), rtol=1e-5, atol=1e-5)
    assert run.invocations == -(-samples // 4) and run.note is None
    assert run.result.count == 3 and run.result.peak_memory_mb == 4.25
    # the row will say what ran: a script, not LCE's ELF build
    assert run.tool.format == "script (#!/usr/bin/env python3)" and run.tool.uploaded
    passes = [f for f in _invocations(log) if "input_layer_value_files" in f]
    assert len(passes) == run.invocations
    for flags in passes:
        assert flags["input_layer"] == "x" and flags["input_layer_shape"] == "4,1,3,2"
        assert flags["input_layer_value_files"].startswith("x:")
        assert flags["graph"].endswith("/model-b4.json") and "output_filepath" in flags
        assert (
            flags["num_runs"],
            flags["warmup_runs"],
            flags["warmup_min_secs"],
            flags["min_secs"],
            flags["enable_op_profiling"],
        ) == ("1", "0", "0", "0", "false")
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_wrong_input_shape_aborts_and_cleans_up(arm_device, stand_in):
    make, graph, _ = stand_in
    inputs = np.zeros((8, 1, 3, 2), np.float32)
    job = AccuracyJob(graph, inputs, batch=4, outputs_per_sample=10)
    job.input_shape = lambda: "4,1,3,3"  # a shape that does not match the file's bytes
    expected = (
        r"failed on .* computing outputs on chunk\.aaaaaa: "
        r"ERROR: file chunk\.aaaaaa has 96 bytes, the tensor 144"
    )
    with pytest.raises(RemoteCommandError, match=expected) as info:
        run_on_device(arm_device.client(), graph, DeviceOptions(binary=make()), job)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_outputs_of_the_wrong_size_are_refused(arm_device, stand_in, tmp_path):
    make, _, _ = stand_in
    graph = tmp_path / "model-12-classes.json"
    graph.write_text(json.dumps({"classes": 12}))  # the job expects 10 outputs per sample
    job = AccuracyJob(graph, np.zeros((4, 1, 3, 2), np.float32), 4, 10)
    with pytest.raises(DeviceError, match="have 192 bytes, expected 160") as info:
        run_on_device(arm_device.client(), graph, DeviceOptions(binary=make()), job)
    assert "\n" not in str(info.value)
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_binary_without_output_filepath_gives_latency_and_one_note(arm_device, stand_in):
    make, graph, log = stand_in
    job = AccuracyJob(graph, np.zeros((4, 1, 3, 2), np.float32), 4, 10)
    run = run_on_device(arm_device.client(), graph, DeviceOptions(binary=make(False)), job)
    assert run.outputs is None and run.invocations == 0
    assert "has no --output_filepath" in run.note and "\n" not in run.note
    assert run.result.mean_ms == pytest.approx(2.01)
    assert not [f for f in _invocations(log) if "input_layer_value_files" in f]
    assert arm_device.leftovers() == []


# --- accuracy with lce_benchmark_model: the user's real binary -------------------------------

BATCH_MODEL = "tf.TensorSpec([1, 8, 8, 32]"


@pytest.fixture(scope="module")
def tiny_b4(tmp_path_factory) -> Path:
    """The tiny model of support/sshd_fixture.py converted at batch 4, declaring NHWC input as
    bnnexport's flatbuffers do (its C, 32, is not its H or W: a wrong layout is other bytes)."""
    from bnnexport.converters.flatbuffer import layout_metadata, with_metadata
    from support.sshd_fixture import TINY_MODEL_SOURCE

    pytest.importorskip("larq_compute_engine")
    folder, batch = tmp_path_factory.mktemp("tiny-b4"), 4
    assert BATCH_MODEL in TINY_MODEL_SOURCE and "[1, -1]" in TINY_MODEL_SOURCE
    source = TINY_MODEL_SOURCE.replace(BATCH_MODEL, f"tf.TensorSpec([{batch}, 8, 8, 32]")
    (folder / "make.py").write_text(source.replace("[1, -1]", f"[{batch}, -1]"))
    subprocess.run(
        [sys.executable, str(folder / "make.py"), str(folder)], check=True, capture_output=True
    )
    flatbuffer = folder / f"tiny-b{batch}.tflite"
    made = (folder / "tiny.tflite").read_bytes()
    flatbuffer.write_bytes(with_metadata(made, layout_metadata("nhwc")))
    return flatbuffer


@pytest.mark.slow
def test_the_lce_benchmark_model_runner_feeds_an_nhwc_copy_nhwc_samples(arm_device, tiny_b4):
    """bench's NCHW samples go up as the raw bytes of the layout the batched copy declares
    (`Samples.fed()`): the device's outputs are the host interpreter's on NHWC inputs. Run by
    the stand-in (the reference interpreter on the real flatbuffer) or the real tool."""
    from bnnexport.converters.flatbuffer import input_layout
    from bnnexport.converters.runtimes import run_lce
    from bnnexport.deploy.runners import RunSettings, Samples
    from bnnexport.deploy.runners.lce_benchmark_model.benchmark_runner import LceBenchmarkModel
    from support.device_runs import tool

    nchw = np.random.default_rng(5).standard_normal((4, 32, 8, 8)).astype(np.float32)
    layout = input_layout(tiny_b4)
    assert layout == "nhwc"
    samples = Samples(nchw, np.zeros(4, np.int64), 10, tiny_b4, 4, input_layout=layout)
    binary = tool(tiny_b4.parent)
    settings = RunSettings(runs=1, warmup=0, timeout=900, benchmark_binary=binary)
    measured = LceBenchmarkModel().measure(arm_device.client(), tiny_b4, settings, samples)
    # the host's LCE on the same copy, fed NHWC by the flatbuffer's own declaration
    np.testing.assert_allclose(measured.outputs, run_lce(tiny_b4, nchw), rtol=1e-4, atol=1e-4)
    assert arm_device.leftovers() == []


# make test's bench tests run the real tool through the same protocol (two chunks, the last one
# padded, against the host's LCE: tests/deploy/test_bench_aarch64.py); this one, three chunks of
# a tiny model straight through run_on_device, is the long tier's
@pytest.mark.long
@pytest.mark.skipif(
    not REAL_BINARY,
    reason="set BNNEXPORT_LCE_BENCHMARK_AARCH64 to the real "
    "lce_benchmark_model_aarch64 to run it under emulation",
)
def test_real_binary_agrees_with_the_host_interpreter(arm_device, tiny_b4):
    print(f"\nlce_benchmark_model: the real binary {REAL_BINARY}")
    batch, flatbuffer = 4, tiny_b4
    inputs = np.random.default_rng(3).standard_normal((10, 8, 8, 32)).astype(np.float32)
    from bnnexport.converters.runtimes import lce_batch_predict, lce_interpreter

    host = lce_batch_predict(lce_interpreter(flatbuffer))
    padded = np.concatenate([inputs, np.zeros((2, 8, 8, 32), np.float32)])
    # one invocation per chunk, as on the device (the wrapper's predict() feeds batch-1 slices)
    reference = np.concatenate([host([padded[i : i + batch]])[0] for i in range(0, 12, batch)])
    job = AccuracyJob(flatbuffer, inputs, batch=batch, outputs_per_sample=10)
    run = run_on_device(
        arm_device.client(),
        flatbuffer,
        DeviceOptions(binary=REAL_BINARY, runs=2, warmup_runs=1, timeout=900),
        job,
    )
    assert run.note is None and run.invocations == 3
    np.testing.assert_allclose(run.outputs, reference[:10], rtol=1e-4, atol=1e-4)
    digest = hashlib.sha256(Path(REAL_BINARY).read_bytes()).hexdigest()
    assert (run.tool.format, run.tool.sha256) == ("ELF aarch64", digest)
    assert arm_device.leftovers() == []
