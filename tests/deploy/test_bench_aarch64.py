"""`bnnexport bench --device` end to end on the emulated aarch64 device (deploy/emulator.py, the
`arm_device` fixture), over SSH and over ADB (`adb:SERIAL`, a fake `adb` whose device is that
one: support/fake_adb.py), the device `bnnexport device start` serves, and grouped binary convs
there.

A trained, exported and converted run with its batch-32 copy; bench runs the LCE flatbuffer on
the device with `lce_benchmark_model`: LCE's real aarch64 build when
BNNEXPORT_LCE_BENCHMARK_AARCH64 names it (`make test` does where ../shared/tools has it), else
the aarch64 stand-in, which computes a real flatbuffer with the NumPy reference interpreter
tests/support/lce_reference.py (ARM's int8 rounding; under qemu). The float flatbuffer's outputs
must be the host LCE's (argmax agreement 1, float tolerance). The int8 one's may differ from the
host's by whole output steps, because ARM's int8 kernels round requantization ties away from zero
where LCE's x86 build rounds them up (docs/LCE_NOTES.md "int8 on ARM"): the device must compute
what ARM's rounding gives (lce_reference with `rounding="arm"`, bit for bit on every int8 tensor
against the real tool), bench must report the difference in steps, and top-1 may move only on the
samples that differ. With the stand-in, that first check tests the stand-in; its latency lines
are made up. Each test prints which tool it ran.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from bnnexport.converters.flatbuffer import flatbuffer_ops
from support.aarch64_device import cache_dir
from support.cli import invoke
from support.converter_nets import binary_conv, lce_grouped_flatbuffer, sign, trained_bn
from support.device_runs import (
    assert_float_device_is_the_hosts,
    assert_int8_device_follows_arm,
    assert_labelled,
    bench_on,
    emulated_device_args,
    rows_of,
    tool,
)
from support.fake_adb import write_fake_adb
from support.processes import processes_mentioning
from support.stand_in import REAL_BINARY, write_stand_in

from bnnexport.run.checkpoint import load_model

SAMPLES = 40
BATCH = 32  # 2 chunks on the device, the last one padded


@pytest.fixture(scope="module")
def copied_run(_trained_run_template, tmp_path_factory):
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx

    run = tmp_path_factory.mktemp("bench-arm") / "run"
    shutil.copytree(_trained_run_template, run)
    export_onnx(run, samples=SAMPLES)
    convert_run(run, target="arm64", fmt="tflite", batched_copy=BATCH)
    return run


def _bench(run, arm_device, binary, *args):
    return bench_on(run, emulated_device_args(arm_device, binary), SAMPLES, *args)


@pytest.mark.slow
def test_bench_measures_accuracy_on_the_aarch64_device(copied_run, arm_device, tmp_path):
    binary = tool(tmp_path)
    # the acceptance command: accuracy, the op profile by layer, two thread counts
    args = ("--device-batch", str(BATCH), "--profile", "--threads", "1,2")
    result = _bench(copied_run, arm_device, binary, *args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"]["machine"] == "aarch64"
    host = {b["name"]: b for b in data["backends"] if b["where"] == "host"}
    device, versus_host, two = [b for b in data["backends"] if b["where"] != "host"]
    assert (device["name"], versus_host["name"]) == ("lce", "lce vs host lce")
    assert two["name"] == "lce (2 threads)" and two["extra"]["peak_memory_mb"] is not None
    profile = data["profile"]
    modules = {name for name, _ in load_model(copied_run).named_modules()} | {"(input)"}
    assert profile["notes"] == [] and {t["layer"] for t in profile["layers"]} <= modules
    assert any(t["binary"] and "LceBconv2d" in t["op_types"] for t in profile["layers"])
    op_types = {op for t in profile["layers"] for op in t["op_types"]}
    assert {"LceBconv2d", "LceQuantize", "LceBMaxPool2d"} <= op_types
    if REAL_BINARY:  # this build has no XNNPACK: every op is a row of its own, in plan order
        flat = [op.op_type for op in flatbuffer_ops(copied_run / "model-arm64.tflite")]
        assert [o["node_type"] for o in device["extra"]["ops"]] == flat
        assert {"CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D"} <= op_types
    assert_labelled(device, binary)
    assert data["device"]["emulated"] == device["extra"]["emulated"]
    extra = device["extra"]
    assert extra["accuracy_model"] == f"model-arm64-b{BATCH}.tflite"
    assert (extra["accuracy_batch"], extra["accuracy_invocations"]) == (BATCH, 2)
    assert extra["note"] is None and extra["peak_memory_mb"] is not None
    assert device["latency_ms"]["mean"] > 0
    # the device computes what the host's LCE computes (a real binary or the stand-in alike)
    assert (device["top1"], device["top5"]) == (host["lce"]["top1"], host["lce"]["top5"])
    assert versus_host["argmax_agreement"] == 1.0 and versus_host["max_abs_diff"] < 1e-4
    assert device["argmax_agreement"] == host["lce"]["argmax_agreement"]  # vs PyTorch
    report = (copied_run / "report.md").read_text()
    assert "Accuracy on the device" in report and "| lce vs host lce |" in report
    assert "## Time by PyTorch layer on" in report and "bench_device_layers.png" in report
    assert arm_device.leftovers() == []


@pytest.mark.slow
def test_bench_measures_accuracy_on_an_adb_device(copied_run, arm_device, tmp_path, monkeypatch):
    """`--device adb:SERIAL`: the same bench through the ADB transport, with a fake `adb` whose
    device is the emulated aarch64 one (each `adb shell` / `push` / `pull` run there through
    its ssh): the tool and both flatbuffers pushed, the outputs pulled, the host LCE's
    outputs computed on the device."""
    binary, log = tool(tmp_path), tmp_path / "adb.log"
    adb = write_fake_adb(tmp_path / "bin", {"arm64-1": arm_device.client().ssh_args()}, log)
    monkeypatch.setenv("PATH", f"{adb.parent}{os.pathsep}{os.environ['PATH']}")
    device = ["--device", "adb:arm64-1", "--remote-tmp", arm_device.remote_tmp, "--runner",
              "lce_benchmark_model", "--benchmark-binary", binary]  # fmt: skip
    result = bench_on(copied_run, device, SAMPLES, "--device-batch", str(BATCH))
    rows = rows_of(result)
    data = json.loads(result.stdout)
    assert (data["device"]["destination"], data["device"]["machine"]) == ("adb:arm64-1", "aarch64")
    assert rows[("lce", False)]["where"] == "adb:arm64-1"
    assert rows[("lce", False)]["latency_ms"]["mean"] > 0
    assert rows[("lce", False)]["extra"]["accuracy_invocations"] == 2
    assert_float_device_is_the_hosts(rows, copied_run, SAMPLES)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {call[2] for call in calls} == {"shell", "push", "pull"}
    pushed = sorted(os.path.basename(call[3]) for call in calls if call[2] == "push")
    assert pushed == sorted([os.path.basename(binary), "model-arm64.tflite",
                             f"model-arm64-b{BATCH}.tflite", "samples.f32"])  # fmt: skip
    assert arm_device.leftovers() == []


@pytest.fixture(scope="module")
def int8_run(copied_run, tmp_path_factory):
    """The same run, also converted with its float layers in int8 (with its batch-32 copy)."""
    from bnnexport.stages.convert import convert_run

    run = tmp_path_factory.mktemp("bench-arm-int8") / "run"
    shutil.copytree(copied_run, run)
    convert_run(run, target="arm64", float_layers="int8", batched_copy=BATCH)
    return run


@pytest.mark.slow
def test_bench_runs_the_int8_flatbuffer_beside_the_float_one_on_the_device(
    int8_run, arm_device, tmp_path
):
    binary = tool(tmp_path)
    result = _bench(int8_run, arm_device, binary, "--device-batch", str(BATCH), "--profile")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = {(b["name"], b["where"] == "host"): b for b in data["backends"]}
    device, versus_host = rows[("lce-int8", False)], rows[("lce-int8 vs host lce-int8", False)]
    assert device["extra"]["accuracy_model"] == f"model-arm64-int8-b{BATCH}.tflite"
    assert device["size_bytes"] < rows[("lce", False)]["size_bytes"]
    assert_labelled(device, binary)
    change = data["int8_profile"]["change"]
    assert change["summary"].startswith("int8 device profile: float layers")
    assert {r["layer"] for r in change["layers"]} >= {"features.0", "classifier.3"}
    report = (int8_run / "report.md").read_text()
    assert "## What int8 changed, by PyTorch layer" in report
    assert arm_device.leftovers() == []
    # the device computes what ARM's int8 rounding gives (with the real tool: LCE's ARM kernels)
    assert_int8_device_follows_arm(rows, int8_run, SAMPLES, BATCH)
    if versus_host["extra"]["max_steps"]:
        assert "LCE's ARM build computes int8 so" in result.stderr
        assert "int8 output step(s)" in report


# --- grouped binary convs: what LCE's default kernels run ------------------------------------


class _GroupedBinary(nn.Module):
    """float stem -> binarize -> 3x3 ±1 conv in 2 groups of 32 channels -> BatchNorm -> head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.conv = binary_conv(64, 64, 3, padding=1, groups=2)
        self.bn = trained_bn(nn.BatchNorm2d(64))
        self.head = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.bn(self.conv(sign(self.stem(x)))), 1))


