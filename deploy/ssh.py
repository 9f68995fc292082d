"""A small client over the system's OpenSSH `ssh` and `scp`.

Using the system client means ~/.ssh/config, keys, the agent and known_hosts behave as the user
expects. Host-key checking stays as configured (on by default); `BatchMode=yes` makes every
failure an error instead of a prompt. Every error becomes one `deploy.errors` exception.

Example:
    >>> client = SshClient("pi@raspberrypi.local", port=22, identity_file="~/.ssh/id_ed25519")
    >>> client.ssh_args()[:5]
    ['ssh', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=10']
    >>> with client.workdir() as work:                  # doctest: +SKIP
    ...     client.put("model.tflite", f"{work}/model.tflite")
    ...     print(client.run(["ls", work]).stdout)
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from deploy.errors import (
    DeviceAuthError,
    DeviceError,
    DeviceTimeoutError,
    DeviceUnreachableError,
    RemoteCommandError,
)

_UNREACHABLE = (
    "connection refused",
    "no route to host",
    "could not resolve hostname",
    "connection timed out",
    "network is unreachable",
    "operation timed out",
    "connection closed by",
    "connection reset",
    "name or service not known",
)
_AUTH = (
    "permission denied",
    "host key verification failed",
    "too many authentication failures",
    "remote host identification has changed",
    "no matching host key",
)
# exit codes of coreutils `timeout`: 124 when the limit hit, 137 when it had to SIGKILL
_TIMEOUT_CODES = (124, 137)


@dataclasses.dataclass
class DeviceIdentity:
    """Who the device is: enough to tell one benchmark's machine from another's."""

    uname: str
    machine: str
    cpu_model: str
    cores: int
    os: str
    board: str | None = None
    # why its CPU is thought emulated (uname -m and /proc/cpuinfo name different architectures:
    # qemu-user), None where nothing says so; its timings are then not the named CPU's
    emulated: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the identity as a JSON-ready dict."""
        return dataclasses.asdict(self)


# /proc/cpuinfo keys only one architecture family's kernel writes
_CPUINFO_FAMILY = {"vendor_id": "x86", "cpu family": "x86", "cpu implementer": "arm",
                   "cpu architecture": "arm"}  # fmt: skip


def _uname_family(machine: str) -> str | None:
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    return "arm" if machine.startswith(("aarch64", "arm")) else None


