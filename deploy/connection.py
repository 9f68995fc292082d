"""The seam between the runners and the ways to reach a device: the `Connection` protocol, what
every transport shares, and the transports' registry.

A runner sees a device only as a `Connection` (`deploy.runners.registry`): commands run there,
files copied either way, a temporary directory removed whatever happens, and who the device is.
A transport (`ssh.py`: OpenSSH; `adb.py`: the Android Debug Bridge) implements it and registers
itself with the address form it reads (`register_transport`); `deploy.transports` imports every
transport and turns a `--device` address into a connection (`open_device`). What a transport
needs to write is only how to reach the device: the shell script a command becomes, the
temporary directory and the identity probe are here, the same for all.

Example:
    >>> shell_script(["echo", "hi there"], cwd="/tmp/w", merge_stderr=True)
    "cd /tmp/w && { echo 'hi there' ; } 2>&1"
    >>> parse_identity("@machine\\naarch64\\n@cores\\n4\\n@android\\nPixel 7\\n14").os
    'Android 14'
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from bnnexport.deploy.errors import (
    BadDeviceError,
    DeviceError,
    DeviceTimeoutError,
    RemoteCommandError,
)

# exit codes of coreutils (and toybox) `timeout`: 124 when the limit hit, 137 when it had to
# SIGKILL
TIMEOUT_CODES = (124, 137)


@runtime_checkable
class Connection(Protocol):
    """A device reached by some transport: all a runner may ask of it."""

    destination: str  # how rows and messages name the device: `pi@raspberrypi`, `adb:SERIAL`

    def run(
        self,
        command: Sequence[str] | str,
        timeout: float = 60.0,
        check: bool = True,
        cwd: str | None = None,
        merge_stderr: bool = False,
        limit_remote: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run `command` (argv, or a shell string) on the device (see `shell_script`); raise
        `DeviceTimeoutError` past the limit and, with `check`, `RemoteCommandError`."""
        ...

    def put(self, local: str | Path, remote: str, timeout: float = 300.0) -> None:
        """Copy a local file to `remote`, a path on the device."""
        ...

    def get(self, remote: str, local: str | Path, timeout: float = 300.0) -> None:
        """Copy `remote`, a path on the device, to a local file."""
        ...

    def workdir(self) -> contextlib.AbstractContextManager[str]:
        """A fresh directory on the device, removed afterwards (`temporary_workdir`)."""
        ...

    def identity(self) -> DeviceIdentity:
        """Who the device is (`probe_identity`)."""
        ...


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


def last_line(text: str) -> str:
    """The last line of `text` that is not blank, stripped ("" for none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_here(
    argv: list[str], timeout: float, what: str, where: str, install: str
) -> subprocess.CompletedProcess:
    """Run the tool of this machine that talks to the device (`ssh`, `adb`), output captured;
    past `timeout` a DeviceTimeoutError, a missing tool a DeviceError saying to `install` it."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise DeviceTimeoutError(
            f"{what} on {where} did not finish within {timeout:g} s"
        ) from error
    except FileNotFoundError as error:
        raise DeviceError(f"{argv[0]} not found on this machine; {install}") from error


def shell_script(
    command: Sequence[str] | str,
    cwd: str | None = None,
    merge_stderr: bool = False,
    limit_remote: float | None = None,
    remote_path: Sequence[str] = (),
) -> str:
    """The one shell string a transport hands the device's shell for `command`: stderr merged
    into stdout, stopped by the device itself after `limit_remote` seconds (`timeout`, so that
    nothing keeps running there when the connection drops), run in `cwd`, with `remote_path`
    in front of the device's PATH."""
    script = command if isinstance(command, str) else shlex.join(command)
    if merge_stderr:
        script = f"{{ {script} ; }} 2>&1"
    if limit_remote is not None:
        script = f"exec timeout -k 5 {int(limit_remote)} sh -c {shlex.quote(script)}"
    if cwd:
        script = f"cd {shlex.quote(cwd)} && {script}"
    if remote_path:
        path = ":".join(shlex.quote(p) for p in remote_path)
        script = f"PATH={path}:$PATH; export PATH; {script}"
    return script


def command_name(command: Sequence[str] | str) -> str:
    """The program a command runs, as messages name it: `lce_benchmark_model`."""
    return Path((command.split() if isinstance(command, str) else list(command))[0]).name


def local_timeout(timeout: float, limit_remote: bool) -> float:
    """How long this machine waits for a command: a margin over the device-side limit, so that
    limit fires first and says so."""
    return timeout + 30 if limit_remote else timeout


def checked(
    done: subprocess.CompletedProcess,
    command: Sequence[str] | str,
    where: str,
    timeout: float,
    limit_remote: bool,
    check: bool,
) -> subprocess.CompletedProcess:
    """`done`, the device's answer to `command` on `where`, once it is known not to have run
    past its device-side limit (DeviceTimeoutError) nor, with `check`, failed
    (RemoteCommandError with its last line)."""
    name = command_name(command)
    if limit_remote and done.returncode in TIMEOUT_CODES:
        raise DeviceTimeoutError(f"`{name}` on {where} ran past {timeout:g} s and was stopped")
    if check and done.returncode != 0:
        line = last_line(done.stderr) or last_line(done.stdout) or "no message"
        raise RemoteCommandError(f"`{name}` failed on {where} (exit {done.returncode}): {line}")
    return done