def _bench_file(flatbuffer, arm_device, binary):
    result = _bench(flatbuffer, arm_device, binary)
    assert result.exit_code == 0, result.output
    rows = [b for b in json.loads(result.stdout)["backends"] if b["where"] != "host"]
    return result, rows[0]


@pytest.fixture
def tool_and_log(arm_device, tmp_path):
    """(tool, log): the tool the device tests run, and the file of this machine the stand-in
    logs each argv to (None for the real tool, which logs nothing)."""
    log = arm_device.host_tmp.parent / "grouped-stand-in.log"
    log.unlink(missing_ok=True)
    binary = tool(tmp_path, f"{Path(arm_device.remote_tmp).parent}/{log.name}")
    return binary, None if REAL_BINARY else log


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_grouped_model_benches_on_the_device_with_the_tools_default_kernels(
    arm_device, tool_and_log, tmp_path, seeded
):
    """bnnexport writes a grouped binary conv as one LceBconv2d per group, so LCE's default
    kernels run it: bench passes no kernel flag (the stand-in, which refuses a grouped
    LceBconv2d without one, logs what it got; the real tool runs it)."""
    from bnnexport import convert_module

    binary, log = tool_and_log
    report = convert_module(_GroupedBinary(), torch.randn(1, 3, 8, 8), out=tmp_path / "g.tflite")
    assert report.lce_bconv2d == 2 and report.lce_settings == {}
    _, row = _bench_file(tmp_path / "g.tflite", arm_device, binary)
    assert row["name"] == "lce" and row["latency_ms"]["mean"] > 0
    assert row["extra"]["lce_settings"] == {}
    if log is not None:
        argvs = [json.loads(line) for line in log.read_text().splitlines()]
        assert argvs and not any("use_indirect_bgemm" in arg for argv in argvs for arg in argv)
    assert arm_device.leftovers() == []


