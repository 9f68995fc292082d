"""The stand-in for `lce_benchmark_model` (lce_benchmark_model_standin.py beside this file):
a configured copy to install on a device (one executable zip holding the stand-in and the
reference interpreter it runs real flatbuffers with, lce_reference.py), and what it computes
for the tests' JSON graphs, written independently of it; and the ELF header a binary built for
another architecture starts with."""

from __future__ import annotations

import os
import tempfile
import zipapp
from pathlib import Path

import numpy as np

REAL_BINARY = os.environ.get("BNNEXPORT_LCE_BENCHMARK_AARCH64")
AARCH64 = 0xB7  # ELF e_machine of aarch64: what the release asset lce_benchmark_model_aarch64 has

STAND_IN_FILE = Path(__file__).with_name("lce_benchmark_model_standin.py")
REFERENCE_FILE = Path(__file__).with_name("lce_reference.py")


def write_stand_in(path: Path, log: str | None, writes_outputs: bool = True) -> Path:
    """A copy of the stand-in with its LOG and WRITES_OUTPUTS set: one file, as bench uploads
    one binary, run by `python3 FILE` or directly (`#!/usr/bin/env python3`), an executable zip
    (zipapp) of the stand-in as __main__.py and lce_reference.py beside it."""
    text = STAND_IN_FILE.read_text()
    assert "\nLOG = None\n" in text and "\nWRITES_OUTPUTS = True\n" in text
    text = text.replace("\nLOG = None\n", f"\nLOG = {log!r}\n")
    text = text.replace("\nWRITES_OUTPUTS = True\n", f"\nWRITES_OUTPUTS = {writes_outputs}\n")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "__main__.py").write_text(text)
        (Path(folder) / REFERENCE_FILE.name).write_text(REFERENCE_FILE.read_text())
        zipapp.create_archive(folder, path, interpreter="/usr/bin/env python3")
    path.chmod(0o755)
    return path


def stand_in_outputs(inputs: np.ndarray, classes: int) -> np.ndarray:
    """What the stand-in computes for a JSON graph ({"classes": C}), written independently of
    it (a real flatbuffer it runs with lce_reference instead)."""
    flat = inputs.reshape(len(inputs), -1).astype(np.float64)
    weights = np.cos(0.01 * np.outer(np.arange(1, flat.shape[1] + 1), np.arange(1, classes + 1)))
    return (flat @ weights).astype(np.float32)


def elf_header(machine: int) -> bytes:
    """The first 20 bytes of a 64-bit little-endian ELF file built for `machine` (e_machine)."""
    return b"\x7fELF\x02\x01\x01" + bytes(11) + machine.to_bytes(2, "little")
