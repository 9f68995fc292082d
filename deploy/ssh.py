"""A small client over the system's OpenSSH `ssh` and `scp`: the `ssh` transport.

Using the system client means ~/.ssh/config, keys, the agent and known_hosts behave as the user
expects. Host-key checking stays as configured (on by default); `BatchMode=yes` makes every
failure an error instead of a prompt. Every error becomes one `deploy.errors` exception.
`SshClient` is a `deploy.connection.Connection`; its transport reads `USER@HOST` (or an alias),
the `--device` form without a prefix.

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
        line = last_line(stderr) or "no message"
        if any(marker in text for marker in _AUTH):
            return DeviceAuthError(f"SSH refused {what} on {self.destination}: {line}")
        if any(marker in text for marker in _UNREACHABLE):
            return DeviceUnreachableError(f"cannot reach {self.destination}: {line}")
        return DeviceError(f"{what} on {self.destination} failed: {line}")

    def _exec(self, argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess:
        return run_here(argv, timeout, what, self.destination, "install OpenSSH")

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
        limit = timeout if limit_remote else None
        script = shell_script(command, cwd, merge_stderr, limit, self.remote_path)
        argv = [*self.ssh_args(), script]
        done = self._exec(argv, local_timeout(timeout, limit_remote), f"`{command_name(command)}`")
        if done.returncode == 255:  # ssh's own failure, not the command's
            raise self._classify(done.stderr, "the connection")
        return checked(done, command, self.destination, timeout, limit_remote, check)

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

    def workdir(self) -> contextlib.AbstractContextManager[str]:
        """Make a fresh directory on the device (mktemp -d), yield its path, always remove it."""
        return temporary_workdir(self, self.remote_tmp)

    def identity(self) -> DeviceIdentity:
        """Ask the device who it is: uname -a, CPU model, cores, OS name, board (if any)."""
        return probe_identity(self)


def _open(address: str, reach: Reach) -> SshClient:
    check_address(address, "an SSH destination")
    return SshClient(
        address,
        port=reach.port,
        identity_file=reach.identity_file,
        options=reach.options,
        remote_tmp=reach.remote_tmp or "/tmp",
    )


register_transport(
    Transport(
        "ssh",
        prefix="",
        form="USER@HOST",
        summary="a device over SSH, or an ~/.ssh/config alias (the system's OpenSSH client, so "
        "aliases, keys and known_hosts apply; with --port, --ssh-key, --ssh-option)",
        open=_open,
        takes=frozenset({"port", "identity_file", "options"}),
    )
)
