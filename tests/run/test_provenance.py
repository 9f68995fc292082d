"""provenance: which artifact was made from which, by content hash; stale ones show."""

from __future__ import annotations

import pytest

from bnnexport.errors import CheckpointError
from bnnexport.run import provenance


@pytest.fixture
def run(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"weights v1")
    (tmp_path / "model.onnx").write_bytes(b"onnx v1")
    provenance.record(tmp_path, "model.onnx", ["checkpoint.pt"])
    (tmp_path / "model-arm64.tflite").write_bytes(b"flatbuffer v1")
    provenance.record(tmp_path, "model-arm64.tflite", ["model.onnx"])
    return tmp_path


def test_artifacts_made_from_the_current_files_are_current(run):
    assert provenance.stale_reason(run, "model.onnx") is None
    assert provenance.stale_reason(run, "model-arm64.tflite") is None


def test_a_flatbuffer_of_an_older_onnx_is_stale(run):
    (run / "model.onnx").write_bytes(b"onnx v2")
    provenance.record(run, "model.onnx", ["checkpoint.pt"])
    assert "another model.onnx" in provenance.stale_reason(run, "model-arm64.tflite")


def test_staleness_is_transitive(run):
    (run / "checkpoint.pt").write_bytes(b"weights v2")  # retrained, not exported again
    assert "another checkpoint.pt" in provenance.stale_reason(run, "model-arm64.tflite")


def test_an_artifact_changed_by_hand_is_stale(run):
    (run / "model-arm64.tflite").write_bytes(b"edited")
    assert "changed after" in provenance.stale_reason(run, "model-arm64.tflite")


def test_an_artifact_without_a_record_is_taken_as_it_is(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"from an older bnnexport")
    assert provenance.stale_reason(tmp_path, "model.onnx") is None


def test_require_current_is_one_line_naming_the_fix(run):
    (run / "checkpoint.pt").write_bytes(b"weights v2")
    with pytest.raises(CheckpointError, match="stale.*run `bnnexport export`"):
        provenance.require_current(run, "model.onnx", ": run `bnnexport export` again")


def test_rewriting_a_source_removes_what_was_derived_from_it(run):
    (run / "thesis.txt").write_text("mine")
    removed = provenance.remove_derived(run, "checkpoint.pt")
    assert sorted(removed) == ["model-arm64.tflite", "model.onnx"]
    assert (run / "checkpoint.pt").exists() and (run / "thesis.txt").exists()
    assert provenance.stale_reason(run, "model-arm64.tflite") is None  # records dropped too
    assert "model.onnx" not in (run / provenance.PROVENANCE).read_text()
