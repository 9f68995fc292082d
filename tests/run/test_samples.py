"""bnnexport.run.samples.load_samples: the one reader of RUN_DIR/samples.npz (bench, convert,
benchmarks), required or optional, every malformed file refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from bnnexport.errors import CheckpointError
from bnnexport.run.directory import RunDir
from bnnexport.run.samples import load_samples


def _write(tmp_path, count=6, labels=None, **extra):
    arrays = {"inputs": np.arange(count * 4, dtype=np.float64).reshape(count, 1, 2, 2)}
    arrays["labels"] = np.arange(count) if labels is None else labels
    np.savez(tmp_path / "samples.npz", **{**arrays, **extra})
    return RunDir(tmp_path)


def test_samples_come_back_as_float32_inputs_and_int64_labels_limited(tmp_path):
    inputs, labels = load_samples(_write(tmp_path), limit=4)
    assert inputs.dtype == np.float32 and labels.dtype == np.int64
    assert inputs.shape == (4, 1, 2, 2) and labels.tolist() == [0, 1, 2, 3]
    assert len(load_samples(RunDir(tmp_path))[0]) == 6


def test_missing_samples_are_an_error_only_when_required(tmp_path):
    assert load_samples(RunDir(tmp_path), required=False) == (None, None)
    with pytest.raises(CheckpointError, match="not found: run `bnnexport export"):
        load_samples(RunDir(tmp_path))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("truncate", "truncated or not a samples archive"),
        ("npy", "truncated or not a samples archive"),
        ("text", "truncated or not a samples archive"),
        ("no labels", "lacks `inputs` or `labels`"),
        ("short labels", "labels [5]"),
        ("flat inputs", "holds inputs [6]"),
        ("pickled", "truncated or not a samples archive"),
    ],
)
@pytest.mark.parametrize("required", [True, False])
def test_a_malformed_samples_file_is_one_line_whether_required_or_not(
    tmp_path, damage, says, required
):
    path = tmp_path / "samples.npz"
    if damage == "truncate":
        _write(tmp_path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "npy":
        with path.open("wb") as handle:
            np.save(handle, np.zeros(3))
    elif damage == "text":
        path.write_text("inputs, labels\n")
    elif damage == "no labels":
        np.savez(path, inputs=np.zeros((2, 1, 2, 2)))
    elif damage == "short labels":
        _write(tmp_path, labels=np.arange(5))
    elif damage == "flat inputs":
        np.savez(path, inputs=np.zeros(6), labels=np.zeros(6))
    elif damage == "pickled":
        np.savez(path, inputs=np.array([object()] * 2), labels=np.zeros(2))
    with pytest.raises(CheckpointError) as caught:
        load_samples(RunDir(tmp_path), required=required)
    message = str(caught.value)
    assert says in message and str(path) in message and "\n" not in message


def test_no_samples_at_all_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="holds no samples"):
        load_samples(_write(tmp_path, count=0, labels=np.zeros(0)))
