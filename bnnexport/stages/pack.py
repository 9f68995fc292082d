"""`pack(run) -> PackReport`: store a verified model at 1 bit per binary weight.

Writes RUN_DIR/model.safetensors in the packed format (`bnnexport.run.packed`: bit-packed ±1
kernels, real tensors as they are, a content hash over everything). The model is verified
first (`bnnexport.stages.verify`): a model that is not strictly binary is never packed.
`bnnexport.run.checkpoint.load_packed(path)` rebuilds the model; its outputs equal the
original's bit for bit.

Example:
    >>> from bnnexport.stages.pack import pack
    >>> from bnnexport.run.checkpoint import load_packed
    >>> report = pack("runs/demo")                          # doctest: +SKIP
    >>> round(report.file_ratio, 3), round(report.binary_kernel_ratio, 4)  # doctest: +SKIP
    (0.035, 0.0312)
    >>> model = load_packed("runs/demo/model.safetensors")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from bnnexport.run.checkpoint import open_run_model
from bnnexport.run.directory import RunDir
from bnnexport.run.files import write_bytes_atomic
from bnnexport.run.packed import PACKED_NAME, pack_model
from bnnexport.stages.report import Report
from bnnexport.stages.verify import require_strict, verify_model


@dataclass
class PackReport(Report):
    """What `bnnexport pack` prints and writes to RUN_DIR/pack.json.

    `float32_bytes` is the model state at float32 (what a plain float checkpoint of the weights
    takes), `packed_bytes` the whole model.safetensors file, header and metadata included, and
    `file_ratio` the one over the other; `binary_*` count the binary kernels alone
    (`binary_kernel_ratio`: their packed bytes over their float32 bytes, 1/32 at best).
    """

    packed: str
    model: str
    float32_bytes: int
    packed_bytes: int
    file_ratio: float
    binary_parameters: int
    binary_float32_bytes: int
    binary_packed_bytes: int
    binary_kernel_ratio: float
    real_bytes: int
    header_bytes: int
    checkpoint_bytes: int
    content_hash: str
    seconds: float


def pack(run_dir: str | os.PathLike) -> PackReport:
    """Verify a run's model, then write RUN_DIR/model.safetensors and RUN_DIR/pack.json.

    Raises:
        CheckpointError (exit 2) for a missing or bad run; NotBinaryError (exit 1) when the
        model does not verify (nothing is written then).
    """
    start = time.perf_counter()
    run = RunDir(run_dir).require()
    loaded = open_run_model(run.root)
    checkpoint = loaded.checkpoint
    # verify the very object being packed, by the record it carries, and leave the verdict
    verified = verify_model(loaded.model, str(run.root), "checkpoint", loaded.kernels)
    verified.save(run.root / "verify.json")
    require_strict(verified)
    payload, sizes = pack_model(
        loaded.model, loaded.kernels, checkpoint["model_name"],
        dict(checkpoint["model_kwargs"]), checkpoint.get("config"),
    )  # fmt: skip
    path = write_bytes_atomic(run.root / PACKED_NAME, payload)
    tensor_bytes = sizes["real_bytes"] + sizes["binary_packed_bytes"]
    report = PackReport(
        packed=str(path),
        model=checkpoint["model_name"],
        float32_bytes=sizes["float32_bytes"],
        packed_bytes=len(payload),
        file_ratio=len(payload) / sizes["float32_bytes"],
        binary_parameters=sizes["binary_parameters"],
        binary_float32_bytes=sizes["binary_float32_bytes"],
        binary_packed_bytes=sizes["binary_packed_bytes"],
        binary_kernel_ratio=sizes["binary_packed_bytes"] / max(sizes["binary_float32_bytes"], 1),
        real_bytes=sizes["real_bytes"],
        header_bytes=len(payload) - tensor_bytes,
        checkpoint_bytes=run.checkpoint.stat().st_size,
        content_hash=sizes["content_hash"],
        seconds=time.perf_counter() - start,
    )
    report.save(run.root / "pack.json")
    return report
