"""benchmark_tool.run_lce_benchmark (the lce_benchmark_model runner) over a real sshd on 127.0.0.1.

No x86 build of lce_benchmark_model exists here, so the binary that "runs" is a small shell
script standing in for it: it checks that it got the uploaded graph and prints output in the
documented format. What is tested is the plumbing (find or upload, architecture check, flags,
parse, clean-up); the parser itself is tested on full outputs in test_benchmark_tool.py.
"""

from __future__ import annotations

import pytest
from bnnexport.deploy.errors import (
    DeviceTimeoutError,
    MissingBinaryError,
    RemoteCommandError,
    WrongArchitectureError,
)
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import run_lce_benchmark
from support.processes import processes_mentioning
from support.stand_in import AARCH64, elf_header

STAND_IN = """#!/bin/sh
# stands in for lce_benchmark_model: needs --graph pointing at an existing file
graph=""
for arg in "$@"; do case "$arg" in --graph=*) graph="${arg#--graph=}";; esac; done
[ -f "$graph" ] || { echo "ERROR: Could not open '$graph'." >&2; exit 1; }
echo "args: $*"
echo "count=7 first=2100 curr=2000 min=1990 max=2100 avg=2010 std=40"
echo "Inference timings in us: Init: 3120, First inference: 2100, Warmup (avg): 2010"
echo "Overall peak memory footprint (MB) via periodic monitoring: 4.25"
"""


@pytest.fixture
def stand_in_bin(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "lce_benchmark_model").write_text(STAND_IN)
    (folder / "lce_benchmark_model").chmod(0o755)
    return folder


@pytest.mark.slow
def test_binary_on_the_device_path_is_run_with_the_uploaded_graph(
    sshd, tiny_flatbuffer, stand_in_bin
):
    client = sshd.client(remote_path=[str(stand_in_bin)])
    result, raw = run_lce_benchmark(client, tiny_flatbuffer, threads=2, runs=7)
    assert "--num_threads=2" in raw and "--num_runs=7" in raw
    assert "--enable_op_profiling=true" in raw and f"/{tiny_flatbuffer.name}" in raw
    assert result.count == 7 and result.mean_ms == pytest.approx(2.01)
    assert result.peak_memory_mb == 4.25
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_uploaded_binary_is_used(sshd, tiny_flatbuffer, stand_in_bin):
    result, raw = run_lce_benchmark(
        sshd.client(), tiny_flatbuffer, binary=stand_in_bin / "lce_benchmark_model"
    )
    assert str(sshd.remote_tmp) in raw.split("--graph=")[1]
    assert result.min_ms == pytest.approx(1.99)
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_missing_binary_on_the_device(sshd, tiny_flatbuffer):
    with pytest.raises(MissingBinaryError, match="not on the PATH") as info:
        run_lce_benchmark(sshd.client(), tiny_flatbuffer)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert sshd.leftovers() == []


def test_missing_local_binary(sshd, tiny_flatbuffer, tmp_path):
    with pytest.raises(MissingBinaryError, match="not found"):
        run_lce_benchmark(sshd.client(), tiny_flatbuffer, binary=tmp_path / "nope")


def test_aarch64_binary_on_an_x86_device_is_refused_before_upload(sshd, tiny_flatbuffer, tmp_path):
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("this machine is the device; the test needs it to be x86_64")
    fake = tmp_path / "lce_benchmark_model_aarch64"
    fake.write_bytes(elf_header(AARCH64) + bytes(100))  # what the release asset starts with
    with pytest.raises(WrongArchitectureError, match="built for aarch64 but the device is x86_64"):
        run_lce_benchmark(sshd.client(), tiny_flatbuffer, binary=fake)
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_failing_binary_is_a_one_line_error(sshd, tmp_path, stand_in_bin):
    missing_graph = tmp_path / "model.tflite"
    missing_graph.write_bytes(b"")
    script = stand_in_bin / "lce_benchmark_model"
    script.write_text("#!/bin/sh\necho 'ERROR: Failed to mmap model' >&2\nexit 1\n")
    with pytest.raises(RemoteCommandError, match="Failed to mmap model") as info:
        run_lce_benchmark(sshd.client(), missing_graph, binary=script)
    assert "\n" not in str(info.value)
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_binary_past_the_timeout_is_stopped_on_the_device(sshd, tiny_flatbuffer, stand_in_bin):
    script = stand_in_bin / "lce_benchmark_model"
    script.write_text("#!/bin/sh\nsleep 300\n")
    with pytest.raises(DeviceTimeoutError, match="ran past 2 s") as info:
        run_lce_benchmark(sshd.client(), tiny_flatbuffer, binary=script, timeout=2)
    assert info.value.exit_code == 2
    assert sshd.leftovers() == []
    assert processes_mentioning(str(sshd.remote_tmp)) == []
