"""An emulated aarch64 device for the device tests: Debian bookworm arm64 under qemu, with sshd.

tests/conftest.py registers it as a plugin; the `arm_device` fixture is an
`sshd_fixture.Sshd`-like object whose `client()` talks to a genuine aarch64 user space (`uname -m`
prints aarch64; python3, numpy, coreutils and sshd are aarch64 binaries run by qemu-aarch64).

Built from Debian packages only (docs/LCE_NOTES.md "aarch64 device"): `qemu-user-static
binfmt-support arch-test mmdebstrap` (`make device-tools` installs them). The root file system is
made once with `mmdebstrap --variant=extract --arch=arm64` and cached in `~/.cache/bnnexport-test/`
(or `$BNNEXPORT_TEST_CACHE`); it is rebuilt when missing or made by an older recipe. An extract-only
tree runs no maintainer scripts, so the fix-ups are done here: passwd/group, /bin/sh, the BLAS and
LAPACK `.so.3` links numpy needs, host keys, a /run/sshd directory.

Each test session runs sshd in private mount and PID namespaces (`unshare`): proc and sysfs are
mounted into the tree there and the session's own directory (sshd_config, authorized key, the
device's temporary directory) is bind-mounted at `/bnnexport-session`, so the cached tree stays
clean and everything vanishes with the namespace. sshd listens on 127.0.0.1 only and takes only
the session's key. Where something cannot be had (no root, no packages, binfmt not registrable),
the fixture skips with the reason.

By hand (e.g. for `bnnexport bench --device`), it prints the bench options that reach it, and
writes the stand-in `lce_benchmark_model` (with its reference interpreter, support/stand_in.py)
to DIR/lce_benchmark_model for `--benchmark-binary`:

    PYTHONPATH=.:tests python tests/support/aarch64_device.py /tmp/arm-device

Example (in a test):
    >>> def test_machine(arm_device):                                   # doctest: +SKIP
    ...     assert arm_device.client().run(["uname", "-m"]).stdout.strip() == "aarch64"
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if __package__ in (None, ""):  # run as a script: tests/ holds the support package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.sshd_fixture import LoopbackSsh, free_port, keygen  # noqa: E402
from support.stand_in import write_stand_in  # noqa: E402

# bump when the recipe changes: a cached tree made by another recipe is rebuilt
RECIPE = "bookworm-arm64-v1"
SUITE = "bookworm"
PACKAGES = (
    "dash",
    "bash",
    "base-passwd",
    "python3",
    "python3-numpy",
    "openssh-server",
    "libpython3.11",
    "libstdc++6",
    "coreutils",
    "procps",
)
TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "update-binfmts": "binfmt-support",
    "arch-test": "arch-test",
    "qemu-aarch64-static": "qemu-user-static",
    "unshare": "util-linux",
    "chroot": "coreutils",
}
MARKER = ".bnnexport-device"
SESSION_MOUNT = "bnnexport-session"  # where the session's directory appears inside the device
BINFMT = Path("/proc/sys/fs/binfmt_misc")


class DeviceUnavailable(Exception):
    """The emulated device cannot be had here; the message says why (the tests skip with it)."""


def cache_dir() -> Path:
    """Where built trees are kept between test sessions."""
    root = os.environ.get("BNNEXPORT_TEST_CACHE") or Path.home() / ".cache" / "bnnexport-test"
    return Path(root)


def _run(argv: list[str], what: str, timeout: float = 600) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DeviceUnavailable(f"{what} failed: {error}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no message"]
        raise DeviceUnavailable(f"{what} failed (exit {done.returncode}): {tail[0]}")
    return done.stdout


def check_host() -> None:
    """Raise DeviceUnavailable unless this machine can run aarch64 binaries through binfmt."""
    if os.geteuid() != 0:
        raise DeviceUnavailable("building and chrooting into the aarch64 tree needs root")
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise DeviceUnavailable(
            f"Debian packages missing: {' '.join(missing)} (`make device-tools` installs them)"
        )
    if not (BINFMT / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], "mounting binfmt_misc")
    if not (BINFMT / "qemu-aarch64").exists():
        _run(["update-binfmts", "--enable", "qemu-aarch64"], "registering qemu-aarch64")
    if not (BINFMT / "qemu-aarch64").read_text().startswith("enabled"):
        _run(["update-binfmts", "--enable", "qemu-aarch64"], "enabling qemu-aarch64")
    if "arm64: ok" not in _run(["arch-test", "arm64"], "arch-test arm64"):
        raise DeviceUnavailable("arch-test: this kernel cannot run arm64 binaries via binfmt")


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
    """Make the aarch64 tree at `target` (atomically: built beside it, then renamed).

    Returns the seconds it took.
    """
    start = time.monotonic()
    scratch = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _run(
            [
                "mmdebstrap",
                "--quiet",
                "--mode=root",
                "--variant=extract",
                "--arch=arm64",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(scratch),
            ],
            f"mmdebstrap {SUITE} arm64",
            timeout=900,
        )
        _fix_up(scratch)
        (scratch / MARKER).write_text(RECIPE + "\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.monotonic() - start


def ensure_rootfs() -> tuple[Path, float | None]:
    """The cached tree, built first when missing (None seconds when it was already there)."""
    check_host()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"rootfs-{RECIPE}"
    with (cache / "build.lock").open("w") as lock:  # several sessions may start at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = target / MARKER
        if marker.is_file() and marker.read_text().strip() == RECIPE:
            return target, None
        return target, build(target)


@dataclasses.dataclass
class ArmDevice(LoopbackSsh):
    """What a test needs to talk to the emulated device (mirrors `sshd_fixture.Sshd`)."""

    CONNECT_TIMEOUT = 30  # everything on the device runs under qemu: give connections time

    port: int
    key: Path
    other_key: Path
    known_hosts: Path
    remote_tmp: str  # the device's temporary directory, as the device sees it
    host_tmp: Path  # the same directory, as this machine sees it
    rootfs: Path
    build_seconds: float | None
    user: str = "root"


@contextlib.contextmanager
def running_device(
    session: Path, rootfs: Path, build_seconds: float | None = None
) -> Iterator[ArmDevice]:
    """Run sshd in `rootfs` (private namespaces) with its keys and config in `session`.

    Raises DeviceUnavailable when it does not start; stops it (and its namespaces) on exit.
    """
    session.mkdir(parents=True, exist_ok=True)
    session.chmod(0o755)
    for name in ("user", "other"):
        if not (session / name).is_file():
            keygen(session / name)
    (session / "authorized_keys").write_text((session / "user.pub").read_text())
    (session / "tmp").mkdir(exist_ok=True)
    inside = f"/{SESSION_MOUNT}"
    port = free_port()
    (session / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                "HostKey /etc/ssh/ssh_host_ed25519_key",
                f"PidFile {inside}/sshd.pid",
                f"AuthorizedKeysFile {inside}/authorized_keys",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "AllowUsers root",
                "MaxStartups 100",
                "LogLevel ERROR",
                "Subsystem sftp /usr/lib/openssh/sftp-server",
                "",
            ]
        )
    )
    host_pub = (rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    known = session / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    script = (
        f"mount -t proc proc {rootfs}/proc && mount -t sysfs sysfs {rootfs}/sys && "
        f"mount --bind {session} {rootfs}/{SESSION_MOUNT} && "
        f"exec chroot {rootfs} /usr/sbin/sshd -D -e -f {inside}/sshd_config"
    )
    log = (session / "sshd.log").open("w")
    process = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ],
        stdout=log,
        stderr=log,
    )
    device = ArmDevice(
        port=port,
        key=session / "user",
        other_key=session / "other",
        known_hosts=known,
        remote_tmp=f"{inside}/tmp",
        host_tmp=session / "tmp",
        rootfs=rootfs,
        build_seconds=build_seconds,
    )
    try:
        deadline = time.monotonic() + 60  # sshd starts under emulation
        while True:
            if process.poll() is not None:
                raise DeviceUnavailable(
                    f"sshd in the aarch64 tree did not start: "
                    f"{(session / 'sshd.log').read_text()[-300:]}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise DeviceUnavailable(
                        "sshd in the aarch64 tree did not listen within 60 s"
                    ) from None
                time.sleep(0.2)
        yield device
    finally:
        # unshare --fork ignores SIGTERM and SIGINT while it waits for its child, so terminate()
        # did nothing for 20 s; SIGKILL ends it, and --kill-child then ends sshd's namespace
        process.kill()
        process.wait(timeout=20)
        log.close()


@pytest.fixture(scope="session")
def arm_device(tmp_path_factory):
    """Start sshd inside the emulated aarch64 tree on 127.0.0.1:<free port>; stop it after."""
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH client not installed (`make test` installs it)")
    try:
        rootfs, seconds = ensure_rootfs()
    except DeviceUnavailable as error:
        pytest.skip(f"no emulated aarch64 device: {error}")
    if seconds is not None:
        print(f"\nbuilt the emulated aarch64 device in {seconds:.0f} s: {rootfs}")
    with contextlib.ExitStack() as stack:
        try:
            device = stack.enter_context(
                running_device(tmp_path_factory.mktemp("arm-device"), rootfs, seconds)
            )
        except DeviceUnavailable as error:
            pytest.skip(f"no emulated aarch64 device: {error}")
        yield device


def main(argv: list[str] | None = None) -> int:
    """`python tests/support/aarch64_device.py DIR`: build if needed, serve until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve the emulated aarch64 device over SSH.")
    parser.add_argument("session", type=Path, help="directory for its keys, config and tmp")
    args = parser.parse_args(argv)
    try:
        rootfs, seconds = ensure_rootfs()
        if seconds is not None:
            print(f"built {rootfs} in {seconds:.0f} s", flush=True)
        with running_device(args.session.resolve(), rootfs, seconds) as device:
            write_stand_in(args.session.resolve() / "lce_benchmark_model", None)
            options = " ".join(f"--ssh-option {o}" for o in device.options)
            print(
                f"--device {device.destination} --port {device.port} --ssh-key {device.key} "
                f"--remote-tmp {device.remote_tmp} {options}",
                flush=True,
            )
            print(f"serving; stop it with Ctrl-C or `kill {os.getpid()}`", flush=True)
            while True:  # not signal.pause(): a signal landing just before the call would
                time.sleep(0.2)  # be handled late and pause() would then wait for another
    except DeviceUnavailable as error:
        print(f"no emulated aarch64 device: {error}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Stopped):  # running_device's exit has stopped sshd and qemu
        print("stopped", flush=True)
    return 0


class _Stopped(Exception):
    """SIGTERM, turned into an exception so every `finally` on the way out runs."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise _Stopped


if __name__ == "__main__":
    # Handlers, not a blocked signal mask: a mask would be inherited by unshare, sshd and qemu,
    # and SIGTERM would then not stop them.
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A parent that ignores SIGINT (a test runner's worker may) passes that on, and Python then
    # installs no KeyboardInterrupt handler of its own: Ctrl-C would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
