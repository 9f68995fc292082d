"""A fake `adb` for the ADB transport's tests: an executable that reads adb's command line
(`-s SERIAL`, `shell`, `push`, `pull`, `devices`) and answers as adb does, on devices the test
names. Each serial maps to the argv that runs one shell string on that device: `["sh", "-c"]`
runs it on this machine (the cheap tests), `SshClient.ssh_args()` of the `arm_device` fixture
runs it in the emulated aarch64 device. `push` and `pull` stream the file through that same
shell (`cat > REMOTE`, `cat REMOTE`), so a file reaches the device only if it was pushed.

What it keeps of real adb (Debian's adb 29): the remote command's exit status comes back (the
shell protocol v2), `adb: device 'X' not found` with exit 1 for an unknown serial, `adb: error:`
lines for a failed copy. Each call's argv is appended to `log` (one JSON list a line) when
given.

Example (in a test):
    >>> adb = write_fake_adb(tmp_path / "bin", {"emulator-5554": ["sh", "-c"]})  # doctest: +SKIP
    >>> AdbClient("emulator-5554", adb=str(adb)).run(["uname", "-m"]).stdout     # doctest: +SKIP
    'x86_64\\n'
"""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPT = """
import json, os, shlex, subprocess, sys

DEVICES = {devices!r}
LOG = {log!r}


def _say(line):
    print(line, file=sys.stderr)
    return 1


def _push(shell, local, remote):
    if not os.path.isfile(local):
        return _say(f"adb: error: cannot stat '{{local}}': No such file or directory")
    with open(local, "rb") as source:
        done = subprocess.run([*shell, f"cat > {{shlex.quote(remote)}}"], stdin=source)
    if done.returncode != 0:
        return _say(f"adb: error: failed to copy '{{local}}' to '{{remote}}'")
    print(f"{{local}}: 1 file pushed.")
    return 0


def _pull(shell, remote, local):
    with open(local, "wb") as target:
        done = subprocess.run([*shell, f"cat {{shlex.quote(remote)}}"], stdout=target,
                              stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        os.remove(local)
        return _say(f"adb: error: failed to stat remote object '{{remote}}': No such file or "
                    "directory")
    print(f"{{remote}}: 1 file pulled.")
    return 0


def main(argv):
    if LOG:
        with open(LOG, "a") as log:
            log.write(json.dumps(argv) + "\\n")
    serial = os.environ.get("ANDROID_SERIAL")
    if argv[:1] == ["-s"]:
        serial, argv = argv[1], argv[2:]
    if argv[:1] == ["devices"]:
        print("List of devices attached")
        for name in DEVICES:
            print(f"{{name}}\\tdevice")
        return 0
    if serial is None:
        return _say("adb: more than one device/emulator" if len(DEVICES) > 1 else
                    "adb: no devices/emulators found")
    if serial not in DEVICES:
        return _say(f"adb: device '{{serial}}' not found")
    shell, command, args = DEVICES[serial], argv[0], argv[1:]
    if command == "shell":
        return subprocess.run([*shell, " ".join(args)], stdin=subprocess.DEVNULL).returncode
    if command == "push" and len(args) == 2:
        return _push(shell, *args)
    if command == "pull" and len(args) == 2:
        return _pull(shell, *args)
    return _say(f"adb: unknown command {{command}}")


sys.exit(main(sys.argv[1:]))
"""


def write_fake_adb(folder: Path, devices: dict[str, list[str]], log: Path | None = None) -> Path:
    """`folder/adb`, serving `devices` (serial -> the argv that runs a shell string there),
    run by this interpreter; put `folder` in front of PATH for bench to find it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "adb"
    body = _SCRIPT.format(devices=devices, log=None if log is None else str(log))
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path
