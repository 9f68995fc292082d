"""An emulated aarch64 device on this machine: Debian arm64 under qemu-user, sshd on 127.0.0.1.

For `bench --device` without a Raspberry Pi (`bnnexport device emulate`) and for the device
tests: a genuine aarch64 user space (`uname -m` prints aarch64; python3, numpy, coreutils and
sshd are aarch64 binaries run by qemu-aarch64) reached over the real SSH client. Timings taken
there are qemu's, not an ARM CPU's.

Built from Debian packages only (docs/LCE_NOTES.md "aarch64 device"): `qemu-user-static
binfmt-support arch-test mmdebstrap` on this machine (`make device-tools` installs them). The
root file system is made once with `mmdebstrap --variant=extract --arch=arm64` (from Debian's
mirror) and cached under the cache folder given; it is rebuilt when missing or made by an older
recipe. An extract-only tree runs no maintainer scripts, so the fix-ups are done here:
passwd/group, /bin/sh, the BLAS and LAPACK `.so.3` links numpy needs, host keys, /run/sshd.

sshd runs in private mount and PID namespaces (`unshare`): proc and sysfs are mounted into the
tree there and a session folder of this machine (sshd_config, the client's key and known_hosts,
the device's temporary directory) is bind-mounted at `/bnnexport-session`, so the cached tree
stays clean and everything vanishes with the namespace. sshd listens on 127.0.0.1 only and takes
only the session's key. Needs root (namespaces, chroot, binfmt); where something cannot be had,
`EmulatorUnavailableError` says why in one line. Standard library only.

Example:
    >>> EmulatedDevice.bench_args_for(40123, Path("/tmp/dev"))[:4]
    ['--device', 'root@127.0.0.1', '--port', '40123']
    >>> rootfs, _ = ensure_rootfs(default_cache())                       # doctest: +SKIP
    >>> with running_device(Path("/tmp/dev"), rootfs) as device:          # doctest: +SKIP
    ...     print(" ".join(device.bench_args()))
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bnnexport.deploy.errors import EmulatorStateError, EmulatorUnavailableError

# bump when the recipe changes: a cached tree made by another recipe is rebuilt
RECIPE = "bookworm-arm64-v1"
SUITE = "bookworm"
PACKAGES = ("dash", "bash", "base-passwd", "python3", "python3-numpy", "openssh-server",
            "libpython3.11", "libstdc++6", "coreutils", "procps")  # fmt: skip
TOOLS = {  # command -> the Debian package that has it
    "mmdebstrap": "mmdebstrap",
    "update-binfmts": "binfmt-support",
    "arch-test": "arch-test",
    "qemu-aarch64-static": "qemu-user-static",
    "unshare": "util-linux",
    "chroot": "coreutils",
    "ssh-keygen": "openssh-client",
}
MARKER = ".bnnexport-device"
SESSION_MOUNT = "bnnexport-session"  # where the session's folder appears inside the device
BINFMT = Path("/proc/sys/fs/binfmt_misc")
USER = "root"
START_SECONDS = 60  # sshd starts under emulation


def default_cache() -> Path:
    """Where `bnnexport device emulate` keeps the built tree: $BNNEXPORT_CACHE, else
    ~/.cache/bnnexport."""
    return Path(os.environ.get("BNNEXPORT_CACHE") or Path.home() / ".cache" / "bnnexport")


def _run(argv: list[str], what: str, timeout: float = 600) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EmulatorUnavailableError(f"{what} failed: {error}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no message"]
        raise EmulatorUnavailableError(f"{what} failed (exit {done.returncode}): {tail[0]}")
    return done.stdout


def check_host() -> None:
    """Raise EmulatorUnavailableError unless this machine can run aarch64 binaries through
    binfmt (registering qemu-aarch64 when it is not)."""
    if os.geteuid() != 0:
        raise EmulatorUnavailableError(
            "the emulated aarch64 device needs root (mount and PID namespaces, chroot, binfmt)"
        )
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise EmulatorUnavailableError(
            f"Debian packages missing: {' '.join(missing)} (`make device-tools` installs them)"
        )
    if not (BINFMT / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], "mounting binfmt_misc")
    entry = BINFMT / "qemu-aarch64"
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        _run(["update-binfmts", "--enable", "qemu-aarch64"], "registering qemu-aarch64")
    if "arm64: ok" not in _run(["arch-test", "arm64"], "arch-test arm64"):
        raise EmulatorUnavailableError("arch-test: this kernel cannot run arm64 binaries")


def _fix_up(root: Path) -> None:
    """What maintainer scripts would have done: users, /bin/sh, library links, host keys."""
    master = root / "usr/share/base-passwd"
    passwd = (master / "passwd.master").read_text()
    (root / "etc/passwd").write_text(passwd + "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n")
    (root / "etc/group").write_text((master / "group.master").read_text())
    if not (root / "bin/sh").exists():
        (root / "bin/sh").symlink_to("dash")
    lib = root / "usr/lib/aarch64-linux-gnu"
    for name in ("blas/libblas.so.3", "lapack/liblapack.so.3"):  # normally update-alternatives
        link = lib / Path(name).name
        if not link.exists():
            link.symlink_to(name)
    _run(["ssh-keygen", "-A", "-f", str(root)], "ssh-keygen -A")
    for folder in ("run/sshd", "root/.ssh", SESSION_MOUNT, "proc", "sys"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "run/sshd").chmod(0o755)


def build(target: Path) -> float:
    """Make the aarch64 tree at `target` (built beside it, then renamed); the seconds it took."""
    start = time.monotonic()
    scratch = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        argv = ["mmdebstrap", "--quiet", "--mode=root", "--variant=extract", "--arch=arm64",
                f"--include={','.join(PACKAGES)}", SUITE, str(scratch)]  # fmt: skip
        _run(argv, f"mmdebstrap {SUITE} arm64", timeout=900)
        _fix_up(scratch)
        (scratch / MARKER).write_text(RECIPE + "\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.monotonic() - start


def ensure_rootfs(
    cache: Path, progress: Callable[[str], None] | None = None
) -> tuple[Path, float | None]:
    """The tree cached in `cache`, built first when missing (seconds None when it was there);
    `progress` hears one line before a build."""
    check_host()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"rootfs-{RECIPE}"
    with (cache / "build.lock").open("w") as lock:  # several sessions may start at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = target / MARKER
        if marker.is_file() and marker.read_text().strip() == RECIPE:
            return target, None
        if progress is not None:
            progress(f"building the aarch64 root file system in {target} (mmdebstrap {SUITE} "
                     f"arm64 from Debian's mirror, about 240 MB, once)")  # fmt: skip
        return target, build(target)


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> None:
    """A fresh ed25519 key pair at `path` and `path`.pub, no passphrase."""
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bnnexport-device", "-f",
          str(path)], "ssh-keygen")  # fmt: skip


@dataclasses.dataclass
class EmulatedDevice:
    """A running emulated device: how to reach it, and where its session lives on this machine."""

    port: int
    key: Path  # the client's private key, the only one sshd takes
    known_hosts: Path  # the device's host key, so host-key checking stays on
    remote_tmp: str  # the device's temporary directory, as the device sees it
    host_tmp: Path  # the same directory, as this machine sees it
    rootfs: Path
    build_seconds: float | None = None
    user: str = USER

    @property
    def destination(self) -> str:
        return f"{self.user}@127.0.0.1"

    @property
    def ssh_options(self) -> list[str]:
        """The `ssh -o` options that reach it with host-key checking on."""
        return [f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes",
                "GlobalKnownHostsFile=/dev/null"]  # fmt: skip

    @staticmethod
    def bench_args_for(port: int, session: Path) -> list[str]:
        """The `bench --device` options reaching a device on `port` with `session`'s keys."""
        device = EmulatedDevice(port, session / "user", session / "known_hosts",
                                f"/{SESSION_MOUNT}/tmp", session / "tmp", Path("/"))  # fmt: skip
        return device.bench_args()

    def bench_args(self, benchmark_binary: str | Path | None = None) -> list[str]:
        """The `bench` options that run on this device with `lce_benchmark_model` (uploading
        `benchmark_binary`, an aarch64 build of it, when given)."""
        args = ["--device", self.destination, "--port", str(self.port), "--ssh-key",
                str(self.key), "--remote-tmp", self.remote_tmp]  # fmt: skip
        for option in self.ssh_options:
            args += ["--ssh-option", option]
        args += ["--runner", "lce_benchmark_model"]
        if benchmark_binary is not None:
            args += ["--benchmark-binary", str(benchmark_binary)]
        return args

    def client(self, **settings: Any) -> Any:
        """A `deploy.ssh.SshClient` for the device (everything runs under qemu: a 30 s connect
        timeout); `settings` override its keyword arguments."""
        from bnnexport.deploy.ssh import SshClient

        arguments: dict[str, Any] = dict(
            port=self.port, identity_file=self.key, options=self.ssh_options,
            remote_tmp=self.remote_tmp, connect_timeout=30,
        )  # fmt: skip
        arguments.update(settings)
        return SshClient(self.destination, **arguments)


