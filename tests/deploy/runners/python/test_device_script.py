"""deploy/runners/python/device_script.py: standalone (stdlib + numpy + LCE only), and what it
measures."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bnnexport.deploy.runners.python import device_script
from bnnexport.deploy.runners.python.python_runner import DEVICE_SCRIPT


def test_device_script_imports_only_stdlib_numpy_and_lce():
    tree = ast.parse(Path(device_script.__file__).read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):  # a relative import names the project too
            modules.add("." * node.level + (node.module or "").split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"numpy", "larq_compute_engine"}
    assert modules <= allowed, modules - allowed


def test_the_python_runner_copies_this_very_file_to_the_device():
    assert DEVICE_SCRIPT == Path(device_script.__file__) and DEVICE_SCRIPT.is_file()


def test_latency_stats():
    stats = device_script.latency_stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert stats == {
        "min": 1.0,
        "median": 3.0,
        "p90": pytest.approx(7.6),
        "mean": 4.0,
        "std": pytest.approx(np.std([1, 2, 3, 4, 10])),
        "runs": 5,
    }


def test_samples_of_the_models_input_shape_go_in_as_they_are():
    nhwc = np.zeros((2, 8, 6, 32), np.float64)
    inputs = device_script.model_inputs(nhwc, [1, 8, 6, 32])
    assert inputs.shape == (2, 8, 6, 32) and inputs.dtype == np.float32


def test_nchw_samples_for_an_nhwc_model_are_refused_not_transposed():
    """The runner sends samples in the layout the flatbuffer declares (`Samples.fed()`): the
    script never guesses one, so a layout gone wrong is one line, not wrong outputs."""
    nchw = np.zeros((2, 32, 8, 6), np.float32)
    with pytest.raises(SystemExit) as refused:
        device_script.model_inputs(nchw, [1, 8, 6, 32])
    assert str(refused.value) == (
        "runner: samples have shape [32, 8, 6] per sample but the model takes [8, 6, 32] "
        "(NCHW samples for an NHWC model? transpose them (0, 2, 3, 1))"
    )


@pytest.mark.slow
def test_device_script_runs_as_a_copied_script(tiny_flatbuffer, tiny_samples, tmp_path):
    """Copied alone into a directory and run with -I (no project on sys.path), as on a device."""
    copy = tmp_path / "device_script.py"
    copy.write_text(Path(device_script.__file__).read_text())
    with np.load(tiny_samples) as data:  # as the python runner sends them: the model's NHWC
        labels = data["labels"]
        np.savez(tmp_path / "nhwc.npz", inputs=data["inputs"].transpose(0, 2, 3, 1), labels=labels)
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(copy),
            "--model",
            str(tiny_flatbuffer),
            "--samples",
            str(tmp_path / "nhwc.npz"),
            "--runs",
            "7",
            "--json",
            "--outputs",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["latency_ms"]["runs"] == 7 and result["accuracy"]["samples"] == 12
    with np.load(tmp_path / "out.npz") as data:
        outputs = data["outputs"]
    assert outputs.shape == (12, 10)
    assert result["accuracy"]["top1"] == pytest.approx(np.mean(outputs.argmax(1) == labels))
