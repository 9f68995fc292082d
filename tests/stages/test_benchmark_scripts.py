"""Benchmark scripts refuse bad options before doing any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_retime_of_a_missing_folder_is_refused_in_one_error_line(tmp_path):
    missing = tmp_path / "no-such-run"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "larq_zoo_tf2onnx.py"),
            "--retime",
            str(missing),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [f"larq_zoo_tf2onnx.py: error: --retime: no such folder {missing} "
                      "(a --keep folder of an earlier run)"]  # fmt: skip
    assert result.stdout == "" and sorted(tmp_path.iterdir()) == []


@pytest.mark.slow  # the script imports torch and TensorFlow's neighbours before parsing
def test_int8_latency_retime_of_a_folder_without_its_preparation_is_one_error_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "int8_latency.py"), "--retime", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [f"int8_latency.py: error: --retime: no prepared.json in {tmp_path} "
                      "(a --keep folder of an earlier run)"]  # fmt: skip
    assert result.stdout == "" and sorted(tmp_path.iterdir()) == []