def _sshd_config(port: int) -> str:
    inside = f"/{SESSION_MOUNT}"
    return "\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", "HostKey /etc/ssh/ssh_host_ed25519_key",
        f"PidFile {inside}/sshd.pid", f"AuthorizedKeysFile {inside}/authorized_keys",
        "StrictModes no", "UsePAM no", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password", f"AllowUsers {USER}", "MaxStartups 100",
        "LogLevel ERROR", "Subsystem sftp /usr/lib/openssh/sftp-server", "",
    ])  # fmt: skip


def _prepare_session(session: Path, rootfs: Path, port: int) -> EmulatedDevice:
    """The session folder: keys, sshd_config, known_hosts and the device's tmp."""
    session.mkdir(parents=True, exist_ok=True)
    session.chmod(0o755)
    if not (session / "user").is_file():
        keygen(session / "user")
    (session / "authorized_keys").write_text((session / "user.pub").read_text())
    (session / "tmp").mkdir(exist_ok=True)
    (session / "sshd_config").write_text(_sshd_config(port))
    host_pub = (rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    known = session / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    return EmulatedDevice(port, session / "user", known, f"/{SESSION_MOUNT}/tmp",
                          session / "tmp", rootfs)  # fmt: skip


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies, so a killed
    `bnnexport device emulate` cannot leave the namespace (and sshd, and qemu) behind."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _wait_listening(process: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while True:
        if process.poll() is not None:
            tail = log.read_text()[-300:].strip().replace("\n", " ")
            raise EmulatorUnavailableError(f"sshd in the aarch64 tree did not start: {tail}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise EmulatorUnavailableError(
                    f"sshd in the aarch64 tree did not listen within {START_SECONDS} s"
                ) from None
            time.sleep(0.2)


@contextlib.contextmanager
def running_device(
    session: Path, rootfs: Path, build_seconds: float | None = None
) -> Iterator[EmulatedDevice]:
    """Run sshd in `rootfs` (private namespaces) with its keys and config in `session`.

    Raises EmulatorUnavailableError when it does not start; stops it (and its namespaces, and
    with them every process started on the device) on exit.
    """
    device = _prepare_session(session, rootfs, free_port())
    device.build_seconds = build_seconds
    inside = f"/{SESSION_MOUNT}"
    script = (
        f"mount -t proc proc {rootfs}/proc && mount -t sysfs sysfs {rootfs}/sys && "
        f"mount --bind {session} {rootfs}/{SESSION_MOUNT} && "
        f"exec chroot {rootfs} /usr/sbin/sshd -D -e -f {inside}/sshd_config"
    )
    argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation",
            "private", "sh", "-c", script]  # fmt: skip
    with (session / "sshd.log").open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=_die_with_parent)
    try:
        _wait_listening(process, device.port, session / "sshd.log")
        yield device
    finally:
        # unshare --fork ignores SIGTERM and SIGINT while it waits for its child; SIGKILL ends
        # it, and --kill-child then ends sshd's PID namespace, every process in it included
        process.kill()
        process.wait(timeout=20)