def emulation(machine: str, cpuinfo: list[str]) -> str | None:
    """Why a device whose `uname -m` is `machine` runs emulated, or None: under user-mode
    emulation (qemu-user) the kernel, and so /proc/cpuinfo, is the host's (a full-system
    emulator shows the emulated CPU and is not seen).

    Example:
        >>> amd = ["vendor_id\t: AuthenticAMD", "model name\t: AMD EPYC"]
        >>> print(emulation("aarch64", amd))  # doctest: +ELLIPSIS
        uname -m says aarch64 but /proc/cpuinfo describes an x86 CPU (AMD EPYC): user-mode...
        >>> emulation("aarch64", ["CPU implementer\t: 0x41", "CPU part\t: 0xd08"]) is None
        True
    """
    keys = {line.partition(":")[0].strip().lower(): line.partition(":")[2].strip()
            for line in cpuinfo if ":" in line}  # fmt: skip
    described = {family for key, family in _CPUINFO_FAMILY.items() if key in keys}
    running = _uname_family(machine)
    if running is None or len(described) != 1 or running in described:
        return None
    model = keys.get("model name")
    return (
        f"uname -m says {machine} but /proc/cpuinfo describes an {described.pop()} CPU"
        f"{f' ({model})' if model else ''}: user-mode emulation (qemu-user)"
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class SshClient:
    """Run commands on and copy files to one SSH destination (`user@host` or a config alias).

    `options` are extra `-o KEY=VALUE` settings (e.g. `UserKnownHostsFile=...`); `remote_tmp` is
    the directory where working directories are made; `remote_path` directories are put in front
    of the device's PATH for every command.
    """

    def __init__(
        self,
        destination: str,
        port: int | None = None,
        identity_file: str | Path | None = None,
        connect_timeout: float = 10,
        options: Sequence[str] = (),
        remote_tmp: str = "/tmp",
        remote_path: Sequence[str] = (),
        ssh: str = "ssh",
        scp: str = "scp",
    ) -> None:
        self.destination = destination
        self.port = port
        self.identity_file = str(Path(identity_file).expanduser()) if identity_file else None
        self.connect_timeout = connect_timeout
        self.options = list(options)
        self.remote_tmp = remote_tmp
        self.remote_path = list(remote_path)
        self.ssh = ssh
        self.scp = scp

    def _common(self) -> list[str]:
        args = [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={int(self.connect_timeout)}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
        ]
        if self.identity_file:
            # only this key: an agent offering many keys first can exhaust MaxAuthTries
            args += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        for option in self.options:
            args += ["-o", option]
        return args

    def ssh_args(self) -> list[str]:
        """Return the `ssh` argv up to (not including) the remote command."""
        port = ["-p", str(self.port)] if self.port else []
        return [self.ssh, *self._common(), *port, "-T", self.destination, "--"]

    def _scp_args(self) -> list[str]:
        port = ["-P", str(self.port)] if self.port else []
        return [self.scp, "-q", *self._common(), *port]

    def _classify(self, stderr: str, what: str) -> DeviceError:
        text = stderr.lower()
        line = _last_line(stderr) or "no message"
        if any(marker in text for marker in _AUTH):
            return DeviceAuthError(f"SSH refused {what} on {self.destination}: {line}")
        if any(marker in text for marker in _UNREACHABLE):
            return DeviceUnreachableError(f"cannot reach {self.destination}: {line}")
        return DeviceError(f"{what} on {self.destination} failed: {line}")

    def _exec(self, argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as error:
            raise DeviceTimeoutError(
                f"{what} on {self.destination} did not finish within {timeout:g} s"
            ) from error
        except FileNotFoundError as error:
            raise DeviceError(f"{argv[0]} not found on this machine; install OpenSSH") from error

    def run(
        self,
        command: Sequence[str] | str,
        timeout: float = 60.0,
        check: bool = True,
        cwd: str | None = None,
        merge_stderr: bool = False,
        limit_remote: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run `command` (argv, or a shell string) on the device; return its CompletedProcess.

        With `limit_remote`, the device itself stops the command after `timeout` seconds
        (coreutils `timeout`), so nothing keeps running there when the connection is dropped.
        Raises `DeviceUnreachableError` / `DeviceAuthError` for SSH failures, `DeviceTimeoutError`
        past the limit and, with `check`, `RemoteCommandError` when the command fails.
        """
        script = command if isinstance(command, str) else shlex.join(command)
        if merge_stderr:
            script = f"{{ {script} ; }} 2>&1"
        if limit_remote:
            script = f"exec timeout -k 5 {int(timeout)} sh -c {shlex.quote(script)}"
        if cwd:
            script = f"cd {shlex.quote(cwd)} && {script}"
        if self.remote_path:
            path = ":".join(shlex.quote(p) for p in self.remote_path)
            script = f"PATH={path}:$PATH; export PATH; {script}"
        name = (command.split() if isinstance(command, str) else list(command))[0]
        # a margin over the device-side limit, so that limit fires first and says so
        local_timeout = timeout + 30 if limit_remote else timeout
        done = self._exec([*self.ssh_args(), script], local_timeout, f"`{Path(name).name}`")
        if done.returncode == 255:  # ssh's own failure, not the command's
            raise self._classify(done.stderr, "the connection")
        if limit_remote and done.returncode in _TIMEOUT_CODES:
            raise DeviceTimeoutError(
                f"`{Path(name).name}` on {self.destination} ran past {timeout:g} s and was stopped"
            )
        if check and done.returncode != 0:
            line = _last_line(done.stderr) or _last_line(done.stdout) or "no message"
            raise RemoteCommandError(
                f"`{Path(name).name}` failed on {self.destination} (exit {done.returncode}): {line}"
            )
        return done

    def _remote(self, path: str) -> str:
        return f"{self.destination}:{path}"

    def put(self, local: str | Path, remote: str, timeout: float = 300.0) -> None:
        """Copy a local file to `remote` (a path on the device)."""
        done = self._exec(
            [*self._scp_args(), "--", str(local), self._remote(remote)], timeout, "copying a file"
        )
        if done.returncode != 0:
            raise self._classify(done.stderr, f"copying {Path(local).name}")

    def get(self, remote: str, local: str | Path, timeout: float = 300.0) -> None:
        """Copy `remote` (a path on the device) to a local file."""
        done = self._exec(
            [*self._scp_args(), "--", self._remote(remote), str(local)], timeout, "fetching a file"
        )
        if done.returncode != 0:
            raise self._classify(done.stderr, f"fetching {Path(remote).name}")

    @contextlib.contextmanager
    def workdir(self) -> Iterator[str]:
        """Make a fresh directory on the device (mktemp -d), yield its path, always remove it."""
        template = f"{self.remote_tmp.rstrip('/')}/bnnexport.XXXXXXXX"
        work = self.run(["mktemp", "-d", template]).stdout.strip()
        if not work.startswith(self.remote_tmp.rstrip("/") + "/bnnexport."):
            raise DeviceError(f"mktemp on {self.destination} returned an unexpected path: {work!r}")
        failed = False
        try:
            yield work
        except BaseException:
            failed = True
            raise
        finally:
            try:
                self.run(["rm", "-rf", "--", work], timeout=120)
            except DeviceError as error:
                if not failed:  # never hide the error that brought us here
                    raise DeviceError(
                        f"could not remove {work} on {self.destination}: {error}"
                    ) from error
                print(f"warning: could not remove {work} on {self.destination}", file=sys.stderr)

    def identity(self) -> DeviceIdentity:
        """Ask the device who it is: uname -a, CPU model, cores, OS name, board (if any)."""
        script = (
            "echo @uname; uname -a; echo @machine; uname -m; echo @cores; nproc; "
            "echo @lscpu; lscpu 2>/dev/null; echo @cpuinfo; cat /proc/cpuinfo 2>/dev/null; "
            "echo @os; cat /etc/os-release 2>/dev/null; "
            "echo @board; tr -d '\\000' < /proc/device-tree/model 2>/dev/null; echo"
        )
        sections: dict[str, list[str]] = {}
        current = None
        for line in self.run(script, timeout=60).stdout.splitlines():
            if line.startswith("@"):
                current = line[1:].strip()
                sections[current] = []
            elif current:
                sections[current].append(line)
        first = lambda key: next((x.strip() for x in sections.get(key, []) if x.strip()), "")  # noqa: E731

        def field(key: str, *names: str) -> str:
            for line in sections.get(key, []):
                label, _, value = line.partition(":")
                if label.strip().lower() in names and value.strip():
                    return value.strip()
            return ""

        os_name = ""
        for line in sections.get("os", []):
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
        cores = first("cores")
        return DeviceIdentity(
            uname=first("uname"),
            machine=first("machine"),
            # lscpu names ARM cores (Cortex-A72); x86 /proc/cpuinfo has "model name"
            cpu_model=field("lscpu", "model name")
            or field("cpuinfo", "model name", "hardware")
            or "unknown",
            cores=int(cores) if cores.isdigit() else 0,
            os=os_name or "unknown",
            board=first("board") or None,
            emulated=emulation(first("machine"), sections.get("cpuinfo", [])),
        )
