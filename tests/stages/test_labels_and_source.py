"""The model's labels and source travel with it: an image folder's class names, in the order of
the model's outputs, are in config.json, the checkpoint, samples.npz, convert.json and the
flatbuffer's metadata (which LCE's interpreter still runs and an app reads back); export refuses
a folder whose classes changed since training; a `--model module:fn` run records its source
file's path and hash, and a later stage warns in one line when the file changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bnnexport.converters.flatbuffer import metadata
from bnnexport.converters.runtimes import run_lce, run_onnx
from support.cli import COMMAND, run_in_process
from support.guarantees import assert_one_line_error
from support.image_folders import tiny_training

from bnnexport.run.checkpoint import load_checkpoint

CLASSES = ["cat", "dog", "emu"]  # support.image_folders.write_image_folder's


def _ok(*args) -> str:
    result = run_in_process(*map(str, args))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """mnist-bnn trained 1 epoch on a 3-class image folder, exported (the folder, the run)."""
    root = tmp_path_factory.mktemp("labels")
    options = tiny_training(root)
    run = root / "run"
    _ok("train", *options, "--epochs", "1", "--out", run)
    _ok("export", run, "--samples", 12)
    return root, run


def test_the_run_records_the_class_names_in_index_order(folder_run):
    _root, run = folder_run
    assert json.loads((run / "config.json").read_text())["class_names"] == CLASSES
    assert load_checkpoint(run / "checkpoint.pt")["class_names"] == CLASSES
    with np.load(run / "samples.npz", allow_pickle=False) as samples:
        assert samples["class_names"].tolist() == CLASSES


@pytest.mark.slow
def test_convert_writes_them_into_the_report_and_the_flatbuffers_metadata(folder_run):
    _root, run = folder_run
    _ok("convert", run)
    assert json.loads((run / "convert.json").read_text())["class_names"] == CLASSES
    flatbuffer = run / "model-arm64.tflite"
    assert json.loads(metadata(flatbuffer)["class_names"]) == CLASSES  # what an app reads
    with np.load(run / "samples.npz") as samples:
        inputs = samples["inputs"]
    lce, onnx = run_lce(flatbuffer, inputs), run_onnx(str(run / "model.onnx"), inputs)
    assert np.array_equal(lce.argmax(1), onnx.argmax(1))  # LCE runs the file it was given


def test_export_refuses_a_folder_whose_classes_changed_since_training(folder_run, tmp_path):
    root, run = folder_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    added = [root / split / "fox" for split in ("train", "val")]
    try:
        for fox in added:
            shutil.copytree(fox.parent / "emu", fox)
        result = run_in_process("export", copy)
    finally:
        for fox in added:
            shutil.rmtree(fox, ignore_errors=True)
    assert_one_line_error(result, 2, "now has the classes ['cat', 'dog', 'emu', 'fox']",
                          "trained on ['cat', 'dog', 'emu']")  # fmt: skip


MODULE = """
def make(num_classes=10, input_shape=(1, 28, 28)):
    from support.handwritten_bnn import HandWrittenBNN

    return HandWrittenBNN(num_classes=num_classes, input_shape=tuple(input_shape))
"""


@pytest.fixture
def own_source_run(tmp_path, monkeypatch):
    """A run of `--model own_source_NAME:make`, a module file of the user's in the current
    directory; (the run, the module file)."""
    monkeypatch.chdir(tmp_path)
    source = tmp_path / f"own_source_{tmp_path.name.replace('-', '_')}.py"
    source.write_text(MODULE)
    run = tmp_path / "run"
    _ok("train", "--model", f"{source.stem}:make", *tiny_training(tmp_path), "--epochs", "1",
        "--init-sign", "--out", run)  # fmt: skip
    return run, source


def _source_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "the model's source" in line]


def test_train_records_the_models_source_file_and_its_hash(own_source_run):
    import hashlib

    run, source = own_source_run
    recorded = json.loads((run / "config.json").read_text())["model_source"]
    expected = {"path": str(source), "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    assert recorded == expected == load_checkpoint(run / "checkpoint.pt")["model_source"]
    assert _source_warnings(_ok("export", run, "--samples", 12)) == []  # unchanged: silent


@pytest.mark.slow
def test_a_later_stage_warns_in_one_line_when_the_source_changed(own_source_run):
    """export in a process of its own (pytest would catch the warning before it is printed),
    summary in this one."""
    run, source = own_source_run
    source.write_text(MODULE.replace("return HandWrittenBNN", "return  HandWrittenBNN"))
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    result = subprocess.run([*COMMAND, "export", str(run)], capture_output=True, text=True,
                            env=env, cwd=source.parent, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = _source_warnings(result.stderr)
    assert len(said) == 1 and said[0].startswith("bnnexport: warning: the model's source ")
    assert f"{source} changed since the run recorded it" in said[0]
    with pytest.warns(UserWarning, match="changed since the run recorded it"):
        _ok("summary", run)