# --- one device served until stopped, and the folder that says so ----------------------------

STATE = "device.json"  # in the session folder while a device serves from it


class Stopped(Exception):
    """SIGTERM, raised in the serving process so every `finally` on the way out runs."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise Stopped


def read_state(session: Path) -> dict[str, Any] | None:
    """What the device serving from `session` wrote when it started listening; None when none
    serves there (no file, or its process is gone)."""
    import json

    try:
        state = json.loads((session / STATE).read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def _state(device: EmulatedDevice, session: Path, binary: str | Path | None) -> dict[str, Any]:
    return {
        "pid": os.getpid(), "session": str(session), "destination": device.destination,
        "port": device.port, "ssh_key": str(device.key), "known_hosts": str(device.known_hosts),
        "remote_tmp": device.remote_tmp,
        "benchmark_binary": None if binary is None else str(binary),
        "bench_args": device.bench_args(binary), "rootfs": str(device.rootfs),
        "build_seconds": device.build_seconds,
    }  # fmt: skip


def serve(
    session: Path,
    cache: Path,
    benchmark_binary: str | Path | None = None,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build the tree if needed, start the device from `session` and serve until SIGINT or
    SIGTERM (`stop`); `on_ready` hears its state (what `read_state` then reads) once it listens.
    Stops everything it started before it returns the state it served with."""
    import json

    session = session.resolve()
    if read_state(session) is not None:
        raise EmulatorStateError(f"an emulated device already serves from {session}")
    rootfs, seconds = ensure_rootfs(cache, progress)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    # a parent that ignores SIGINT (a shell's `&`) passes that on, and Python then installs no
    # KeyboardInterrupt handler of its own: Ctrl-C would do nothing
    interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with running_device(session, rootfs, seconds) as device:
            state = _state(device, session, benchmark_binary)
            (session / STATE).write_text(json.dumps(state))
            try:
                if on_ready is not None:
                    on_ready(state)
                while True:  # not signal.pause(): a signal landing just before the call would
                    time.sleep(0.2)  # be handled late, and pause() then waits for another
            except (KeyboardInterrupt, Stopped):
                return state
            finally:
                (session / STATE).unlink(missing_ok=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, interrupt)


