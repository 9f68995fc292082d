"""The device's op profile by PyTorch layer (bnnexport.stages.bench.profile), and the real tool's
output.

`../shared/data/lce_benchmark_model/` holds what the real `lce_benchmark_model` (LCE 0.16.0,
aarch64, under emulation) printed on the demo's mnist-bnn flatbuffer; the tests that read it
skip, saying why, where that folder is absent."""

from __future__ import annotations

import dataclasses

import pytest
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import parse_benchmark_output
from support.recorded_outputs import REAL, needs_real

from bnnexport.stages.bench.profile import DeviceProfile, LayerTime, row_node, row_ops

# the demo's mnist-bnn flatbuffer, op by op (what the recorded profile ran)
MNIST_OPS = ["RESHAPE", "CONV_2D", "LceQuantize", "LceBconv2d", "LceBMaxPool2d", "LceBconv2d",
             "MAX_POOL_2D", "RESHAPE", "LceQuantize", "LceBconv2d", "FULLY_CONNECTED"]  # fmt: skip


@needs_real
def test_the_real_profile_parses_row_by_row():
    result = parse_benchmark_output((REAL / "profile_mnist_bnn.txt").read_text())
    assert result.nodes_executed == len(result.ops) == 11
    assert result.mean_ms == pytest.approx(13.3675) and result.peak_memory_mb == 5.89062
    # the regular runs' table, not the initialisation one (ModifyGraphWithDelegate)
    assert [o.node_type for o in result.ops].count("LceBconv2d") == 3
    assert "ModifyGraphWithDelegate" not in [o.node_type for o in result.ops]
    assert sum(o.percent for o in result.ops) == pytest.approx(100, abs=0.01)
    assert [t.node_type for t in result.op_types][0] == "LceBconv2d"
    rows = [dataclasses.asdict(o) for o in result.ops]
    indices, notes = row_ops(rows, MNIST_OPS)
    assert indices == list(range(11)) and notes == []
    for row, index in zip(rows, indices, strict=True):
        lce = row["node_type"].startswith("Lce")
        assert lce == MNIST_OPS[index].startswith("Lce"), (row, index)


@needs_real
def test_the_real_latency_run_has_no_profile():
    result = parse_benchmark_output((REAL / "latency_mnist_bnn.txt").read_text())
    assert result.ops == [] and result.nodes_executed is None
    assert result.mean_ms == pytest.approx(13.1727)


def test_rows_are_matched_by_node_index_and_delegate_partition():
    assert row_node("[a;b;Const_9;C]:9") == 9
    assert row_node("Delegate/Copy (NC, X32):1") is None
    rows = [{"name": n} for n in ("Delegate/A:0", "Delegate/B:1", "[q]:2", "Delegate/C:0")]
    assert row_ops(rows, ["X", "Y", "LceQuantize", "Z"]) == ([0, 1, 2, 3], [])


def test_a_delegate_partition_of_another_size_is_matched_by_position_with_a_note():
    rows = [{"name": n} for n in ("Delegate/A:0", "Delegate/B:1", "Delegate/C:2", "[q]:2")]
    indices, notes = row_ops(rows, ["X", "Y", "LceQuantize"])
    assert indices == [0, 1, 1, 2] and len(notes) == 1 and "by position" in notes[0]
    # rows that fit no op at all stay unmatched, no crash
    assert row_ops([{"name": "[x]:7"}, {"name": "garbage"}], ["X"]) == ([7, None], [])


def test_the_summary_is_one_line_with_binary_and_float_shares():
    layers = [LayerTime("features.2", 7.6, 0.6, ["LceBconv2d"], True, [3]),
              LayerTime("features.0", 2.0, 0.3, ["Convolution"], False, [1]),
              LayerTime("classifier.3", 1.0, 0.1, ["Fully Connected"], False, [10])]  # fmt: skip
    line = DeviceProfile(layers, 10.6).summary()
    assert "\n" not in line
    assert line.startswith("device profile: binary layers 60 % of device time, float layers 40 %")
    assert "features.2 60 %" in line
    assert DeviceProfile([], 0.0).summary() == "device profile: no op rows to attribute"
