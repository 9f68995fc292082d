"""A small client over the Android Debug Bridge (`adb`): the `adb` transport, `adb:SERIAL`.

As LCE's own Android benchmarks are run: the model and the tool go to the device with
`adb push`, run there with `adb shell`, and what they wrote comes back with `adb pull`. The
`adb` on this machine's PATH is used (Debian's `adb` package, or the Android SDK's
platform-tools); the serial is the one `adb devices` lists. `adb shell` hands the device's
shell one string, as ssh does, and passes the command's exit status back (adb's shell protocol
v2, adb 1.0.36 / Android 7 and later). Temporary directories go under /data/local/tmp, the
directory an app-less shell may write and execute in.

Example:
    >>> client = AdbClient("emulator-5554")
    >>> client.adb_args("shell")
    ['adb', '-s', 'emulator-5554', 'shell']
    >>> client.destination, client.remote_tmp
    ('adb:emulator-5554', '/data/local/tmp')
    >>> with client.workdir() as work:                  # doctest: +SKIP
    ...     client.put("model.tflite", f"{work}/model.tflite")
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bnnexport.deploy.connection import (
    DeviceIdentity,
    Reach,
    Transport,
    check_address,
    checked,
    command_name,
    last_line,
    local_timeout,
    probe_identity,
    register_transport,
    run_here,
    shell_script,
    temporary_workdir,
)
from bnnexport.deploy.errors import DeviceAuthError, DeviceError, DeviceUnreachableError

ANDROID_TMP = "/data/local/tmp"
INSTALL = "install Debian's `adb` package (apt-get install adb) or Android's platform-tools"
# what adb itself (not the command on the device) prints when it cannot reach the device
_UNREACHABLE = ("device '", "no devices/emulators found", "device offline", "cannot connect",
                "failed to connect", "error: closed", "protocol fault")  # fmt: skip
_AUTH = ("unauthorized", "insufficient permissions")


class AdbClient:
    """Run commands on and copy files to one Android device by its serial (`adb devices`).

    `remote_tmp` is the directory where working directories are made; `remote_path` directories
    are put in front of the device's PATH for every command.
    """

    def __init__(
        self,
        serial: str,
        remote_tmp: str = ANDROID_TMP,
        remote_path: Sequence[str] = (),
        adb: str = "adb",
    ) -> None:
        self.serial = serial
        self.destination = f"adb:{serial}"
        self.remote_tmp = remote_tmp
        self.remote_path = list(remote_path)
        self.adb = adb

    def adb_args(self, *args: str) -> list[str]:
        """The `adb` argv for this device: `adb -s SERIAL ARGS...`."""
        return [self.adb, "-s", self.serial, *args]

    def _fault(self, done: subprocess.CompletedProcess, what: str) -> DeviceError | None:
        """The error adb itself reported reaching the device, or None (the command's own)."""
        text = done.stderr.lower()
        if done.returncode == 0 or not text.startswith(("adb: ", "error: ")):
            return None
        line = last_line(done.stderr) or "no message"
        if any(marker in text for marker in _AUTH):
            return DeviceAuthError(
                f"{self.destination} refused {what}: {line} (accept this computer's key in the "
                "device's USB debugging prompt)"
            )
        if any(marker in text for marker in _UNREACHABLE):
            return DeviceUnreachableError(
                f"cannot reach {self.destination}: {line} (`adb devices` lists the serials)"
            )
        return None

    def run(
        self,
        command: Sequence[str] | str,
        timeout: float = 60.0,
        check: bool = True,
        cwd: str | None = None,
        merge_stderr: bool = False,
        limit_remote: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run `command` (argv, or a shell string) on the device with `adb shell`; return its
        CompletedProcess. Errors as `deploy.connection.Connection.run` says."""
        limit = timeout if limit_remote else None
        script = shell_script(command, cwd, merge_stderr, limit, self.remote_path)
        argv = self.adb_args("shell", script)
        what = f"`{command_name(command)}`"
        done = run_here(argv, local_timeout(timeout, limit_remote), what, self.destination, INSTALL)
        fault = self._fault(done, "the connection")
        if fault is not None:
            raise fault
        return checked(done, command, self.destination, timeout, limit_remote, check)

    def _copy(self, argv: list[str], timeout: float, what: str) -> None:
        done = run_here(argv, timeout, what, self.destination, INSTALL)
        if done.returncode != 0:
            line = last_line(done.stderr) or last_line(done.stdout) or "no message"
            raise self._fault(done, what) or DeviceError(
                f"{what} on {self.destination} failed: {line}"
            )

    def put(self, local: str | Path, remote: str, timeout: float = 300.0) -> None:
        """Copy a local file to `remote` (a path on the device) with `adb push`."""
        argv = self.adb_args("push", str(local), remote)
        self._copy(argv, timeout, f"copying {Path(local).name}")

    def get(self, remote: str, local: str | Path, timeout: float = 300.0) -> None:
        """Copy `remote` (a path on the device) to a local file with `adb pull`."""
        argv = self.adb_args("pull", remote, str(local))
        self._copy(argv, timeout, f"fetching {Path(remote).name}")

    def workdir(self) -> contextlib.AbstractContextManager[str]:
        """Make a fresh directory on the device (mktemp -d), yield its path, always remove it."""
        return temporary_workdir(self, self.remote_tmp)

    def identity(self) -> DeviceIdentity:
        """Ask the device who it is: uname -a, CPU model, cores, Android's model and release."""
        return probe_identity(self)


def _open(serial: str, reach: Reach) -> AdbClient:
    check_address(serial, "an adb serial (`adb devices` lists them)")
    return AdbClient(serial, remote_tmp=reach.remote_tmp or ANDROID_TMP)


register_transport(
    Transport(
        "adb",
        prefix="adb:",
        form="adb:SERIAL",
        summary="an Android device over ADB, SERIAL as `adb devices` lists it (`adb push` / "
        "`adb shell` / `adb pull` with the adb on PATH: Debian's `adb` package)",
        open=_open,
        remote_tmp=ANDROID_TMP,
    )
)