@pytest.fixture
def logged_stand_in(arm_device, tmp_path):
    """(stand-in, log): the stand-in logging each argv to a file the host reads."""
    log = arm_device.host_tmp.parent / "grouped-stand-in.log"
    log.unlink(missing_ok=True)
    remote_log = f"{Path(arm_device.remote_tmp).parent}/{log.name}"
    return write_stand_in(tmp_path / "lce_benchmark_model", remote_log), log


@pytest.mark.slow
def test_a_grouped_lce_bconv2d_runs_on_the_device_only_with_indirect_bgemm(
    arm_device, logged_stand_in, tmp_path
):
    """A flatbuffer holding LCE's own grouped LceBconv2d (another tool's), which LCE's optimized
    BGEMM kernel refuses: bench tells the runner `--use_indirect_bgemm=true` and says why in a
    note. The stand-in, whatever tool the session has: it refuses the flatbuffer without the
    flag as that kernel does and logs the flag bench passed (the real aarch64 build here runs
    it either way, its default bconv kernel being LCE's reference one: docs/LCE_NOTES.md "int8
    on ARM")."""
    binary, log = logged_stand_in
    theirs = lce_grouped_flatbuffer(tmp_path / "theirs.tflite")
    client = arm_device.client()
    with client.workdir() as work:
        client.put(binary, f"{work}/tool")
        client.put(theirs, f"{work}/theirs.tflite")
        refused = client.run(["python3", f"{work}/tool", f"--graph={work}/theirs.tflite",
                              "--num_runs=1"], check=False, merge_stderr=True)  # fmt: skip
    assert refused.returncode == 1
    assert "Grouped binary convolutions are not supported with this kernel." in refused.stdout
    assert "Benchmarking failed." in refused.stdout

    result, row = _bench_file(theirs, arm_device, str(binary))
    assert row["extra"]["lce_settings"] == {"use_indirect_bgemm": True}
    assert "theirs.tflite needs use_indirect_bgemm=True" in result.stderr
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    assert all("--use_indirect_bgemm=true" in argv for argv in argvs[1:])  # [0]: the refusal
    assert arm_device.leftovers() == []


# --- the device `bnnexport device start` serves ----------------------------------------------


@pytest.mark.slow
def test_device_start_serves_a_device_bench_runs_on_and_stop_leaves_nothing_running(
    copied_run, arm_device, tmp_path, monkeypatch
):
    """The product command end to end (`arm_device` only makes sure the device can run here):
    start it, bench the run on it with the tool, stop it; then nothing it started runs."""
    binary = tool(tmp_path)
    monkeypatch.setenv("BNNEXPORT_CACHE", str(cache_dir()))
    session = tmp_path / "product-device"
    started = invoke("device", "start", "--dir", session, "--benchmark-binary", binary, "--json")
    try:
        assert started.exit_code == 0, started.output
        state = json.loads(started.stdout)
        assert "not an ARM CPU's" in started.stderr
        assert invoke("device", "status", "--dir", session).stdout.split() == state["bench_args"]
        result = bench_on(copied_run, state["bench_args"], SAMPLES, "--device-batch", str(BATCH))
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        device = next(b for b in data["backends"] if b["name"] == "lce" and b["where"] != "host")
        host = next(b for b in data["backends"] if b["name"] == "lce" and b["where"] == "host")
        assert device["top1"] == host["top1"] and device["extra"]["note"] is None
        assert_labelled(device, binary)
    finally:
        stopped = invoke("device", "stop", "--dir", session)
    assert stopped.exit_code == 0, stopped.output
    assert processes_mentioning(str(session)) == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", state["port"]), timeout=1).close()
    assert "no emulated device serves" in invoke("device", "status", "--dir", session).stdout