def stop(session: Path, timeout: float = 30.0) -> dict[str, Any]:
    """Stop the device serving from `session` (SIGTERM to its process) and wait until that
    process, and with it sshd's namespace, is gone and its port closed; its state."""
    state = read_state(session.resolve())
    if state is None:
        raise EmulatorStateError(f"no emulated device serves from {session.resolve()}")
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and _alive(pid):
        if time.monotonic() > deadline:
            raise EmulatorStateError(f"the emulated device (process {pid}) did not stop in "
                                     f"{timeout:.0f} s")  # fmt: skip
        time.sleep(0.1)
    return state


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def main(argv: list[str] | None = None) -> int:
    """`python -m bnnexport.deploy.emulator SESSION CACHE [BINARY]`: serve until SIGTERM, printing
    nothing but a failure's one line (exit 2). `bnnexport device start` runs it in the background:
    it starts in seconds, without the CLI's imports."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        serve(Path(args[0]), Path(args[1]), args[2] if len(args) > 2 else None)
    except (EmulatorUnavailableError, EmulatorStateError) as error:
        print(f"bnnexport: error: {error}", file=sys.stderr, flush=True)
        return 2
    except (KeyboardInterrupt, Stopped):
        pass  # stopped while starting: serve's `finally` blocks have stopped what had started
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
