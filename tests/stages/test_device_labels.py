"""What bench's table says about a device row besides its numbers: which tool made it, that its
latency is emulated where the device runs under qemu-user, and how many int8 output steps an int8
flatbuffer's outputs are from the host's (docs/LCE_NOTES.md "int8 on ARM")."""

from __future__ import annotations

from bnnexport.stages.bench.device import int8_note
from bnnexport.stages.bench.measure import device_footer
from bnnexport.stages.bench.scoring import BackendResult

EMULATED = "uname -m says aarch64 but /proc/cpuinfo describes an x86 CPU (AMD EPYC): ..."
TOOL = {"label": "lce_benchmark_model: ELF aarch64, sha256 415e454c4af8", "format": "ELF aarch64"}


def _row(name: str, **extra) -> BackendResult:
    return BackendResult(name, "root@127.0.0.1", None, None, 40, 0.9, None, 1.0, 0.0, {}, extra)


def test_the_table_names_the_tool_and_says_the_latencies_are_emulated():
    device = {"destination": "root@127.0.0.1", "uname": "Linux vm aarch64", "emulated": EMULATED}
    lines = device_footer(device, [_row("lce", tool=TOOL), _row("lce (2 threads)", tool=TOOL)])
    assert lines == [
        "device: root@127.0.0.1: Linux vm aarch64",
        "device tool: lce_benchmark_model: ELF aarch64, sha256 415e454c4af8",
        f"device latencies are emulated, not ARM timings: {EMULATED}",
    ]


def test_a_device_nothing_says_is_emulated_gets_no_such_line():
    device = {"destination": "pi@raspberrypi", "uname": "Linux pi aarch64", "emulated": None}
    assert device_footer(device, [_row("lce", tool=TOOL)])[-1].startswith("device tool:")
    assert device_footer(None, [_row("lce")]) == []


def test_int8_outputs_whole_steps_from_the_host_are_said_to_be_rounding_in_one_line():
    versus = {"max_steps": 3, "output_step": 0.0442, "samples_differing": 5}
    row = _row("lce-int8 vs host lce-int8", **versus)
    device = {"destination": "root@127.0.0.1", "uname": "Linux vm aarch64"}
    assert device_footer(device, [row])[-1] == (
        "lce-int8 vs host lce-int8: up to 3 int8 output step(s) apart on 5 of 40 samples "
        '(how LCE\'s ARM build computes int8: docs/LCE_NOTES.md "int8 on ARM")'
    )
    note = int8_note("lce-int8", versus)
    assert "\n" not in note and "up to 3 int8 output step(s) of 0.0442" in note
    assert "on 5 sample(s): LCE's ARM build computes int8 so" in note
    assert "not a fault of the flatbuffer" in note and "dequantized" not in note
    # a binarization of a dequantized tensor is named: its signs may differ on ARM
    dequantized = int8_note("lce-int8", {**versus, "binarized_dequantized": 2})
    assert "2 binarization(s) here read a dequantized tensor" in dequantized
    # a float flatbuffer's row has no steps: no line
    assert device_footer(device, [_row("lce vs host lce", max_steps=None)]) == [
        "device: root@127.0.0.1: Linux vm aarch64"
    ]
