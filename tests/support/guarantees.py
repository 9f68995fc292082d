"""What the reliability tests check a command against: one line, an exit code, files untouched."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# what `train` prints at each epoch's end, on a terminal or not (docs/RELIABILITY.md, "Fail fast")
EPOCH_LINE = re.compile(
    r"epoch \d+/\d+: loss \d+\.\d{4} train \d\.\d{4} test \d\.\d{4} \(\d+\.\d s\)"
)


def besides_epoch_lines(stderr: str) -> list[str]:
    """The lines of `stderr` other than train's line per epoch: its notes, warnings, errors."""
    return [line for line in stderr.splitlines() if not EPOCH_LINE.fullmatch(line)]


def snapshot(directory: Path) -> dict[str, str]:
    """Every file below `directory` by relative path, with its SHA-256."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_one_line_error(result: Any, code: int, *fragments: str) -> str:
    """`result` (a CompletedProcess, or click's Result) exited with `code` and wrote exactly one
    line on stderr, `bnnexport: error: ...`, holding every fragment; returns that line."""
    exit_code = getattr(result, "returncode", getattr(result, "exit_code", None))
    why = (exit_code, result.stderr[-1500:], getattr(result, "exception", None))
    assert exit_code == code, why
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error: "), result.stderr[-1500:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_refused_unchanged(directory: Path, args: tuple, code: int, *fragments: str) -> str:
    """`bnnexport ARGS` (in-process) ends with one error line holding every fragment and exit
    `code`, and leaves every file below `directory` as it was; returns the line."""
    from support.cli import invoke

    before = snapshot(directory)
    line = assert_one_line_error(invoke(*args), code, *fragments)
    assert snapshot(directory) == before
    return line


def user_files(run: Path) -> None:
    """Files bnnexport never wrote, which no command may touch."""
    (run / "thesis.txt").write_text("three years of work\n")
    (run / "data").mkdir()
    (run / "data" / "batch.bin").write_bytes(bytes(range(256)))


@contextlib.contextmanager
def another_writer(run: Path) -> Iterator[None]:
    """What a second bnnexport process holds while it writes `run`: a flock on the directory."""
    fd = os.open(run, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


def fail_on_write(monkeypatch: Any, error: OSError) -> None:
    """Make every write through `bnnexport.run.files` fail with `error` (a full disk, a read-only
    directory), at the temporary file it starts with."""
    import bnnexport.run.files

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(bnnexport.run.files.tempfile, "mkstemp", refuse)


def write_zero_samples(run: Path, shape: tuple[int, ...] = (1, 28, 28), count: int = 8) -> None:
    """RUN/samples.npz holding `count` all-zero inputs of `shape`, labelled 0."""
    import numpy as np

    np.savez(
        run / "samples.npz",
        inputs=np.zeros((count, *shape), np.float32),
        labels=np.zeros(count, np.int64),
    )


def benched(run: Path, shape: tuple[int, ...]) -> list[str]:
    """What export and bench leave in RUN, cheaply: samples.npz written and recorded as export
    writes it (bnnexport's, made from checkpoint.pt), then a real bench of the PyTorch backend
    with its report.md and plots. Returns the names of the files added."""
    import io

    import numpy as np

    from bnnexport.run import files, provenance
    from bnnexport.stages.bench.measure import bench
    from bnnexport.stages.bench.options import BenchOptions

    before = set(snapshot(run))
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.zeros((4, *shape), np.float32), labels=np.zeros(4, np.int64))
    files.write_bytes_atomic(run / "samples.npz", buffer.getvalue())
    provenance.record(run, "samples.npz", ["checkpoint.pt"])
    bench(run, BenchOptions(runs=1, warmup=0, samples=4))
    return sorted(set(snapshot(run)) - before)
