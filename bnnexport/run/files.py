"""Which files bnnexport owns: a manifest of what it wrote, by content, in each directory.

Every file a command writes goes through `write_bytes_atomic` (or is `record`ed right after a
converter wrote it), which notes its SHA-256 in DIR/provenance.json, the *manifest* of that
directory. bnnexport replaces or deletes a file only when the manifest lists it and its bytes
still match: a file the user put there, or one of ours the user edited since, is theirs, and
touching it is refused in one line (`ForeignFileError`). Ownership is decided by record, never
by name, so a user's own `config.json` or `model.onnx` is safe whatever it is called.

An *append-only* file (metrics.jsonl) is ours while the bytes we recorded are still its
prefix: a crash between two appends and the next record cannot disown it.

The manifest also holds what `bnnexport.run.provenance` needs (each file's sources); the two
modules share this one file and this one record per file.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "notes.txt").write_text("mine")
    >>> _ = write_bytes_atomic(folder / "report.md", b"# ours")
    >>> foreign_files(folder)
    ['notes.txt']
    >>> write_bytes_atomic(folder / "notes.txt", b"ours now?")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bnnexport.errors.ForeignFileError: ...notes.txt was not written by bnnexport, so it is yours...
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bnnexport.errors import ForeignFileError

MANIFEST = "provenance.json"
FORMAT = "bnnexport-manifest"
VERSION = 2
# Temporaries of an interrupted atomic write (ours, `.NAME.XXXX.tmp`) and of the converter's
# flatbuffer writes (`.convert-XXXX.tflite`): left only by a crash, never a user's file.
TEMPORARIES = (".*.tmp", ".convert-*.tflite")
SHOWN = 4  # foreign files named in one error line


def content_hash(path: str | os.PathLike, size: int | None = None) -> str:
    """SHA-256 of a file's bytes (the first `size` bytes when given), in hex."""
    digest = hashlib.sha256()
    left = size
    with open(path, "rb") as handle:
        while left is None or left > 0:
            block = handle.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def replace_atomic(path: str | os.PathLike, payload: bytes) -> Path:
    """Write `payload` to `path` through a temporary file in the same directory, fsync and a
    rename: never half-written. No ownership check: `write_bytes_atomic` is the public writer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 minus umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def entries(directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The manifest of `directory`: file name -> its record ({} when there is none).

    Raises ForeignFileError when DIR/provenance.json exists but is not a bnnexport manifest.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        files = data.get("files")
        return dict(files) if isinstance(files, dict) else {}
    if isinstance(data, dict) and data and all(_is_record(v) for v in data.values()):
        return dict(data)  # version 1: provenance records only, keyed by artifact name
    raise ForeignFileError(
        f"{path} was not written by bnnexport (it is not its manifest): bnnexport records "
        f"the files it owns there, so it writes nothing into {Path(directory)}; "
        "choose another output folder"
    )


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("sha256"), str)


def _write_entries(directory: Path, records: dict[str, dict[str, Any]]) -> None:
    document = {"format": FORMAT, "version": VERSION, "files": records}
    replace_atomic(directory / MANIFEST, (json.dumps(document, indent=2) + "\n").encode())


def owns(path: str | os.PathLike, records: dict[str, dict[str, Any]] | None = None) -> bool:
    """Whether bnnexport wrote `path` and its bytes are still the ones it wrote."""
    path = Path(path)
    if path.name == MANIFEST:
        entries(path.parent)  # raises for a foreign one
        return True
    if any(fnmatch.fnmatchcase(path.name, pattern) for pattern in TEMPORARIES):
        return path.is_file()
    record = (entries(path.parent) if records is None else records).get(path.name)
    if record is None or not path.is_file():
        return False
    if record.get("append"):
        size = int(record.get("size", 0))
        return path.stat().st_size >= size and content_hash(path, size) == record["sha256"]
    return content_hash(path) == record["sha256"]


def require_replaceable(path: str | os.PathLike) -> None:
    """Raise ForeignFileError unless bnnexport may write `path`: missing, or a file it wrote,
    unchanged, in a folder whose manifest is its own (or that has none yet), below no file."""
    path = Path(path)
    _require_folder_for(path)
    entries(path.parent)  # a foreign manifest: nothing is written there, so say so now
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() or path.is_symlink():
        raise ForeignFileError(f"{path} is in the way: a folder or link bnnexport did not make")
    if not owns(path):
        raise ForeignFileError(_foreign_message(path))


def _require_folder_for(path: Path) -> None:
    """ForeignFileError when a file stands where one of `path`'s folders would be made."""
    for folder in path.parents:
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise ForeignFileError(f"cannot write {path}: {folder} is a file, not a folder")
            return


