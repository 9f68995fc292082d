"""The run directory: where one model's artifacts live, and its checkpoint format.

Every command takes a run directory (see docs/ARCHITECTURE.md for what each file is). Checkpoints
are written atomically (temporary file, fsync, rename), so a crash or a kill during a write leaves
the previous checkpoint intact, and they load with `torch.load(weights_only=True)`: a checkpoint
never runs code.

Example:
    >>> from bnnexport.runs import RunDir
    >>> RunDir("runs/demo").checkpoint
    PosixPath('runs/demo/checkpoint.pt')
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from bnnexport import files
from bnnexport.errors import CheckpointError, DataError, RunLockedError
from bnnexport.packed import PACKED_NAME, load_packed_state
from bnnexport.reports import write_bytes_atomic

if TYPE_CHECKING:
    from bnnexport.discover import BinaryKernels

CHECKPOINT_FORMAT = "bnnexport-checkpoint"
CHECKPOINT_VERSION = 1

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

    def flatbuffer(self, target: str = "arm64") -> Path:
        """The LCE flatbuffer for `target` (arm64 or arm32)."""
        return self.root / f"model-{target}.tflite"

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
    """Delete what bnnexport wrote in `root` (its manifest, `bnnexport.files`), nothing else;
    return the paths deleted. Refuses, deleting nothing, when one of them was edited since."""
    return files.clear(root)


def load_samples(
    run: RunDir, limit: int | None = None, required: bool = True
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """The export stage's test samples (NCHW float32 inputs, int64 labels), the first `limit`.

    A missing samples.npz raises CheckpointError when `required` and gives (None, None)
    otherwise (`convert` then checks on random inputs); a truncated or malformed one, labels
    that do not match the inputs, or no samples at all raise CheckpointError, one line.

    Example:
        >>> import tempfile
        >>> load_samples(RunDir(tempfile.mkdtemp()), required=False)
        (None, None)
    """
    path = run.samples
    hint = EXPORT_HINT.format(run=run.root)
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path} not found: {hint}")
        return None, None
    inputs, labels = read_samples_file(path, limit, hint, labels_required=True)
    return inputs, labels


def read_samples_file(
    path: str | os.PathLike,
    limit: int | None = None,
    hint: str = "",
    labels_required: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """`inputs` (NCHW float32) and `labels` (int64) of a samples archive (.npz), the first
    `limit`. Without a `labels` array (allowed unless `labels_required`) every label is -1: no
    ground truth, so top-k is not reported. CheckpointError (one line, ending in `hint`) for a
    missing, truncated or malformed file, mismatched labels or no samples."""
    path = Path(path)
    suffix = f": {hint}" if hint else ""
    if not path.is_file():
        raise CheckpointError(f"samples file not found: {path}{suffix}")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "inputs" not in data or (labels_required and "labels" not in data):
                wanted = "`inputs` or `labels`" if labels_required else "an `inputs` array"
                raise CheckpointError(f"{path} lacks {wanted}{suffix}")
            inputs = np.asarray(data["inputs"], np.float32)
            labels = (
                np.asarray(data["labels"], np.int64)
                if "labels" in data
                else np.full(len(inputs), -1, np.int64)
            )
    # a bare .npy array is not a context manager: TypeError
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError) as error:
        raise CheckpointError(
            f"{path} is truncated or not a samples archive ({type(error).__name__}){suffix}"
        ) from None
    if inputs.ndim < 2 or labels.shape != inputs.shape[:1]:
        raise CheckpointError(
            f"{path} holds inputs {list(inputs.shape)} and labels {list(labels.shape)}{suffix}"
        )
    if limit is not None:
        inputs, labels = inputs[:limit], labels[:limit]
    if len(inputs) == 0:
        raise CheckpointError(f"{path} holds no samples{suffix}")
    if labels.min() < -1:
        raise DataError(
            f"{path} holds label {int(labels.min())}: a label is a class index from 0, or -1 "
            f"for a sample without one{suffix}"
        )
    return inputs, labels


def require_labels_fit(labels: np.ndarray, classes: int, path: str | os.PathLike) -> None:
    """DataError (one line) when a label of the samples file `path` is no class of a model
    with `classes` outputs: top-1 would be 0 without a word.

    Example:
        >>> require_labels_fit(np.array([0, 9, -1]), 10, "mine.npz")
        >>> require_labels_fit(np.array([0, 12]), 10, "mine.npz")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bnnexport.errors.DataError: mine.npz holds labels up to 12 but the model has 10 classes ...
    """
    largest = int(labels.max()) if len(labels) else -1
    if largest >= classes:
        raise DataError(
            f"{path} holds labels up to {largest} but the model has {classes} classes "
            f"(outputs): labels run from 0 to {classes - 1}, or -1 for none"
        )


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
            raise RunLockedError(
                f"{root} is being written by another bnnexport command; wait for it to finish "
                "or use another --out"
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


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write a checkpoint atomically; `payload` gets the format marker added."""
    buffer = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **payload}, buffer)
    return write_bytes_atomic(path, buffer.getvalue())


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load and check a checkpoint (a file or a run directory) without unpickling any object.

    Raises CheckpointError, one line, for a missing, empty, truncated, foreign or unsafe file.
    """
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).require().checkpoint
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty")
    kind = _sniff(path)
    if kind is not None:
        raise CheckpointError(f"{path} is {kind}, not a bnnexport checkpoint")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            raise CheckpointError(
                f"{path} holds pickled Python objects; refusing to load it (it could run code)"
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint: {first}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path} is truncated or not a checkpoint ({reason})") from None
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a bnnexport checkpoint")
    for key in ("model_name", "model_kwargs", "model"):
        if key not in data:
            raise CheckpointError(
                f"{path} lacks {key!r}; it is not a complete bnnexport checkpoint"
            )
    return data


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
_PICKLE_PROTOCOL = 0x80  # torch's legacy format: pickles from the first byte


def _sniff(path: Path) -> str | None:
    """What a file that cannot be a torch checkpoint is instead (None: it may be one).

    Said before unpickling, so random bytes or a text file are not reported as pickled objects.
    """
    with path.open("rb") as handle:
        head = handle.read(4096)
    if head.startswith(_ZIP_MAGIC) or head[:1] == bytes([_PICKLE_PROTOCOL]):
        return None
    if _is_onnx(path):
        return "an ONNX model (verify and convert take it as MODEL.onnx)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"binary data of an unknown format (starting {head[:4].hex()})"
    if all(c.isprintable() or c in "\r\n\t" for c in text):
        return f"a text file ({text.strip()[:30]!r}...)"
    return f"data of an unknown format (starting {head[:4].hex()})"


def _is_onnx(path: Path) -> bool:
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # anything onnx cannot parse is not an ONNX model
        return False
    return model.ir_version > 0 and len(model.graph.node) > 0


def build_model(checkpoint: dict[str, Any], source: str | os.PathLike = "checkpoint") -> nn.Module:
    """Rebuild the model a checkpoint describes and load its binary weights (eval mode)."""
    from bnnexport.models import create_model

    kwargs = dict(checkpoint["model_kwargs"])
    try:
        model = create_model(checkpoint["model_name"], **kwargs)
    except ValueError as error:
        raise CheckpointError(f"{source}: {error}") from None
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        raise CheckpointError(
            f"{source} does not match model {checkpoint['model_name']!r}: {detail}"
        ) from None
    return model.eval()


def binary_record(
    checkpoint: dict[str, Any], model: nn.Module, source: str | os.PathLike = "checkpoint"
) -> BinaryKernels:
    """The record of `model`'s binary kernels that `checkpoint` (or a packed file's state)
    carries, checked against the model.

    A checkpoint written before records existed is decided now, by the same function training
    uses (`bnnexport.discover.find_binary_kernels`): by the names it listed (a model of your
    own), else by tracing the model at its recorded input shape.
    """
    from bnnexport.discover import BinaryKernels, find_binary_kernels

    data = checkpoint.get("binary_kernels")
    if isinstance(data, dict):
        return BinaryKernels.from_json(data, str(source)).require_in(model, str(source))
    if isinstance(data, list):
        return find_binary_kernels(model, binary=[str(name) for name in data])
    return find_binary_kernels(model)


@dataclass
class LoadedModel:
    """A model as a stage reads it: the module (eval mode), the record of its binary kernels,
    and the checkpoint (or packed state) it came from."""

    model: nn.Module
    kernels: BinaryKernels
    checkpoint: dict[str, Any]
    source: str


def open_model(path: str | os.PathLike) -> LoadedModel:
    """The model in a run directory, checkpoint file or packed `.safetensors`, with its record
    of binary kernels (`binary_record`)."""
    path = Path(path)
    if path.suffix.lower() == ".safetensors":
        file, state = path, load_packed_state(path)
    else:
        file = RunDir(path).require().checkpoint if path.is_dir() else path
        state = load_checkpoint(file)
    model = build_model(state, file)
    return LoadedModel(model, binary_record(state, model, file), state, str(path))


def load_packed(path: str | os.PathLike) -> nn.Module:
    """The model stored in a packed `.safetensors` file (or a run directory's), in eval mode."""
    path = Path(path)
    if path.is_dir():
        path = path / PACKED_NAME
    return build_model(load_packed_state(path), path)


def load_model(path: str | os.PathLike) -> nn.Module:
    """The model in a checkpoint file, run directory or packed `.safetensors`, in eval mode."""
    if Path(path).suffix.lower() == ".safetensors":
        return load_packed(path)
    return build_model(load_checkpoint(path), path)


def append_jsonl(path: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Append JSON lines; lines are small, so a crash loses at most the lines being written."""
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read JSON lines, skipping a torn last line left by a crash."""
    records = []
    path = Path(path)
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
