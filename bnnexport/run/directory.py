"""The run directory: where one model's artifacts live, and who may write it.

Every command takes a run directory (docs/ARCHITECTURE.md "Run directory" lists each file).
`RunDir` names its artifacts; `lock_run` holds one writer at a time; `clear_run` deletes what
bnnexport wrote there, nothing else.

Example:
    >>> from bnnexport.run.directory import RunDir
    >>> RunDir("runs/demo").checkpoint
    PosixPath('runs/demo/checkpoint.pt')
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bnnexport.errors import CheckpointError, RunLockedError
from bnnexport.run import files

if TYPE_CHECKING:
    pass


EXPORT_HINT = "run `bnnexport export {run}` first"


@dataclass(frozen=True)
class RunDir:
    """Paths of the artifacts in one run directory."""

    root: Path

    def __init__(self, root: str | os.PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    checkpoint = property(lambda self: self.root / "checkpoint.pt")
    config = property(lambda self: self.root / "config.json")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    train_report = property(lambda self: self.root / "train.json")
    accuracy_plot = property(lambda self: self.root / "accuracy.png")
    flip_rate_plot = property(lambda self: self.root / "flip_rate.png")
    samples = property(lambda self: self.root / "samples.npz")
    onnx = property(lambda self: self.root / "model.onnx")

    def flatbuffer(self, target: str = "arm64", int8: bool = False) -> Path:
        """The LCE flatbuffer for `target` (arm64 or arm32); with `int8`, the one whose float
        layers run in int8 (`convert --float-layers int8`), which sits beside it."""
        return self.root / f"model-{target}{'-int8' if int8 else ''}.tflite"

    def require(self) -> RunDir:
        """Raise CheckpointError unless this is a run directory with a checkpoint."""
        if not self.root.is_dir():
            raise CheckpointError(f"run directory not found: {self.root}")
        if not self.checkpoint.is_file():
            raise CheckpointError(
                f"{self.root} has no checkpoint.pt: run `bnnexport train --out {self.root}` first"
            )
        return self


def clear_run(root: str | os.PathLike) -> list[Path]:
    """Delete what bnnexport wrote in `root` (its manifest, `bnnexport.run.files`), nothing else;
    return the paths deleted. Refuses, deleting nothing, when one of them was edited since."""
    return files.clear(root)


_held_locks: dict[Path, int] = {}  # run directory -> nesting depth in this process


@contextlib.contextmanager
def lock_run(root: str | os.PathLike, create: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on a run directory while a command writes into it.

    The lock is a `flock` on the directory itself, so it leaves no file behind and the kernel
    drops it when the process dies. Reentrant within one process (`pipeline` runs the stages
    in-process). With `create`, a missing directory is made and removed again if the command
    fails before writing anything into it. Raises RunLockedError when another process holds it.
    """
    root = Path(root)
    key = root.resolve()
    if key in _held_locks:
        _held_locks[key] += 1
        try:
            yield root
        finally:
            _held_locks[key] -= 1
        return
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root} is a file, not a run directory")
    created = create and not root.exists()
    if created:
        _make_run_dir(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # only the commands that make their folder (train, init, pipeline, ...) take --out
            elsewhere = " or use another --out" if create else ", then run this command again"
            raise RunLockedError(
                f"{root} is being written by another bnnexport command; wait for it to finish"
                f"{elsewhere}"
            ) from None
        except OSError as error:  # a file system without flock (some network mounts)
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        _held_locks[key] = 1
        try:
            yield root
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    root.rmdir()  # only if still empty
            raise
        finally:
            del _held_locks[key]
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _make_run_dir(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(f"cannot create run directory {root}: a file is in the way") from None
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise CheckpointError(f"cannot create run directory {root}: {error.strerror}") from None
        raise
