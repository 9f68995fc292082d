"""The emulated aarch64 device as a product (deploy/emulator.py, `bnnexport device`): where it
cannot run it says why in one line; `device emulate` serves until Ctrl-C or SIGTERM and then
nothing it started runs. (`device start`, a bench on it with the real tool, `device stop`:
tests/deploy/test_bench_aarch64.py, which has the converted run.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from bnnexport.deploy import emulator
from bnnexport.deploy.errors import EmulatorUnavailableError
from support.aarch64_device import cache_dir
from support.cli import COMMAND, invoke
from support.guarantees import assert_one_line_error
from support.processes import processes_mentioning


def test_missing_packages_are_named_with_how_to_install_them(monkeypatch):
    monkeypatch.setattr(emulator.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        emulator.shutil, "which", lambda tool: None if tool == "mmdebstrap" else f"/bin/{tool}"
    )
    with pytest.raises(
        EmulatorUnavailableError, match=r"Debian packages missing: mmdebstrap \(`make device-tools`"
    ):
        emulator.check_host()


def test_without_root_emulate_says_why_in_one_line_and_exits_2(monkeypatch, tmp_path):
    monkeypatch.setattr(emulator.os, "geteuid", lambda: 1000)
    result = invoke("device", "emulate", "--dir", tmp_path / "device")
    assert_one_line_error(result, 2, "the emulated aarch64 device needs root")
    assert not (tmp_path / "device" / emulator.STATE).exists()


def test_stop_and_status_without_a_device(tmp_path):
    assert_one_line_error(invoke("device", "stop", "--dir", tmp_path), 2, "no emulated device")
    status = invoke("device", "status", "--dir", tmp_path)
    assert status.exit_code == 0 and "no emulated device serves from" in status.stdout


def test_a_benchmark_binary_for_another_architecture_is_refused_before_starting(tmp_path):
    x86 = tmp_path / "lce_benchmark_model"
    x86.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(11) + (0x3E).to_bytes(2, "little"))
    result = invoke("device", "start", "--dir", tmp_path / "d", "--benchmark-binary", x86)
    assert_one_line_error(result, 2, "is built for x86_64 but the device is aarch64")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_emulate_serves_until_stopped_and_then_nothing_it_started_runs(arm_device, tmp_path, stop):
    """`arm_device` only makes sure the device can run here (it skips, saying why, where not)."""
    session = tmp_path / "served"
    process = subprocess.Popen(
        [*COMMAND, "device", "emulate", "--dir", str(session)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BNNEXPORT_CACHE": str(cache_dir())},
    )
    namespace = f"mount --bind {session}"  # unshare's script: it holds sshd's namespace
    try:
        args = process.stdout.readline().split()
        assert args[:2] == ["--device", "root@127.0.0.1"], (args, process.stderr.read())
        port = int(args[args.index("--port") + 1])
        assert "--runner" in args and "--benchmark-binary" not in args
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert processes_mentioning(namespace) != []
        assert emulator.read_state(session)["port"] == port
        process.send_signal(getattr(signal, stop))
        stopping = time.monotonic()
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - stopping < 10  # not a 20 s wait for a signal nobody heeds
        notes = process.stderr.read()
        assert "not an ARM CPU's" in notes
        assert "stopped the emulated device" in notes
    finally:
        if process.poll() is None:
            process.kill()
    assert processes_mentioning(namespace) == [] and processes_mentioning(str(session)) == []
    assert emulator.read_state(session) is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
