"""The packed model file: a model at 1 bit per binary weight, in safetensors.

A packed file (RUN_DIR/model.safetensors) holds the model state in safetensors: a plain header
and raw tensor bytes, so loading it never unpickles anything.

- every binary kernel of the model's record (`bnnexport.nn.discover.BinaryKernels`) as uint8,
  bit-packed with `numpy.packbits` along the flattened kernel, bit = 1 iff the weight is -1
  (LCE's convention), padded with 0 bits to a whole byte; its shape is in the metadata;
- every other tensor (real weights, BatchNorm running statistics) as it is;
- string metadata, each value JSON: format and version, model name and arguments, the training
  config, the packed kernels' shapes, the record of binary kernels itself, every tensor's
  shape, and a SHA-256 content hash over the tensors and the rest of the metadata, so a
  tampered or corrupted file is refused.

This module is the format only; `bnnexport.stages.pack` is the stage that verifies and writes a
run's file, and `bnnexport.run.checkpoint.load_packed` rebuilds the model from one.

Example:
    >>> import torch
    >>> kernel = torch.tensor([[1.0, -1.0, -1.0], [1.0, 1.0, -1.0]])
    >>> packed = pack_bits(kernel)
    >>> packed.tolist()  # bits 011001, padded with 0 to one byte
    [100]
    >>> bool(torch.equal(unpack_bits(packed, [2, 3]), kernel))
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bnnexport.errors import CheckpointError
from bnnexport.nn.discover import BinaryKernels

PACKED_FORMAT = "bnnexport-packed"
PACKED_VERSION = 1
PACKED_NAME = "model.safetensors"


def pack_bits(kernel: torch.Tensor) -> np.ndarray:
    """A ±1 kernel -> uint8 bytes, 1 bit per weight, bit = 1 iff the weight is -1."""
    return np.packbits(kernel.detach().cpu().numpy().reshape(-1) == -1)


def unpack_bits(packed: np.ndarray, shape: list[int]) -> torch.Tensor:
    """The inverse of `pack_bits`: float32 ±1 kernel of `shape`."""
    count = int(np.prod(shape, dtype=np.int64))
    bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), count=count)
    return torch.from_numpy((1.0 - 2.0 * bits.astype(np.float32)).reshape(shape))


def content_hash(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) and the metadata, in sorted order."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].contiguous()
        head = json.dumps([key, str(tensor.dtype), list(tensor.shape)])
        digest.update(head.encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    rest = {k: v for k, v in metadata.items() if k != "content_hash"}
    digest.update(json.dumps(rest, sort_keys=True).encode())
    return digest.hexdigest()


def pack_model(
    model: nn.Module,
    kernels_record: BinaryKernels,
    model_name: str,
    model_kwargs: dict[str, Any],
    config: dict | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """Serialize a (verified) model, its recorded binary kernels at 1 bit: (safetensors bytes,
    sizes for the report)."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    kernels = kernels_record.names
    tensors = dict(state)
    for key in kernels:
        tensors[key] = torch.from_numpy(pack_bits(state[key]))
    metadata = {
        "format": PACKED_FORMAT,
        "version": str(PACKED_VERSION),
        "model_name": model_name,
        "model_kwargs": json.dumps(model_kwargs),
        "config": json.dumps(config or {}),
        "binary": json.dumps({key: list(state[key].shape) for key in kernels}),
        "binary_kernels": json.dumps(kernels_record.to_json()),
        "shapes": json.dumps({key: list(value.shape) for key, value in state.items()}),
    }
    metadata["content_hash"] = content_hash(tensors, metadata)
    payload = save(tensors, metadata=metadata)
    binary = sum(state[key].numel() for key in kernels)
    sizes = {
        "float32_bytes": 4 * sum(v.numel() for v in state.values()),
        "binary_parameters": binary,
        "binary_float32_bytes": 4 * binary,
        "binary_packed_bytes": sum(tensors[key].numel() for key in kernels),
        "real_bytes": sum(v.numel() * v.element_size() for k, v in state.items()
                          if k not in kernels),
        "content_hash": metadata["content_hash"],
    }  # fmt: skip
    return payload, sizes


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; CheckpointError for anything unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if not path.is_file():
        raise CheckpointError(f"packed model not found: {path}")
    data = path.read_bytes()
    if len(data) < 8:
        raise CheckpointError(f"{path} is empty or truncated")
    try:
        tensors = load(data)
        # the header: 8-byte little-endian length, then JSON with "__metadata__"
        length = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8 : 8 + length]).get("__metadata__") or {}
    except (SafetensorError, ValueError, UnicodeDecodeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "unreadable"
        raise CheckpointError(f"{path} is truncated or not a safetensors file ({reason})") from None
    return tensors, metadata


def load_packed_state(path: str | os.PathLike) -> dict[str, Any]:
    """A packed file as a checkpoint-like dict (model_name, model_kwargs, config, model state).

    Raises CheckpointError (exit 2) for a missing, truncated or foreign file, or one whose
    content hash does not match (tampered or corrupted).
    """
    path = Path(path)
    tensors, metadata = _read(path)
    if metadata.get("format") != PACKED_FORMAT:
        raise CheckpointError(f"{path} is not a bnnexport packed model")
    if metadata.get("version") != str(PACKED_VERSION):
        raise CheckpointError(
            f"{path}: unsupported packed format version {metadata.get('version')}"
        )
    if content_hash(tensors, metadata) != metadata.get("content_hash"):
        raise CheckpointError(f"{path}: content hash mismatch; the file was modified or corrupted")
    try:
        binary = json.loads(metadata["binary"])
        state = dict(tensors)
        for key, shape in binary.items():
            packed = tensors[key].numpy()
            if packed.dtype != np.uint8 or packed.size * 8 < int(np.prod(shape)):
                raise ValueError(f"packed kernel {key} does not hold {shape} bits")
            state[key] = unpack_bits(packed, shape)
        config = json.loads(metadata.get("config", "{}"))
        return {
            "model_name": metadata["model_name"],
            "model_kwargs": json.loads(metadata["model_kwargs"]),
            "config": config,
            "model": state,
            # a run trained with int8 float layers: its model has their fake quantization
            "float_layers": config.get("float_layers", "float32"),
            **_record(metadata),
        }
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed packed model ({error})") from None


def _record(metadata: dict[str, str]) -> dict[str, Any]:
    """{"binary_kernels": the record} as a checkpoint holds it; a file packed before records
    existed lists its packed kernels' names (`bnnexport.run.checkpoint.binary_record` takes
    either)."""
    if "binary_kernels" in metadata:
        return {"binary_kernels": json.loads(metadata["binary_kernels"])}
    return {"binary_kernels": list(json.loads(metadata["binary"]))}
