"""Which artifact of a run directory was made from which: content hashes, so stale ones show.

A stage that writes an artifact records the SHA-256 of the artifact and of each file it was made
from (checkpoint.pt -> model.onnx -> model-*.tflite) in RUN_DIR/provenance.json. An artifact is
*stale* when its own bytes or those of anything it was made from (transitively) changed since:
e.g. a flatbuffer converted from a model.onnx that a later export replaced. `bench` skips stale
artifacts and says why; a stage that rewrites an input first removes what was derived from it.
An artifact without a record (written before records were kept) is taken as it is.

Example:
    >>> from bnnexport.run import provenance
    >>> provenance.record("runs/demo", "model.onnx", ["checkpoint.pt"])   # doctest: +SKIP
    >>> provenance.stale_reason("runs/demo", "model-arm64.tflite")        # doctest: +SKIP
    'made from another model.onnx than the one in runs/demo'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bnnexport.errors import CheckpointError, ForeignFileError
from bnnexport.run import files
from bnnexport.run.files import MANIFEST as PROVENANCE
from bnnexport.run.files import content_hash

__all__ = ["DERIVED", "PROVENANCE", "content_hash", "record", "remove_derived",
           "require_current", "stale_reason"]  # fmt: skip

# What each artifact is made from; removing or rewriting a source invalidates these (and
# whatever else the manifest records as made from them, whatever its name).
DERIVED: dict[str, tuple[str, ...]] = {
    "checkpoint.pt": ("verify.json", "model.safetensors", "pack.json", "samples.npz",
                      "model.onnx", "export.json", "bench.json"),
    "model.onnx": ("model-arm64.tflite", "model-arm32.tflite", "model-float.tflite",
                   "model-arm64-int8.tflite", "model-arm32-int8.tflite", "convert.json",
                   "convert-int8.json", "bench.json"),
    "model-arm64.tflite": ("bench.json",),
    "model-arm32.tflite": ("bench.json",),
    "model-float.tflite": ("bench.json",),
    "model-arm64-int8.tflite": ("bench.json",),
    "model-arm32-int8.tflite": ("bench.json",),
}  # fmt: skip


def record(run_dir: str | os.PathLike, artifact: str, sources: Sequence[str]) -> None:
    """Record that RUN_DIR/`artifact` was just made from `sources` (names in RUN_DIR) as they
    are now. Call it right after the artifact is written, with the run directory locked."""
    root = Path(run_dir)
    digests = {name: content_hash(root / name) for name in sources}
    files.record(root / artifact, sources=digests)


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
    and drop their records; return the names removed. An artifact is derived when `DERIVED`
    says so or when its record names `source` (or one derived from it) among its sources."""
    root = Path(run_dir)
    records = _read(root)
    doomed: list[str] = []
    pending = [source]
    while pending:
        name = pending.pop()
        made_from = [k for k, v in records.items() if name in v.get("sources", {})]
        for derived in (*DERIVED.get(name, ()), *made_from):
            if derived not in doomed:
                doomed.append(derived)
                pending.append(derived)
    removed = files.remove(root / name for name in doomed if name != source)
    return [path.name for path in removed]


def _stale(root: Path, artifact: str, records: dict, seen: set[str]) -> str | None:
    entry = records.get(artifact)
    if entry is None or artifact in seen or entry.get("append"):
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
    try:
        return files.entries(root)
    except ForeignFileError as error:
        raise CheckpointError(str(error)) from None
