"""deploy.lce_benchmark: parsing `lce_benchmark_model` output, the architecture check, the argv."""
# ruff: noqa: E501  (the sample outputs keep benchmark_model's own long lines)

from __future__ import annotations

import pytest

from deploy.errors import BenchmarkOutputError, WrongArchitectureError
from deploy.lce_benchmark import (
    benchmark_command,
    check_architecture,
    elf_architecture,
    parse_benchmark_output,
)

# The layout of TFLite's benchmark_model (tab-separated tables with a [start] column), with the
# initialisation tables first: their rows must not be taken for the inference ops.
TAB_OUTPUT = """\
STARTING!
Log parameter values verbosely: [0]
Num threads: [1]
Graph: [/tmp/bnnexport.x/model-arm64.tflite]
Enable op profiling: [1]
Loaded model /tmp/bnnexport.x/model-arm64.tflite
The input model file size (MB): 0.151
Initialized session in 5.685ms.
Running benchmark for at least 10 iterations and at least 0 seconds but terminate if exceeding 600 seconds.
count=10 first=18525 curr=14390 min=14312 max=18525 avg=14461.3 std=1240

Running benchmark for at least 50 iterations and at least 0 seconds but terminate if exceeding 600 seconds.
count=50 first=16042 curr=15211 min=15002 max=16310 avg=15408.2 std=245

Inference timings in us: Init: 5685, First inference: 18525, Warmup (avg): 14461.3, Inference (avg): 14154.5
Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to the actual memory footprint of the model at runtime. Take the information at your discretion.
Memory footprint delta from the start of the tool (MB): init=3.1 overall=9.3
Overall peak memory footprint (MB) via periodic monitoring: 9.8
Profiling Info for Benchmark Initialization:
============================== Run Order ==============================
\t             [node type]\t          [start]\t  [first]\t [avg ms]\t     [%]\t  [cdf%]\t  [mem KB]\t[times called]\t[Name]
\t         AllocateTensors\t            0.000\t    1.356\t    1.356\t100.000%\t100.000%\t     0.000\t        1\tAllocateTensors/0

============================== Top by Computation Time ==============================
\t             [node type]\t          [start]\t  [first]\t [avg ms]\t     [%]\t  [cdf%]\t  [mem KB]\t[times called]\t[Name]
\t         AllocateTensors\t            0.000\t    1.356\t    1.356\t100.000%\t100.000%\t     0.000\t        1\tAllocateTensors/0

Number of nodes executed: 1
============================== Summary by node type ==============================
\t             [Node type]\t  [count]\t  [avg ms]\t    [avg %]\t    [cdf %]\t  [mem KB]\t[times called]
\t         AllocateTensors\t        1\t     1.356\t   100.000%\t   100.000%\t     0.000\t        1

Timings (microseconds): count=1 curr=1356
Memory (bytes): count=0
1 nodes observed

Operator-wise Profiling Info for Regular Benchmark Runs:
============================== Run Order ==============================
\t             [node type]\t          [start]\t  [first]\t [avg ms]\t     [%]\t  [cdf%]\t  [mem KB]\t[times called]\t[Name]
\t             LceQuantize\t            0.000\t    0.210\t    0.180\t  1.200%\t  1.200%\t     0.000\t        1\t[model/quantize]:0
\t              LceBconv2d\t            0.181\t   12.400\t   11.900\t 79.300%\t 80.500%\t     0.000\t        1\t[model/bconv_1]:1
\t          LceBMaxPool2d\t           12.082\t    0.350\t    0.320\t  2.133%\t 82.633%\t     0.000\t        1\t[model/pool]:2
\t         FULLY_CONNECTED\t           12.402\t    2.700\t    2.600\t 17.333%\t 99.966%\t     0.000\t        1\t[model/dense/MatMul;model/dense/BiasAdd]:3
\t                 SOFTMAX\t           15.003\t    0.006\t    0.005\t  0.034%\t100.000%\t     0.000\t        1\t[Identity]:4

============================== Top by Computation Time ==============================
\t             [node type]\t          [start]\t  [first]\t [avg ms]\t     [%]\t  [cdf%]\t  [mem KB]\t[times called]\t[Name]
\t              LceBconv2d\t            0.181\t   12.400\t   11.900\t 79.300%\t 79.300%\t     0.000\t        1\t[model/bconv_1]:1
\t         FULLY_CONNECTED\t           12.402\t    2.700\t    2.600\t 17.333%\t 96.633%\t     0.000\t        1\t[model/dense/MatMul;model/dense/BiasAdd]:3

Number of nodes executed: 5
============================== Summary by node type ==============================
\t             [Node type]\t  [count]\t  [avg ms]\t    [avg %]\t    [cdf %]\t  [mem KB]\t[times called]
\t              LceBconv2d\t        1\t    11.900\t    79.333%\t    79.333%\t     0.000\t        1
\t         FULLY_CONNECTED\t        1\t     2.600\t    17.333%\t    96.667%\t     0.000\t        1
\t           LceBMaxPool2d\t        1\t     0.320\t     2.133%\t    98.800%\t     0.000\t        1
\t             LceQuantize\t        1\t     0.180\t     1.200%\t   100.000%\t     0.000\t        1

Timings (microseconds): count=50 first=15666 curr=15001 min=14990 max=16290 avg=15005 std=240
Memory (bytes): count=0
5 nodes observed
"""

