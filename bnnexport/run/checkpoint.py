"""The checkpoint format, and a model read back from a checkpoint or packed file with its record
of binary kernels.

Checkpoints are written atomically (temporary file, fsync, rename), so a crash or a kill during
a write leaves the previous checkpoint intact, and they load with `torch.load(weights_only=True)`:
a checkpoint never runs code. `open_run_model` is how every stage reads a model: the module, the
record of its binary kernels (`bnnexport.nn.discover.BinaryKernels`) and the checkpoint.

Example:
    >>> from bnnexport.run.checkpoint import open_run_model
    >>> loaded = open_run_model("runs/demo")                        # doctest: +SKIP
    >>> loaded.kernels.parameters                                # doctest: +SKIP
    456704
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bnnexport.errors import CheckpointError
from bnnexport.imports import changed_source
from bnnexport.run.files import write_bytes_atomic
from bnnexport.run.packed import PACKED_NAME, load_packed_state

if TYPE_CHECKING:
    from bnnexport.nn.discover import BinaryKernels
from bnnexport.run.directory import RunDir

CHECKPOINT_FORMAT = "bnnexport-checkpoint"


CHECKPOINT_VERSION = 1


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


def recorded_float_layers(run_dir: str | os.PathLike) -> str:
    """How a run trained its float layers: "int8" (quantization-aware, `train --float-layers
    int8`: the checkpoint's `float_layers`) or "float32" (the default, and any run without a
    checkpoint)."""
    run = RunDir(run_dir)
    if not run.checkpoint.is_file():
        return "float32"
    return str(load_checkpoint(run.checkpoint).get("float_layers", "float32"))


def build_model(checkpoint: dict[str, Any], source: str | os.PathLike = "checkpoint") -> nn.Module:
    """Rebuild the model a checkpoint describes and load its binary weights (eval mode)."""
    from bnnexport.models import create_model
    from bnnexport.models.registry import recorded_kwargs

    kwargs = recorded_kwargs(checkpoint["model_name"], dict(checkpoint["model_kwargs"]))
    warn_changed_source(checkpoint.get("model_source"))
    try:
        model = create_model(checkpoint["model_name"], **kwargs)
    except ValueError as error:
        raise CheckpointError(f"{source}: {error}") from None
    if checkpoint.get("float_layers", "float32") == "int8":  # trained with fake quantization
        _prepare_int8(model, checkpoint, source)
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        raise CheckpointError(
            f"{source} does not match model {checkpoint['model_name']!r}: {detail}"
        ) from None
    return model.eval()


_WARNED: set[str] = set()  # each changed source said once per process


def warn_changed_source(recorded: Any) -> None:
    """A one-line warning when the model's source file a run recorded (`--model module:fn`,
    `bnnexport.imports.source_of`) changed or went away since: every stage rebuilds the
    model from it."""
    why = changed_source(recorded)
    if why is not None and why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(why, stacklevel=2)


def _prepare_int8(model: nn.Module, checkpoint: dict[str, Any], source: str | os.PathLike) -> None:
    """The fake quantization training added to the float layers (`bnnexport.nn.int8`), placed
    as training placed it: the recorded binary kernels left alone, traced at the input shape."""
    from bnnexport.nn.int8 import prepare_int8

    shape = checkpoint["model_kwargs"].get("input_shape") or getattr(
        model, "bnnexport_config", {}
    ).get("input_shape")
    record = checkpoint.get("binary_kernels") or {}
    kernels = record.get("kernels", []) if isinstance(record, dict) else record
    names = [k["name"] if isinstance(k, dict) else str(k) for k in kernels]
    if not shape:
        raise CheckpointError(f"{source}: a model trained with int8 float layers needs its "
                              "input shape to be rebuilt (model_kwargs input_shape)")  # fmt: skip
    prepare_int8(model, torch.zeros(1, *[int(v) for v in shape]), names)


def binary_record(
    checkpoint: dict[str, Any], model: nn.Module, source: str | os.PathLike = "checkpoint"
) -> BinaryKernels:
    """The record of `model`'s binary kernels that `checkpoint` (or a packed file's state)
    carries, checked against the model.

    A checkpoint written before records existed is decided now, by the same function training
    uses (`bnnexport.nn.discover.find_binary_kernels`): by the names it listed (a model of your
    own), else by tracing the model at its recorded input shape.
    """
    from bnnexport.nn.discover import BinaryKernels, find_binary_kernels

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


def open_run_model(path: str | os.PathLike) -> LoadedModel:
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
