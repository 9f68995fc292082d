"""What the device tests share: the `lce_benchmark_model` they run (LCE's real aarch64 build when
BNNEXPORT_LCE_BENCHMARK_AARCH64 names it, else the stand-in), `bench` on the emulated device,
and the checks that the device computed what LCE's ARM build computes.

What holds on ARM (docs/LCE_NOTES.md "int8 on ARM"): a float flatbuffer's outputs are the host
LCE's within float rounding; an int8 one's are what ARM's int8 rounding gives (the reference
interpreter with `rounding="arm"`), which may be whole output steps from the host's, and bench
reports those steps. With the stand-in, the int8 check tests the stand-in (it is that
reference)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from support import lce_reference
from support.cli import invoke
from support.stand_in import REAL_BINARY, write_stand_in

FLOAT_TOLERANCE = 1e-4  # relative to the outputs' largest magnitude: float32 summation order


def tool(tmp_path: Path, log: str | None = None) -> str:
    """The tool the device tests run: the real one, else the stand-in (logging each argv to
    `log`, a path on the device, when given); prints which."""
    if REAL_BINARY:
        print(f"\nlce_benchmark_model: the real tool {REAL_BINARY}")
        return REAL_BINARY
    print("\nlce_benchmark_model: the aarch64 Python stand-in (NumPy reference interpreter)")
    return str(write_stand_in(tmp_path / "lce_benchmark_model", log))


def emulated_device_args(arm_device, binary: str) -> list[str]:
    """The `bench` options that run on the `arm_device` fixture's device with `binary`."""
    argv = ["--device", arm_device.destination, "--port", str(arm_device.port), "--ssh-key",
            str(arm_device.key), "--remote-tmp", arm_device.remote_tmp, "--runner",
            "lce_benchmark_model", "--benchmark-binary", binary]  # fmt: skip
    for option in arm_device.options:
        argv += ["--ssh-option", option]
    return argv


def bench_on(run: Path, device: list[str], samples: int, *args: str):
    """`bnnexport bench RUN --json` on the device, 2 timed runs: click's Result."""
    argv = [str(run), "--runs", "2", "--warmup", "1", "--samples", str(samples), *device,
            "--timeout", "1800", "--json", *args]  # fmt: skip
    return invoke("bench", *argv)


def rows_of(result) -> dict[tuple[str, bool], dict]:
    """bench's rows by (name, on the host)."""
    assert result.exit_code == 0, result.output
    return {(b["name"], b["where"] == "host"): b for b in json.loads(result.stdout)["backends"]}


def assert_labelled(row: dict, binary: str) -> None:
    """A device row says which tool made it and that its latency is emulated."""
    made_by = row["extra"]["tool"]
    if REAL_BINARY:
        digest = hashlib.sha256(Path(binary).read_bytes()).hexdigest()
        assert (made_by["format"], made_by["sha256"]) == ("ELF aarch64", digest)
    else:
        assert made_by["format"] == "script (#!/usr/bin/env python3)"
    assert row["extra"]["emulated"].startswith("uname -m says aarch64 but /proc/cpuinfo")


