"""bnnexport.deploy.ssh against a real sshd on 127.0.0.1 (this machine = device)."""

from __future__ import annotations

import os
import subprocess

import pytest
from bnnexport.deploy.connection import emulation
from bnnexport.deploy.errors import (
    DeviceAuthError,
    DeviceUnreachableError,
    RemoteCommandError,
)


def test_run_returns_the_remote_output(sshd):
    assert sshd.client().run(["echo", "hello device"]).stdout == "hello device\n"


def test_failed_remote_command_is_one_line_error(sshd):
    with pytest.raises(RemoteCommandError, match=r"exit 3") as info:
        sshd.client().run("echo broken >&2; exit 3")
    assert "\n" not in str(info.value) and "broken" in str(info.value)


@pytest.mark.slow
def test_workdir_is_made_under_remote_tmp_and_removed(sshd):
    client = sshd.client()
    with client.workdir() as work:
        assert work.startswith(str(sshd.remote_tmp))
        client.run(["touch", f"{work}/file"])
        assert len(sshd.leftovers()) == 1
    assert sshd.leftovers() == []


def test_workdir_is_removed_when_the_body_fails(sshd):
    client = sshd.client()
    with pytest.raises(KeyError), client.workdir():
        raise KeyError("failure inside the block")
    assert sshd.leftovers() == []


@pytest.mark.slow
def test_put_and_get_round_trip(sshd, tmp_path):
    client = sshd.client()
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 40)
    with client.workdir() as work:
        client.put(tmp_path / "a.bin", f"{work}/a.bin")
        client.get(f"{work}/a.bin", tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()


def test_identity_describes_this_machine(sshd):
    identity = sshd.client().identity()
    assert (
        identity.uname
        == subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    )
    assert (
        identity.machine
        == subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()
    )
    # nproc obeys OMP_NUM_THREADS (make test sets it), the shell sshd starts does not inherit it
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    cores = subprocess.run(["nproc"], capture_output=True, text=True, env=plain).stdout
    assert identity.cores == int(cores)
    assert identity.cpu_model not in ("", "unknown")
    assert identity.os != "unknown"
    assert identity.emulated is None  # this machine's own kernel and CPU


def test_closed_port_is_unreachable(sshd):
    client = sshd.client(port=sshd.closed_port())
    with pytest.raises(DeviceUnreachableError, match="Connection refused") as info:
        client.run(["true"])
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_key_the_server_does_not_accept_is_refused(sshd):
    with pytest.raises(DeviceAuthError, match="Permission denied") as info:
        sshd.client(identity_file=sshd.other_key).run(["true"])
    assert info.value.exit_code == 2


def test_unknown_host_key_is_refused_because_checking_stays_on(sshd, tmp_path):
    (tmp_path / "empty_known_hosts").write_text("")
    options = [
        f"UserKnownHostsFile={tmp_path / 'empty_known_hosts'}",
        "GlobalKnownHostsFile=/dev/null",
    ]
    with pytest.raises(DeviceAuthError, match="Host key verification failed"):
        sshd.client(options=options).run(["true"])


def test_a_device_whose_cpuinfo_is_another_architectures_is_emulated():
    x86 = ["processor\t: 0", "vendor_id\t: AuthenticAMD", "model name\t: AMD EPYC", "flags\t: sse"]
    arm = ["processor\t: 0", "CPU implementer\t: 0x41", "CPU architecture: 8", "CPU part\t: 0xd08"]
    said = emulation("aarch64", x86)
    assert said.startswith(
        "uname -m says aarch64 but /proc/cpuinfo describes an x86 CPU (AMD EPYC)"
    )
    assert emulation("aarch64", arm) is None  # a Raspberry Pi 4
    assert emulation("x86_64", x86) is None and emulation("x86_64", arm).startswith("uname -m")
    assert emulation("aarch64", []) is None  # nothing read: nothing said
