"""The emulated aarch64 device as a test fixture: `deploy.emulator`'s Debian bookworm arm64 under
qemu, with sshd on 127.0.0.1, and which `lce_benchmark_model` the device tests run there.

tests/conftest.py registers it as a plugin; the `arm_device` fixture is an
`sshd_fixture.Sshd`-like object whose `client()` talks to a genuine aarch64 user space (`uname -m`
prints aarch64; python3, numpy, coreutils and sshd are aarch64 binaries run by qemu-aarch64).
The tree is built once and cached in `~/.cache/bnnexport-test/` (or `$BNNEXPORT_TEST_CACHE`);
where it cannot be had (no root, no packages, binfmt not registrable), the fixture skips with
the reason. By hand, `bnnexport device emulate` serves the same device (README, "An ARM device
without a Pi").

The tool: LCE's real aarch64 `lce_benchmark_model` when BNNEXPORT_LCE_BENCHMARK_AARCH64 names it
(`make test` points it at ../shared/tools/lce_benchmark_model_aarch64 where that file exists),
else the stand-in (support/stand_in.py); the test session's header and its last lines say which
(`pytest_report_header`, `pytest_terminal_summary`).

Example (in a test):
    >>> def test_machine(arm_device):                                   # doctest: +SKIP
    ...     assert arm_device.client().run(["uname", "-m"]).stdout.strip() == "aarch64"
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from bnnexport.deploy.emulator import ensure_rootfs, keygen, running_device
from bnnexport.deploy.errors import EmulatorUnavailableError

from support.sshd_fixture import LoopbackSsh
from support.stand_in import REAL_BINARY


def cache_dir() -> Path:
    """Where built trees are kept between test sessions."""
    root = os.environ.get("BNNEXPORT_TEST_CACHE") or Path.home() / ".cache" / "bnnexport-test"
    return Path(root)


def tool_said() -> str:
    """Which `lce_benchmark_model` the device tests run: one line for the session's header."""
    if not REAL_BINARY:
        return ("device tests: lce_benchmark_model is the stand-in (NumPy reference interpreter, "
                "ARM's int8 rounding); set BNNEXPORT_LCE_BENCHMARK_AARCH64 to LCE's aarch64 "
                "build to run the real tool")  # fmt: skip
    path = Path(REAL_BINARY)
    if not path.is_file():
        return f"device tests: BNNEXPORT_LCE_BENCHMARK_AARCH64={REAL_BINARY} is not a file"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"device tests: lce_benchmark_model is the real tool {path} (sha256 {digest[:12]})"


def pytest_report_header(config) -> str:
    return tool_said()


def pytest_terminal_summary(terminalreporter) -> None:
    """The same line after the results: `make test` runs pytest with -q, which shows no header."""
    terminalreporter.write_line(tool_said())


@dataclasses.dataclass
class ArmDevice(LoopbackSsh):
    """What a test needs to talk to the emulated device (mirrors `sshd_fixture.Sshd`)."""

    CONNECT_TIMEOUT = 30  # everything on the device runs under qemu: give connections time

    port: int
    key: Path
    other_key: Path  # a valid key the device does not take
    known_hosts: Path
    remote_tmp: str  # the device's temporary directory, as the device sees it
    host_tmp: Path  # the same directory, as this machine sees it
    rootfs: Path
    build_seconds: float | None
    user: str = "root"


@pytest.fixture(scope="session")
def arm_device(tmp_path_factory):
    """Start sshd inside the emulated aarch64 tree on 127.0.0.1:<free port>; stop it after."""
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH client not installed (`make test` installs it)")
    try:
        rootfs, seconds = ensure_rootfs(cache_dir())
    except EmulatorUnavailableError as error:
        pytest.skip(f"no emulated aarch64 device: {error}")
    if seconds is not None:
        print(f"\nbuilt the emulated aarch64 device in {seconds:.0f} s: {rootfs}")
    session = tmp_path_factory.mktemp("arm-device")
    with contextlib.ExitStack() as stack:
        try:
            device = stack.enter_context(running_device(session, rootfs, seconds))
        except EmulatorUnavailableError as error:
            pytest.skip(f"no emulated aarch64 device: {error}")
        keygen(session / "other")
        yield ArmDevice(
            port=device.port,
            key=device.key,
            other_key=session / "other",
            known_hosts=device.known_hosts,
            remote_tmp=device.remote_tmp,
            host_tmp=device.host_tmp,
            rootfs=rootfs,
            build_seconds=seconds,
        )