def _run_samples(run: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(run / "samples.npz") as data:
        return data["inputs"][:count], data["labels"][:count]


def assert_float_device_is_the_hosts(rows: dict, run: Path, samples: int) -> None:
    """The float flatbuffer on the device: the host LCE's outputs within float rounding, or
    PyTorch's on every sample. The second holds where a binarization's input lies within float
    rounding of 0 (an initialised model on random inputs): LCE's ARM build applies a bconv's
    output transform as one fused multiply-add, the x86 build rounds twice, and the sign may
    differ (docs/LCE_NOTES.md "int8 on ARM"); the host's gate replayed that tie, the device's
    outputs are then PyTorch's."""
    from bnnexport.converters.runtimes import run_lce

    inputs, _ = _run_samples(run, samples)
    host, device = rows[("lce", True)], rows[("lce", False)]
    versus = rows[("lce vs host lce", False)]
    tolerance = FLOAT_TOLERANCE * max(
        1.0, float(np.abs(run_lce(run / "model-arm64.tflite", inputs)).max())
    )
    assert versus["extra"]["max_steps"] is None  # no int8 output, no steps
    if versus["argmax_agreement"] == 1.0 and versus["max_abs_diff"] <= tolerance:
        assert (device["top1"], device["argmax_agreement"]) == (
            host["top1"],
            host["argmax_agreement"],
        )
        return
    # device vs PyTorch, on every sample
    assert device["argmax_agreement"] == 1.0, (versus, device)
    assert device["max_abs_diff"] <= tolerance, (
        versus["max_abs_diff"],
        device["max_abs_diff"],
        tolerance,
    )


def _arm_outputs(copy: Path, inputs: np.ndarray, batch: int) -> np.ndarray:
    """The batch-N copy run by the reference with ARM's rules, chunk by chunk as the device runs
    it (a constant of the copy may carry its batch: another batch would not broadcast)."""
    from bnnexport.converters.flatbuffer import input_layout, to_input_layout

    model = lce_reference.load(copy, rounding="arm")
    inputs = to_input_layout(inputs, input_layout(copy))  # as bench sends them up
    padded = np.concatenate(
        [inputs, np.zeros((-len(inputs) % batch, *inputs.shape[1:]), inputs.dtype)]
    )
    chunks = [model.run(padded[k : k + batch]) for k in range(0, len(padded), batch)]
    return np.concatenate(chunks)[: len(inputs)]


def assert_int8_device_follows_arm(rows: dict, run: Path, samples: int, batch: int) -> None:
    """The int8 flatbuffer on the device: what LCE's ARM build computes (the reference with
    `rounding="arm"`), no binarization of it reads a dequantized tensor, bench's steps from the
    host are those, and top-1 and argmax move only on samples that differ. Float sums (MEAN)
    add in another order on ARM than in the reference: a value near a tie may then round one
    step the other way, so steps may be one off and a few samples more or fewer may differ."""
    from bnnexport.converters.runtimes import run_lce

    inputs, labels = _run_samples(run, samples)
    copy = run / f"model-arm64-int8-b{batch}.tflite"
    arm = _arm_outputs(copy, inputs, batch)
    x86 = run_lce(run / "model-arm64-int8.tflite", inputs)
    host, device = rows[("lce-int8", True)], rows[("lce-int8", False)]
    versus = rows[("lce-int8 vs host lce-int8", False)]
    step = lce_reference.int8_output_step(copy) if versus["extra"]["output_step"] else None
    # the conversion binarizes every int8 tensor as int8, never ARM's DEQUANTIZE of it
    assert versus["extra"]["binarized_dequantized"] == 0
    slack = max(1, samples // 10)
    agree = float((arm.argmax(1) == x86.argmax(1)).mean())
    assert abs(versus["argmax_agreement"] - agree) <= slack / samples
    if labels.min() >= 0:
        assert abs(device["top1"] - float((arm.argmax(1) == labels).mean())) <= slack / samples
    if step is None:  # a float output (a binary layer after the last int8 one): no steps
        scale = max(1.0, float(np.abs(x86).max()))
        expected = np.abs(arm - x86).max()
        assert versus["max_abs_diff"] == pytest.approx(
            expected, rel=1e-3, abs=FLOAT_TOLERANCE * scale
        )
        return
    steps = np.rint(np.abs(arm.astype(np.float64) - x86) / step).max(axis=1)
    assert versus["extra"]["output_step"] == pytest.approx(step)
    assert abs(versus["extra"]["max_steps"] - int(steps.max())) <= 1
    assert abs(versus["extra"]["samples_differing"] - int((steps > 0).sum())) <= slack
    moved = versus["extra"]["samples_differing"] / samples
    if labels.min() >= 0:
        assert abs(device["top1"] - host["top1"]) <= moved
    assert versus["argmax_agreement"] >= 1 - moved
