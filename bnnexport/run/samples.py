"""The test samples a run's later stages check on: RUN_DIR/samples.npz, or a file of yours.

Example:
    >>> import tempfile
    >>> from bnnexport.run.directory import RunDir
    >>> load_samples(RunDir(tempfile.mkdtemp()), required=False)
    (None, None)
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bnnexport.errors import CheckpointError, DataError

if TYPE_CHECKING:
    pass
from bnnexport.run.directory import EXPORT_HINT, RunDir


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


# the flatbuffer metadata entry `convert` writes the class names to, as a JSON list of
# strings in the order of the model's outputs (docs/ARCHITECTURE.md "Run directory")
CLASS_NAMES = "class_names"


def class_names_metadata(names: list[str] | None) -> dict[str, bytes]:
    """The flatbuffer metadata holding `names` ({} without names).

    >>> class_names_metadata(["cat", "dog"])
    {'class_names': b'["cat", "dog"]'}
    """
    return {CLASS_NAMES: json.dumps(list(names)).encode()} if names else {}


def sample_class_names(run: RunDir) -> list[str] | None:
    """The class names the export stage wrote beside its samples (RUN_DIR/samples.npz's
    `class_names`, in the order of the model's outputs); None without them."""
    if not run.samples.is_file():
        return None
    try:
        with np.load(run.samples, allow_pickle=False) as data:
            names = [str(n) for n in data["class_names"]] if "class_names" in data else None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError):
        return None  # `load_samples` says what is wrong with the file
    return names


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
