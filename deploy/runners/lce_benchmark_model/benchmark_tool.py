"""Run `lce_benchmark_model` on a device and parse what it prints.

`lce_benchmark_model` is TFLite's `benchmark_model` with LCE's ops registered (docs/LCE_NOTES.md
"Running flatbuffers"). Its times are microseconds in the summary lines and milliseconds in the
op-profiling tables; the parsed result is in milliseconds throughout.

Example:
    >>> text = '''count=50 first=16042 curr=15211 min=15002 max=16310 avg=15408.2 std=245
    ... Inference timings in us: Init: 5685, First inference: 18525, Warmup (avg): 14461.3
    ... Overall peak memory footprint (MB) via periodic monitoring: 9.8'''
    >>> result = parse_benchmark_output(text)
    >>> result.min_ms, result.mean_ms, result.peak_memory_mb, result.init_ms
    (15.002, 15.4082, 9.8, 5.685)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bnnexport.deploy.connection import Connection
from bnnexport.deploy.errors import BenchmarkOutputError, MissingBinaryError, WrongArchitectureError

BINARY_NAME = "lce_benchmark_model"

# ELF e_machine values (System V ABI) of the architectures a device may have.
_ELF_MACHINES = {0x03: "i386", 0x28: "arm", 0x3E: "x86_64", 0xB7: "aarch64"}
# `uname -m` spellings -> the ELF architecture a native binary has there.
_UNAME_TO_ELF = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "i386": "i386",
    "i686": "i386",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "armv6l": "arm",
    "armv7l": "arm",
    "armv8l": "arm",
}

_COUNT_LINE = re.compile(r"^(?:INFO:\s*)?count=(\d+)\s+(.*)$")
_TIMINGS_LINE = re.compile(r"Inference timings in us:\s*(.*)$")
_PEAK_LINE = re.compile(r"Overall peak memory footprint \(MB\) via periodic monitoring:\s*([\d.]+)")
_DELTA_LINE = re.compile(r"Memory footprint delta .*\(MB\):\s*init=([\d.]+)\s+overall=([\d.]+)")
_NODES_LINE = re.compile(r"Number of nodes executed:\s*(\d+)")
_REGULAR_SECTION = "Operator-wise Profiling Info for Regular Benchmark Runs"
_NUMBER = r"(-?[\d.]+(?:e[-+]?\d+)?)%?"


@dataclasses.dataclass
class OpTime:
    """One row of the "Run Order" table: one node of the graph, times in ms."""

    node_type: str
    name: str
    first_ms: float
    avg_ms: float
    percent: float
    cdf_percent: float
    mem_kb: float
    times_called: int


@dataclasses.dataclass
class OpTypeTime:
    """One row of "Summary by node type": all nodes of one op type together, times in ms."""

    node_type: str
    count: int
    avg_ms: float
    percent: float
    cdf_percent: float
    mem_kb: float
    times_called: int


@dataclasses.dataclass
class BenchmarkResult:
    """What `lce_benchmark_model` reported. Older builds print no percentiles, newer ones (on
    LiteRT's benchmark code) a median with p5 and p95; none is invented where none is printed."""

    count: int
    min_ms: float
    max_ms: float
    mean_ms: float
    std_ms: float
    median_ms: float | None = None
    init_ms: float | None = None
    first_inference_ms: float | None = None
    warmup_avg_ms: float | None = None
    peak_memory_mb: float | None = None
    nodes_executed: int | None = None
    ops: list[OpTime] = dataclasses.field(default_factory=list)
    op_types: list[OpTypeTime] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _strip_log_prefix(line: str) -> str:
    # newer TFLite prefixes its log lines with "INFO: "; tables printed as one message are not
    return line[6:] if line.startswith("INFO: ") else line


def _parse_stat(fields: str) -> dict[str, float]:
    # "first=16042 curr=15211 min=... std=245", or "curr=15000(all same)" when all runs were equal
    values = {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+(?:e[-+]?\d+)?)", fields)}
    if "min" not in values and "curr" in values:
        values.update(min=values["curr"], max=values["curr"], avg=values["curr"], std=0.0)
    return values


def _parse_table(lines: list[str], start: int) -> tuple[list[str], list[list[str]], int]:
    """Read the header at `start` and the rows after it; return headers, rows, next index."""
    headers = re.findall(r"\[([^\]]+)\]", lines[start])
    has_name = headers[-1].lower() == "name"
    numeric = len(headers) - 1 - int(has_name)
    tail = r"\s+(.*?)\s*$" if has_name else r"\s*$"
    pattern = re.compile(r"^\s*(.+?)\s+" + r"\s+".join([_NUMBER] * numeric) + tail)
    rows = []
    index = start + 1
    while index < len(lines):
        match = pattern.match(_strip_log_prefix(lines[index]))
        if not match:
            break
        rows.append(list(match.groups()))
        index += 1
    return [h.strip().lower() for h in headers], rows, index


def _column(headers: list[str], row: list[str], *names: str) -> str | None:
    for name in names:
        if name in headers:
            return row[headers.index(name)]
    return None


def _parse_profile(lines: list[str]) -> tuple[list[OpTime], list[OpTypeTime], int | None]:
    """Parse the op-profiling tables of the regular runs (not those of initialisation)."""
    ops: list[OpTime] = []
    op_types: list[OpTypeTime] = []
    nodes = None
    starts = [i for i, line in enumerate(lines) if _REGULAR_SECTION in line]
    if not starts:
        return ops, op_types, nodes
    index = starts[-1] + 1
    table = None
    while index < len(lines):
        line = _strip_log_prefix(lines[index])
        if "Run Order" in line:
            table = "run"
        elif "Top by Computation Time" in line or "Summary by node type" in line:
            table = "types" if "Summary" in line else "top"
        elif match := _NODES_LINE.search(line):
            nodes = int(match.group(1))
        elif line.lstrip().startswith("Timings (microseconds)"):
            break  # end of this section
        elif "[node type]" in line.lower() and table in ("run", "types"):
            headers, rows, index = _parse_table(lines, index)
            for row in rows:
                col = lambda *n, r=row, h=headers: float(_column(h, r, *n) or "nan")  # noqa: E731
                if table == "run":
                    ops.append(
                        OpTime(
                            node_type=row[0],
                            name=row[-1],
                            first_ms=col("first"),
                            avg_ms=col("avg ms"),
                            percent=col("%"),
                            cdf_percent=col("cdf%"),
                            mem_kb=col("mem kb"),
                            times_called=int(col("times called")),
                        )
                    )
                else:
                    op_types.append(
                        OpTypeTime(
                            node_type=row[0],
                            count=int(col("count")),
                            avg_ms=col("avg ms"),
                            percent=col("avg %"),
                            cdf_percent=col("cdf %"),
                            mem_kb=col("mem kb"),
                            times_called=int(col("times called")),
                        )
                    )
            table = None
            continue
        index += 1
    return ops, op_types, nodes


def parse_benchmark_output(text: str) -> BenchmarkResult:
    """Parse the text `lce_benchmark_model` prints (stdout and stderr together).

    The latency statistics come from the last `count=... avg=...` line before `Inference timings`
    (the first such line belongs to the warm-up runs). Raises `BenchmarkOutputError` when there is
    no such line, e.g. when the binary crashed before benchmarking.
    """
    lines = text.splitlines()
    stat = None
    timings: dict[str, float] = {}
    peak = None
    for raw in lines:
        line = _strip_log_prefix(raw).strip()
        if match := _COUNT_LINE.match(line):
            if not timings:  # count lines after the summary belong to profiling tables
                stat = (int(match.group(1)), _parse_stat(match.group(2)))
        elif match := _TIMINGS_LINE.search(line):
            for key, value in re.findall(r"([A-Za-z ()]+):\s*(-?[\d.]+)", match.group(1)):
                timings[key.strip().lower()] = float(value) / 1000.0
        elif match := _PEAK_LINE.search(line):
            peak = float(match.group(1))
        elif (match := _DELTA_LINE.search(line)) and peak is None:
            peak = float(match.group(2))
    if stat is None:
        tail = next((line for line in reversed(lines) if line.strip()), "no output")
        raise BenchmarkOutputError(
            f"{BINARY_NAME} printed no timing line (last line: {tail.strip()})"
        )
    count, values = stat
    ops, op_types, nodes = _parse_profile(lines)
    return BenchmarkResult(
        count=count,
        min_ms=values["min"] / 1000.0,
        max_ms=values["max"] / 1000.0,
        mean_ms=values["avg"] / 1000.0,
        std_ms=values["std"] / 1000.0,
        median_ms=values["median"] / 1000.0 if "median" in values else None,
        init_ms=timings.get("init"),
        first_inference_ms=timings.get("first inference"),
        warmup_avg_ms=timings.get("warmup (avg)"),
        peak_memory_mb=peak,
        nodes_executed=nodes,
        ops=ops,
        op_types=op_types,
    )


def elf_architecture(header: bytes) -> str | None:
    """Return the architecture of an ELF file from its first 20 bytes, or None if not ELF."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    byteorder = "little" if header[5] == 1 else "big"
    machine = int.from_bytes(header[18:20], byteorder)
    return _ELF_MACHINES.get(machine, f"elf-machine-{machine:#x}")


def check_architecture(binary: str, binary_arch: str | None, uname_m: str) -> None:
    """Raise `WrongArchitectureError` when an ELF binary cannot run natively on `uname -m`.

    Scripts (no ELF header) are let through: the device's own shell decides.
    """
    if binary_arch is None:
        return
    device_arch = _UNAME_TO_ELF.get(uname_m.strip(), uname_m.strip())
    if binary_arch != device_arch:
        raise WrongArchitectureError(
            f"{binary} is built for {binary_arch} but the device is {uname_m.strip()}; "
            f"use the {BINARY_NAME} build for {device_arch} (see deploy/README.md)"
        )


def benchmark_command(
    binary: str,
    graph: str,
    threads: int = 1,
    runs: int = 100,
    warmup_runs: int = 10,
    op_profiling: bool = True,
    max_secs: float | None = None,
    use_indirect_bgemm: bool | None = None,
) -> list[str]:
    """Return the argv that benchmarks `graph` for exactly `runs` runs after `warmup_runs`."""
    argv = [
        binary,
        f"--graph={graph}",
        f"--num_threads={threads}",
        f"--num_runs={runs}",
        "--min_secs=0",
        f"--warmup_runs={warmup_runs}",
        "--warmup_min_secs=0",
        f"--enable_op_profiling={str(op_profiling).lower()}",
        "--report_peak_memory_footprint=true",
    ]
    if max_secs is not None:
        argv.append(f"--max_secs={max_secs:g}")
    if use_indirect_bgemm is not None:
        argv.append(f"--use_indirect_bgemm={str(use_indirect_bgemm).lower()}")
    return argv


@dataclasses.dataclass(frozen=True)
class ToolIdentity:
    """Which `lce_benchmark_model` ran: its file's format and SHA-256, so every device row says
    what produced it (LCE's ELF build, or a script standing in for it)."""

    path: str  # where it ran on the device
    uploaded: bool  # from --benchmark-binary (else the device's own, from its PATH)
    format: str  # "ELF aarch64", "script (#!/usr/bin/env python3)", "unknown"
    sha256: str

    @property
    def label(self) -> str:
        """One line: `lce_benchmark_model: ELF aarch64, sha256 415e454c4af8`."""
        return f"{Path(self.path).name}: {self.format}, sha256 {self.sha256[:12]}"

    def to_json(self) -> dict[str, Any]:
        """The identity as a JSON-ready dict, with its label."""
        return {**dataclasses.asdict(self), "label": self.label}


def file_format(header: bytes) -> str:
    """What a binary's first bytes say it is: `ELF <architecture>`, `script (<its #! line>)`,
    or `unknown`.

    Example:
        >>> file_format(b"#!/usr/bin/env python3\\nPK..."), file_format(b"MZ")
        ('script (#!/usr/bin/env python3)', 'unknown')
    """
    arch = elf_architecture(header[:20])
    if arch is not None:
        return f"ELF {arch}"
    if header.startswith(b"#!"):
        return f"script ({header.splitlines()[0].decode(errors='replace').strip()})"
    return "unknown"


def local_identity(binary: Path, remote_path: str) -> ToolIdentity:
    """The identity of a local binary uploaded to `remote_path`."""
    data = binary.read_bytes()
    return ToolIdentity(
        remote_path, True, file_format(data[:128]), hashlib.sha256(data).hexdigest()
    )


def remote_identity(client: Connection, remote_path: str) -> ToolIdentity:
    """The identity of the device's own binary at `remote_path` (coreutils od and sha256sum)."""
    quoted = shlex.quote(remote_path)
    header = client.run(f"od -An -tx1 -N128 {quoted}", timeout=60).stdout.split()
    digest = client.run(f"sha256sum {quoted}", timeout=120).stdout.split()
    raw = bytes(int(b, 16) for b in header)
    return ToolIdentity(remote_path, False, file_format(raw), digest[0] if digest else "")


def check_local_binary(binary: str | Path, uname_m: str) -> Path:
    """Raise unless `binary` is a local file whose ELF architecture can run on `uname_m`."""
    binary = Path(binary)
    if not binary.is_file():
        raise MissingBinaryError(f"benchmark binary not found: {binary}")
    with binary.open("rb") as handle:
        check_architecture(str(binary), elf_architecture(handle.read(20)), uname_m)
    return binary


def device_binary(
    client: Connection, work: str, binary: Path | None, uname_m: str
) -> tuple[str, ToolIdentity]:
    """The path of `lce_benchmark_model` on the device and its identity: `binary` uploaded into
    `work`, or the device's own from its PATH (its ELF architecture checked against `uname_m`)."""
    if binary is not None:
        remote_binary = f"{work}/{BINARY_NAME}"
        client.put(binary, remote_binary)
        client.run(["chmod", "+x", remote_binary], timeout=60)
        return remote_binary, local_identity(binary, remote_binary)
    found = client.run(f"command -v {BINARY_NAME}", timeout=60, check=False)
    remote_binary = found.stdout.strip()
    if found.returncode != 0 or not remote_binary:
        raise MissingBinaryError(
            f"{BINARY_NAME} is not on the PATH of {client.destination}; "
            f"pass --benchmark-binary PATH to upload one (see deploy/README.md)"
        )
    identity = remote_identity(client, remote_binary)
    arch = identity.format[4:] if identity.format.startswith("ELF ") else None
    check_architecture(f"{client.destination}:{remote_binary}", arch, uname_m)
    return remote_binary, identity


@dataclasses.dataclass(frozen=True)
class Staged:
    """A working directory on the device with the benchmark binary and a flatbuffer in it."""

    work: str
    binary: str  # the tool's path on the device
    graph: str  # the flatbuffer's path on the device
    tool: ToolIdentity


@contextlib.contextmanager
def staged_graph(
    client: Connection, flatbuffer: str | Path, binary: str | Path | None
) -> Iterator[Staged]:
    """A fresh working directory on the device holding `flatbuffer` and the benchmark binary
    (`binary` uploaded after its architecture is checked, else the device's own); removed
    afterwards."""
    uname_m = client.run(["uname", "-m"], timeout=60).stdout.strip()
    if binary is not None:
        binary = check_local_binary(binary, uname_m)
    with client.workdir() as work:
        remote_binary, tool = device_binary(client, work, binary, uname_m)
        graph = f"{work}/{Path(flatbuffer).name}"
        client.put(flatbuffer, graph)
        yield Staged(work, remote_binary, graph, tool)


def run_lce_benchmark(
    client: Connection,
    flatbuffer: str | Path,
    threads: int = 1,
    runs: int = 100,
    warmup_runs: int = 10,
    binary: str | Path | None = None,
    timeout: float = 600.0,
    op_profiling: bool = True,
    use_indirect_bgemm: bool | None = None,
) -> tuple[BenchmarkResult, str]:
    """Copy `flatbuffer` (and `binary` if given) to the device, benchmark, clean up.

    `client` is a `deploy.connection.Connection`. Without `binary`, `lce_benchmark_model` must be
    on the device's PATH. Returns the parsed result and the raw output.
    """
    with staged_graph(client, flatbuffer, binary) as staged:
        argv = benchmark_command(
            staged.binary,
            staged.graph,
            threads,
            runs,
            warmup_runs,
            op_profiling,
            max_secs=timeout,
            use_indirect_bgemm=use_indirect_bgemm,
        )
        done = client.run(
            argv, timeout=timeout, cwd=staged.work, merge_stderr=True, limit_remote=True
        )
    return parse_benchmark_output(done.stdout), done.stdout