def _foreign_message(path: Path) -> str:
    listed = path.name in entries(path.parent)
    why = "changed since bnnexport wrote it" if listed else "was not written by bnnexport"
    return (
        f"{path} {why}, so it is yours: bnnexport will not replace or delete it; "
        "move it away or choose another output"
    )


def record(
    path: str | os.PathLike,
    sources: dict[str, str] | None = None,
    append: bool = False,
    payload: bytes | None = None,
) -> None:
    """Note in the manifest that bnnexport just wrote `path` (its bytes `payload`, when the
    caller has them in memory); `sources` (name -> SHA-256) is kept for provenance, and
    `append` marks a file bnnexport appends to (ours while the recorded bytes are its prefix).
    A record that had sources keeps them unless new ones are given."""
    path = Path(path)
    records = entries(path.parent)
    digest = hashlib.sha256(payload).hexdigest() if payload is not None else content_hash(path)
    entry: dict[str, Any] = {"sha256": digest}
    if append:
        entry.update(append=True, size=len(payload) if payload is not None else path.stat().st_size)
    old = records.get(path.name, {})
    if sources is not None or "sources" in old:
        entry["sources"] = sources if sources is not None else old["sources"]
    records[path.name] = entry
    _write_entries(path.parent, records)


def write_bytes_atomic(path: str | os.PathLike, payload: bytes, append: bool = False) -> Path:
    """Write `payload` to `path` atomically and record it in the manifest; refuse (one line,
    ForeignFileError) to replace a file bnnexport did not write or that was edited since."""
    path = Path(path)
    require_replaceable(path)
    entries(path.parent)  # a foreign manifest refuses before anything is written
    replace_atomic(path, payload)
    record(path, append=append, payload=payload)
    return path


def foreign_files(directory: str | os.PathLike) -> list[str]:
    """Names in `directory` that are not bnnexport's (folders end in '/'), sorted."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    try:
        records, ours = entries(directory), True
    except ForeignFileError:  # someone else's provenance.json: nothing here is ours
        records, ours = {}, False
    foreign = []
    for path in sorted(directory.iterdir()):
        if path.is_dir() and not path.is_symlink():
            foreign.append(path.name + "/")
        elif path.name == MANIFEST:
            foreign.extend([] if ours else [MANIFEST])
        elif not owns(path, records):
            foreign.append(path.name)
    return foreign


def require_run_directory(directory: str | os.PathLike) -> None:
    """Raise ForeignFileError when `directory` holds anything bnnexport did not write: such a
    folder is not a run, and a run there could replace or delete the user's files."""
    foreign = foreign_files(directory)
    if not foreign:
        return
    shown = ", ".join(foreign[:SHOWN]) + (
        f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
    )
    raise ForeignFileError(
        f"{directory} holds files bnnexport did not write or that changed since ({shown}), "
        "so it is not a run directory: choose another --out, or move them away"
    )


def remove(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Delete files bnnexport wrote and drop their records; every one is checked before any is
    deleted (ForeignFileError naming the first that is not ours). Missing ones are skipped."""
    doomed = [Path(p) for p in paths if Path(p).is_file()]
    for path in doomed:
        require_replaceable(path)
    for directory in {path.parent for path in doomed}:
        names = {path.name for path in doomed if path.parent == directory} - {MANIFEST}
        records = entries(directory)
        for name in names:
            (directory / name).unlink()
        if any(name in records for name in names):
            _write_entries(directory, {k: v for k, v in records.items() if k not in names})
    for path in doomed:
        if path.name == MANIFEST:
            path.unlink()
    return doomed


def clear(directory: str | os.PathLike) -> list[Path]:
    """Delete every file the manifest of `directory` lists, leftover temporaries and the
    manifest itself: a run started afresh. Refuses (before deleting anything) when a listed
    file was edited since. Files the manifest does not list are left where they are."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    listed = [directory / name for name in entries(directory)]
    temporaries = [
        path for pattern in TEMPORARIES for path in directory.glob(pattern) if path.is_file()
    ]
    return remove([*listed, *temporaries, directory / MANIFEST])
