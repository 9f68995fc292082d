"""Which artifact of a run directory was made from which: content hashes, so stale ones show.

A stage that writes an artifact records the SHA-256 of the artifact and of each file it was made
from (checkpoint.pt -> model.onnx -> model-*.tflite) in RUN_DIR/provenance.json. An artifact is
*stale* when its own bytes or those of anything it was made from (transitively) changed since:
e.g. a flatbuffer converted from a model.onnx that a later export replaced. `bench` skips stale
artifacts and says why; a stage that rewrites an input first removes what was derived from it.
An artifact without a record (written before records were kept) is taken as it is.

Example:
    >>> from bnnexport import provenance
    >>> provenance.record("runs/demo", "model.onnx", ["checkpoint.pt"])   # doctest: +SKIP
    >>> provenance.stale_reason("runs/demo", "model-arm64.tflite")        # doctest: +SKIP
    'made from another model.onnx than the one in runs/demo'
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from bnnexport.errors import CheckpointError
from bnnexport.reports import write_json_atomic

PROVENANCE = "provenance.json"

# What each artifact is made from; removing or rewriting a source invalidates these.
DERIVED: dict[str, tuple[str, ...]] = {
    "checkpoint.pt": ("verify.json", "model.safetensors", "pack.json", "samples.npz",
                      "model.onnx", "export.json", "bench.json"),
    "model.onnx": ("model-arm64.tflite", "model-arm32.tflite", "model-float.tflite",
                   "convert.json", "bench.json"),
    "model-arm64.tflite": ("bench.json",),
    "model-arm32.tflite": ("bench.json",),
    "model-float.tflite": ("bench.json",),
}  # fmt: skip


def content_hash(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record(run_dir: str | os.PathLike, artifact: str, sources: Sequence[str]) -> None:
    """Record that RUN_DIR/`artifact` was just made from `sources` (names in RUN_DIR) as they
    are now. Call it right after the artifact is written, with the run directory locked."""
    root = Path(run_dir)
    records = _read(root)
    records[artifact] = {
        "sha256": content_hash(root / artifact),
        "sources": {name: content_hash(root / name) for name in sources},
    }
    write_json_atomic(root / PROVENANCE, records)


def stale_reason(run_dir: str | os.PathLike, artifact: str) -> str | None:
    """Why RUN_DIR/`artifact` is not current, or None when it is (or has no record)."""
    root = Path(run_dir)
    return _stale(root, artifact, _read(root), seen=set())


def require_current(run_dir: str | os.PathLike, artifact: str, hint: str = "") -> None:
    """Raise CheckpointError (one line) when `artifact` is stale; `hint` says what to run."""
    reason = stale_reason(run_dir, artifact)
    if reason is not None:
        raise CheckpointError(f"{Path(run_dir) / artifact} is stale: {reason}{hint}")


def remove_derived(run_dir: str | os.PathLike, source: str) -> list[str]:
    """Delete every artifact made (transitively) from `source`, before `source` is rewritten,
    and drop their records; return the names removed."""
    root = Path(run_dir)
    doomed: list[str] = []
    pending = list(DERIVED.get(source, ()))
    while pending:
        name = pending.pop()
        if name not in doomed:
            doomed.append(name)
            pending.extend(DERIVED.get(name, ()))
    removed = [name for name in doomed if (root / name).is_file()]
    for name in removed:
        (root / name).unlink()
    records = _read(root)
    if any(name in records for name in doomed):
        write_json_atomic(root / PROVENANCE, {k: v for k, v in records.items() if k not in doomed})
    return removed


def _stale(root: Path, artifact: str, records: dict, seen: set[str]) -> str | None:
    entry = records.get(artifact)
    if entry is None or artifact in seen:
        return None
    seen.add(artifact)
    path = root / artifact
    if not path.is_file():
        return f"{artifact} is missing"
    if content_hash(path) != entry.get("sha256"):
        return f"{artifact} changed after it was recorded"
    for name, digest in entry.get("sources", {}).items():
        if not (root / name).is_file():
            return f"made from {name}, which is gone"
        if content_hash(root / name) != digest:
            return f"made from another {name} than the one in {root}"
        upstream = _stale(root, name, records, seen)
        if upstream is not None:
            return upstream
    return None


def _read(root: Path) -> dict:
    path = root / PROVENANCE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is unreadable ({type(error).__name__})") from None
    return data if isinstance(data, dict) else {}