@contextlib.contextmanager
def temporary_workdir(connection: Connection, remote_tmp: str) -> Iterator[str]:
    """Make a fresh directory under `remote_tmp` on the device (mktemp -d), yield its path,
    always remove it; a failure to remove it never hides the error that brought us here."""
    template = f"{remote_tmp.rstrip('/')}/bnnexport.XXXXXXXX"
    work = connection.run(["mktemp", "-d", template]).stdout.strip()
    where = connection.destination
    if not work.startswith(remote_tmp.rstrip("/") + "/bnnexport."):
        raise DeviceError(f"mktemp on {where} returned an unexpected path: {work!r}")
    failed = False
    try:
        yield work
    except BaseException:
        failed = True
        raise
    finally:
        try:
            connection.run(["rm", "-rf", "--", work], timeout=120)
        except DeviceError as error:
            if not failed:
                raise DeviceError(f"could not remove {work} on {where}: {error}") from error
            print(f"warning: could not remove {work} on {where}", file=sys.stderr)


IDENTITY_SCRIPT = (
    "echo @uname; uname -a; echo @machine; uname -m; echo @cores; nproc; "
    "echo @lscpu; lscpu 2>/dev/null; echo @cpuinfo; cat /proc/cpuinfo 2>/dev/null; "
    "echo @os; cat /etc/os-release 2>/dev/null; "
    "echo @board; tr -d '\\000' < /proc/device-tree/model 2>/dev/null; echo; "
    # Android has no os-release: its model and release come from its properties
    "echo @android; getprop ro.product.model 2>/dev/null; getprop ro.build.version.release "
    "2>/dev/null; true"
)


def probe_identity(connection: Connection) -> DeviceIdentity:
    """Ask the device who it is: uname -a, CPU model, cores, OS name, board (if any)."""
    return parse_identity(connection.run(IDENTITY_SCRIPT, timeout=60).stdout)


def _sections(text: str) -> dict[str, list[str]]:
    """The lines after each `@name` line, by name, blank ones dropped."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@"):
            current = line[1:].strip()
            sections[current] = []
        elif current and line.strip():
            sections[current].append(line.strip())
    return sections


def _labelled(lines: list[str], *names: str) -> str:
    """The value of the first `NAME: value` line whose name is one of `names`, else ""."""
    for line in lines:
        label, _, value = line.partition(":")
        if label.strip().lower() in names and value.strip():
            return value.strip()
    return ""


def _os_name(sections: dict[str, list[str]]) -> str:
    """os-release's PRETTY_NAME, else `Android RELEASE` from getprop, else "unknown"."""
    for line in sections.get("os", []):
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    android = sections.get("android", [])
    return f"Android {android[1]}" if len(android) == 2 else "unknown"


def parse_identity(text: str) -> DeviceIdentity:
    """The identity in what `IDENTITY_SCRIPT` printed (sections after `@name` lines)."""
    sections = _sections(text)
    first = lambda key: (sections.get(key) or [""])[0]  # noqa: E731
    cores = first("cores")
    return DeviceIdentity(
        uname=first("uname"),
        machine=first("machine"),
        # lscpu names ARM cores (Cortex-A72); x86 /proc/cpuinfo has "model name"
        cpu_model=_labelled(sections.get("lscpu", []), "model name")
        or _labelled(sections.get("cpuinfo", []), "model name", "hardware")
        or "unknown",
        cores=int(cores) if cores.isdigit() else 0,
        os=_os_name(sections),
        board=first("board") or first("android") or None,
        emulated=emulation(first("machine"), sections.get("cpuinfo", [])),
    )


@dataclasses.dataclass(frozen=True)
class Reach:
    """How to reach a device besides its address: what `bench --device` gives every transport.
    A transport takes the fields its `takes` names (and `remote_tmp`); another one set is a
    one-line error, never silently ignored."""

    remote_tmp: str | None = None  # None: the transport's own (`Transport.remote_tmp`)
    port: int | None = None
    identity_file: str | None = None
    options: tuple[str, ...] = ()

    def given(self) -> set[str]:
        """The fields set to other than their defaults (`remote_tmp` aside)."""
        return {f.name for f in dataclasses.fields(self)
                if f.name != "remote_tmp" and getattr(self, f.name) != f.default}  # fmt: skip


# how `bench`'s options name each field of `Reach`, for the error that refuses one
REACH_FLAGS = {"port": "--port", "identity_file": "--ssh-key", "options": "--ssh-option"}


@dataclasses.dataclass(frozen=True)
class Transport:
    """A way to reach a device: the address form it reads and how it opens a connection."""

    name: str  # "ssh", "adb"
    prefix: str  # what its addresses start with ("adb:"); "" for the default form
    form: str  # the address as --help spells it: "adb:SERIAL"
    summary: str  # one clause for --help
    open: Callable[[str, Reach], Connection]  # (address without the prefix, reach)
    remote_tmp: str = "/tmp"  # where temporary directories go on its devices by default
    takes: frozenset[str] = frozenset()  # the `Reach` fields it uses besides remote_tmp


_TRANSPORTS: dict[str, Transport] = {}


def register_transport(transport: Transport) -> Transport:
    """Add `transport` to the forms `--device` reads (a module registers its own on import)."""
    _TRANSPORTS[transport.name] = transport
    return transport


def transports() -> list[Transport]:
    """The registered transports, the default form (no prefix) first, then by name."""
    return sorted(_TRANSPORTS.values(), key=lambda t: (t.prefix != "", t.name))


def check_address(address: str, what: str) -> str:
    """`address` (a host, a serial), unless it is empty, holds blanks or starts with `-` (which
    the transport's own tool would take for an option): then BadDeviceError."""
    if not address or address.startswith("-") or any(c.isspace() for c in address):
        raise BadDeviceError(f"{address!r} is not {what}; give {forms()}")
    return address


def forms() -> str:
    """The address forms `--device` reads, for messages: `USER@HOST or adb:SERIAL`."""
    return " or ".join(t.form for t in transports())