# Newer TFLite: "INFO: " log prefixes, space-aligned tables, no [start] column, op names with
# spaces (delegate kernels).
SPACE_OUTPUT = """\
INFO: count=5 first=2100 curr=2000 min=1990 max=2100 avg=2010 std=40
INFO: count=100 first=2001 curr=1995 min=1950 max=2300 avg=1999.5 std=31
INFO: Inference timings in us: Init: 3120, First inference: 2100, Warmup (avg): 2010, Inference (avg): 1999.5
INFO: Overall peak memory footprint (MB) via periodic monitoring: 4.25
INFO: Operator-wise Profiling Info for Regular Benchmark Runs:
============================== Run Order ==============================
                     [node type]          [first]        [avg ms]            [%]          [cdf%]          [mem KB]        [times called]  [Name]
                     LceQuantize            0.031           0.030         1.500%          1.500%             0.000                1       [quantize]:0
   Convolution (NHWC, F32) IGEMM            0.900           0.880        44.000%         45.500%             0.000                2       Delegate/Convolution (NHWC, F32) IGEMM:1

Number of nodes executed: 2
============================== Summary by node type ==============================
                     [Node type]          [count]         [avg ms]          [avg %]         [cdf %]       [mem KB]        [times called]
   Convolution (NHWC, F32) IGEMM                1            1.760          98.324%         98.324%          0.000                2
                     LceQuantize                1            0.030           1.676%        100.000%          0.000                1

Timings (microseconds): count=100 curr=1790
"""


def test_latency_comes_from_the_regular_runs_in_ms():
    result = parse_benchmark_output(TAB_OUTPUT)
    assert result.count == 50
    assert (result.min_ms, result.max_ms) == (15.002, 16.31)
    assert result.mean_ms == pytest.approx(15.4082)
    assert result.std_ms == pytest.approx(0.245)


def test_summary_timings_and_peak_memory():
    result = parse_benchmark_output(TAB_OUTPUT)
    assert result.init_ms == pytest.approx(5.685)
    assert result.first_inference_ms == pytest.approx(18.525)
    assert result.warmup_avg_ms == pytest.approx(14.4613)
    assert result.peak_memory_mb == 9.8


def test_run_order_gives_per_op_times_and_skips_initialisation():
    result = parse_benchmark_output(TAB_OUTPUT)
    assert [op.node_type for op in result.ops] == [
        "LceQuantize",
        "LceBconv2d",
        "LceBMaxPool2d",
        "FULLY_CONNECTED",
        "SOFTMAX",
    ]
    bconv = result.ops[1]
    assert (bconv.name, bconv.first_ms, bconv.avg_ms, bconv.percent) == (
        "[model/bconv_1]:1",
        12.4,
        11.9,
        79.3,
    )
    assert result.ops[3].name == "[model/dense/MatMul;model/dense/BiasAdd]:3"
    assert result.nodes_executed == 5


def test_summary_by_node_type():
    result = parse_benchmark_output(TAB_OUTPUT)
    by_type = {row.node_type: row for row in result.op_types}
    assert set(by_type) == {"LceBconv2d", "FULLY_CONNECTED", "LceBMaxPool2d", "LceQuantize"}
    assert by_type["LceBconv2d"].avg_ms == 11.9 and by_type["LceBconv2d"].percent == 79.333
    assert by_type["FULLY_CONNECTED"].cdf_percent == 96.667


def test_space_aligned_tables_with_log_prefixes():
    result = parse_benchmark_output(SPACE_OUTPUT)
    assert result.count == 100 and result.mean_ms == pytest.approx(1.9995)
    assert result.peak_memory_mb == 4.25
    assert [(op.node_type, op.times_called) for op in result.ops] == [
        ("LceQuantize", 1),
        ("Convolution (NHWC, F32) IGEMM", 2),
    ]
    assert result.ops[1].name == "Delegate/Convolution (NHWC, F32) IGEMM:1"
    assert result.op_types[0].avg_ms == 1.76 and result.nodes_executed == 2


def test_all_same_timings():
    result = parse_benchmark_output("count=3 curr=1500(all same)\n")
    assert (result.min_ms, result.max_ms, result.mean_ms, result.std_ms) == (1.5, 1.5, 1.5, 0.0)


def test_output_without_timing_line_is_an_error_naming_the_last_line():
    text = "STARTING!\nERROR: Didn't find op for builtin opcode 'LceBconv2d'\n"
    with pytest.raises(BenchmarkOutputError, match="Didn't find op") as info:
        parse_benchmark_output(text)
    assert info.value.exit_code == 2


def _elf_header(machine: int) -> bytes:
    return b"\x7fELF\x02\x01\x01" + bytes(11) + machine.to_bytes(2, "little")


def test_elf_architecture():
    assert elf_architecture(_elf_header(0xB7)) == "aarch64"
    assert elf_architecture(_elf_header(0x28)) == "arm"
    assert elf_architecture(_elf_header(0x3E)) == "x86_64"
    assert elf_architecture(b"#!/bin/sh\necho hello\n") is None


def test_check_architecture():
    check_architecture("b", "aarch64", "aarch64")
    check_architecture("b", "arm", "armv7l")
    with pytest.raises(WrongArchitectureError, match="built for aarch64 but the device is x86_64"):
        check_architecture("b", "aarch64", "x86_64")


def test_benchmark_command_runs_exactly_n_times_with_profiling():
    argv = benchmark_command("lce_benchmark_model", "m.tflite", threads=4, runs=30)
    assert argv[0] == "lce_benchmark_model"
    for flag in (
        "--graph=m.tflite",
        "--num_threads=4",
        "--num_runs=30",
        "--min_secs=0",
        "--enable_op_profiling=true",
        "--report_peak_memory_footprint=true",
    ):
        assert flag in argv
