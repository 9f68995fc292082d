"""`bnnexport device`: an emulated aarch64 device on this machine, for `bench --device`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from bnnexport.cli.common import handle_errors, json_option

START_TIMEOUT = 1200.0  # seconds: a first start builds the root file system (minutes)
EMULATION_NOTE = (
    "timings on this device are qemu's on this machine's CPU, not an ARM CPU's; its outputs "
    "are the ARM build's (LCE's real kernels with an aarch64 lce_benchmark_model)"
)
NO_BINARY_NOTE = (
    "the device has no lce_benchmark_model of its own: add --benchmark-binary "
    "lce_benchmark_model_aarch64 (LCE's release asset) to bench"
)


def _session_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "session",
        type=click.Path(file_okay=False),
        default=None,
        help="Folder for the device's keys, sshd config, temporary directory and state "
        "(default: $BNNEXPORT_CACHE/device, i.e. ~/.cache/bnnexport/device).",
    )(func)


def _binary_option(func: Any) -> Any:
    return click.option(
        "--benchmark-binary",
        type=click.Path(dir_okay=False, exists=True),
        help="An aarch64 lce_benchmark_model (LCE's release asset lce_benchmark_model_aarch64): "
        "the bench arguments printed then upload it, and the device computes with LCE's real "
        "ARM kernels.",
    )(func)


def _session(session: str | None) -> Path:
    from bnnexport.deploy.emulator import default_cache

    return (Path(session) if session else default_cache() / "device").resolve()


def _checked_binary(binary: str | None) -> Path | None:
    """The benchmark binary, refused now (one line) unless it is built for aarch64."""
    from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import check_local_binary

    return None if binary is None else check_local_binary(binary, "aarch64").resolve()


def _announce(state: dict[str, Any], as_json: bool, serving: str | None = None) -> None:
    """Notes on stderr (and `serving`, how to stop it), then the bench arguments on stdout (one
    line, or one JSON object): whoever reads that line has every note before it."""
    import shlex

    from bnnexport.deploy.emulator import SUITE

    notes = [
        f"emulated aarch64 device (Debian {SUITE} arm64 under qemu-user) on "
        f"{state['destination']} port {state['port']}, key {state['ssh_key']}: `bnnexport "
        "bench RUN_DIR` takes the options on stdout to run there",
        EMULATION_NOTE,
    ]
    if state["benchmark_binary"] is None:
        notes.append(NO_BINARY_NOTE)
    for note in notes:
        click.echo(f"bnnexport: note: {note}", err=True)
    if serving:
        click.echo(f"bnnexport: {serving}", err=True)
    if as_json:
        click.echo(json.dumps({**state, "emulated": True, "note": EMULATION_NOTE}))
    else:
        click.echo(" ".join(shlex.quote(arg) for arg in state["bench_args"]))


@click.group("device")
def device_command() -> None:
    """An emulated 64-bit ARM device on this machine for `bench --device`, without a Raspberry
    Pi: Debian arm64 under qemu-user with sshd on 127.0.0.1, built from Debian packages
    (qemu-user-static, binfmt-support, arch-test, mmdebstrap; `make device-tools`). Needs root.
    Its timings are not ARM timings."""


@device_command.command("emulate", short_help="Serve the emulated device until Ctrl-C.")
@_session_option
@_binary_option
@json_option
@handle_errors
def emulate_command(session: str | None, benchmark_binary: str | None, as_json: bool) -> None:
    """Start the emulated device and serve until Ctrl-C (or SIGTERM, or `bnnexport device
    stop`), then stop it and everything that ran on it.

    Prints the `bench` options that reach it (device, port, key, known hosts, runner, and the
    benchmark binary to upload when given) on one line. The first start builds the root file
    system from Debian's mirror (mmdebstrap, about 240 MB) and caches it in $BNNEXPORT_CACHE
    (~/.cache/bnnexport); later starts take seconds.
    """
    from bnnexport.deploy.emulator import Stopped, default_cache, serve

    binary = _checked_binary(benchmark_binary)
    progress = lambda line: click.echo(f"bnnexport: {line}", err=True)  # noqa: E731

    def ready(state: dict[str, Any]) -> None:
        stop = f"serving; stop it with Ctrl-C or `bnnexport device stop --dir {state['session']}`"
        _announce(state, as_json, stop)

    try:
        serve(_session(session), default_cache(), binary, ready, progress)
    except (KeyboardInterrupt, Stopped):
        pass  # while starting: serve's own `finally` blocks have stopped what had started
    click.echo("bnnexport: stopped the emulated device", err=True)


@device_command.command("start", short_help="Start the emulated device in the background.")
@_session_option
@_binary_option
@json_option
@handle_errors
def start_command(session: str | None, benchmark_binary: str | None, as_json: bool) -> None:
    """Start the emulated device in the background (what `emulate` serves, as `python -m
    bnnexport.deploy.emulator`, its log in the folder's emulate.log) and return once it listens,
    printing the `bench` options that reach it; `bnnexport device stop` stops it."""
    import bnnexport
    from bnnexport.deploy.emulator import default_cache, read_state
    from bnnexport.deploy.errors import EmulatorStateError, EmulatorUnavailableError

    folder = _session(session)
    _checked_binary(benchmark_binary)
    if read_state(folder) is not None:
        raise EmulatorStateError(f"an emulated device already serves from {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "bnnexport.deploy.emulator", str(folder), str(default_cache())]
    if benchmark_binary is not None:
        argv.append(str(Path(benchmark_binary).resolve()))
    # the server imports the same bnnexport (and so the same deploy) as this process, wherever
    # that came from
    here = str(Path(bnnexport.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }
    log = folder / "emulate.log"
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True, env=env)  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while (state := read_state(folder)) is None or state["pid"] != process.pid:
        if process.poll() is not None:
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            raise EmulatorUnavailableError(
                lines[-1].removeprefix("bnnexport: error: ")
                if lines
                else "the emulated device did not start"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise EmulatorUnavailableError(f"no emulated device after {START_TIMEOUT:.0f} s "
                                           f"(log: {log})")  # fmt: skip
        time.sleep(0.2)
    _announce(state, as_json, f"stop it with `bnnexport device stop --dir {folder}`")


@device_command.command("stop", short_help="Stop the emulated device and all that ran on it.")
@_session_option
@json_option
@handle_errors
def stop_command(session: str | None, as_json: bool) -> None:
    """Stop the emulated device serving from the folder, and wait until everything that ran on
    it (sshd, the benchmark tool, qemu) is gone."""
    from bnnexport.deploy.emulator import stop

    state = stop(_session(session))
    if as_json:
        click.echo(json.dumps({"stopped": True, "pid": state["pid"], "port": state["port"]}))
    else:
        click.echo(f"stopped the emulated device on port {state['port']} (process {state['pid']})")


@device_command.command(
    "status", short_help="Whether the emulated device runs, and how to reach it."
)
@_session_option
@json_option
@handle_errors
def status_command(session: str | None, as_json: bool) -> None:
    """Whether an emulated device serves from the folder, and the `bench` options that reach
    it."""
    from bnnexport.deploy.emulator import read_state

    folder = _session(session)
    state = read_state(folder)
    if as_json:
        click.echo(json.dumps({"running": state is not None, **(state or {})}))
    elif state is None:
        click.echo(f"no emulated device serves from {folder}")
    else:
        click.echo(" ".join(state["bench_args"]))
