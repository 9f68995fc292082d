"""Device accuracy with LCE's ARM kernels: the float and int8 flatbuffers of models beyond
mnist-bnn (which tests/deploy/test_bench_aarch64.py benches) on the emulated aarch64 device,
against the host's LCE and PyTorch, each run with the LCE settings its conversion recorded.

`make test` runs a hand-written grouped-conv model of one's own (tests/support/own_models.py
`grouped_bnn`: ±1 `nn.Parameter` kernels in two groups of 32 channels through a custom STE,
written as one LceBconv2d per group); the long tier the hand-written BNN, BinaryNet@32,
QuickNet-Small@64 and Bi-Real-Net-18@64, as `bnnexport init` makes them (seeded random inputs,
no labels: agreement, not accuracy). The checks are support/device_runs.py's: the float
flatbuffer computes the host LCE's outputs; the int8 one what ARM's int8 rounding computes,
which bench reports in output steps from the host's. The table of docs/BENCHMARKS.md "Device
accuracy" is benchmarks/device_accuracy.py's, on more samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.device_runs import (
    assert_float_device_is_the_hosts,
    assert_int8_device_follows_arm,
    assert_labelled,
    bench_on,
    emulated_device_args,
    rows_of,
    tool,
)

SAMPLES = 16
BATCH = 8  # two chunks on the device


def _prepared(folder: Path, model: str, shape: tuple[int, int, int]) -> Path:
    """`model` initialised, exported on SAMPLES samples, converted float and int8 with their
    batch-BATCH copies."""
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.init import init_run

    run = folder / "run"
    init_run(model, input_shape=shape, out=run)
    export_onnx(run, samples=SAMPLES)
    convert_run(run, target="arm64", batched_copy=BATCH)
    convert_run(run, target="arm64", float_layers="int8", batched_copy=BATCH,
                max_accuracy_drop=None)  # fmt: skip
    return run


def _bench_both(run: Path, arm_device, tmp_path: Path) -> dict:
    binary = tool(tmp_path)
    device = emulated_device_args(arm_device, binary)
    rows = rows_of(bench_on(run, device, SAMPLES, "--device-batch", str(BATCH)))
    for name in ("lce", "lce-int8"):
        assert_labelled(rows[(name, False)], binary)
        settings = json.loads((run / ("convert.json" if name == "lce" else "convert-int8.json"))
                              .read_text())["lce_settings"]  # fmt: skip
        assert rows[(name, False)]["extra"]["lce_settings"] == settings
    assert arm_device.leftovers() == []
    return rows


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory) -> Path:
    return _prepared(tmp_path_factory.mktemp("grouped"), "support.own_models:grouped_bnn",
                     (1, 28, 28))  # fmt: skip


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_grouped_model_of_ones_own_computes_on_the_device_what_lces_arm_build_does(
    grouped_run, arm_device, tmp_path
):
    rows = _bench_both(grouped_run, arm_device, tmp_path)
    assert json.loads((grouped_run / "convert.json").read_text())["lce_bconv2d"] == 2
    assert_float_device_is_the_hosts(rows, grouped_run, SAMPLES)
    assert_int8_device_follows_arm(rows, grouped_run, SAMPLES, BATCH)


# the binarizations of an int8 tensor a residual ADD reads too, which LCE's converter leaves on
# its DEQUANTIZE: QuickNet-Small's stem and three transition convs, Bi-Real-Net-18's stem
REWIRED = {"quicknet-small": 4, "birealnet18": 1}


@pytest.mark.long  # each model converted float and int8, then run under qemu: minutes
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "model, shape",
    [("support.handwritten_bnn:hand_written_bnn", (1, 28, 28)), ("binarynet", (3, 32, 32)),
     ("quicknet-small", (3, 64, 64)), ("birealnet18", (3, 64, 64))],
)  # fmt: skip
def test_the_models_compute_on_the_device_what_lces_arm_build_does(
    model, shape, arm_device, tmp_path
):
    run = _prepared(tmp_path, model, shape)
    census = json.loads((run / "convert-int8.json").read_text())["int8"]
    assert census["binarizations_rewired_to_int8"] == REWIRED.get(model, 0)
    rows = _bench_both(run, arm_device, tmp_path)
    assert_float_device_is_the_hosts(rows, run, SAMPLES)
    assert_int8_device_follows_arm(rows, run, SAMPLES, BATCH)
