"""bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool: parsing `lce_benchmark_model` output, the
architecture check, the argv."""
# ruff: noqa: E501  (the sample outputs keep benchmark_model's own long lines)

from __future__ import annotations

import numpy as np
import pytest
from bnnexport.deploy.errors import BenchmarkOutputError, WrongArchitectureError
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import (
    benchmark_command,
    check_architecture,
    elf_architecture,
    file_format,
    parse_benchmark_output,
)
from support.recorded_outputs import TAB_OUTPUT
from support.stand_in import elf_header

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


def test_elf_architecture():
    assert elf_architecture(elf_header(0xB7)) == "aarch64"
    assert elf_architecture(elf_header(0x28)) == "arm"
    assert elf_architecture(elf_header(0x3E)) == "x86_64"
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


def test_the_tool_runs_its_default_kernels_unless_the_settings_ask_for_indirect_bgemm():
    """A flatbuffer LCE's default bconv kernel refuses (a grouped LceBconv2d) is benchmarked
    and run for accuracy with `--use_indirect_bgemm=true`; any other with no kernel flag."""
    from bnnexport.deploy.runners import RunSettings
    from bnnexport.deploy.runners.lce_benchmark_model.benchmark_runner import tool_options
    from bnnexport.deploy.runners.lce_benchmark_model.chunked_accuracy import (
        AccuracyJob,
        accuracy_command,
    )

    job = AccuracyJob(None, np.zeros((4, 3, 2, 2), np.float32), 4, 10)
    for asked, flags in ((None, []), (True, ["--use_indirect_bgemm=true"])):
        options = tool_options(RunSettings(use_indirect_bgemm=asked))
        argvs = [
            benchmark_command("t", "m.tflite", use_indirect_bgemm=options.use_indirect_bgemm),
            accuracy_command("t", "m.tflite", "chunk", job, options),
        ]
        assert all([a for a in argv if "bgemm" in a] == flags for argv in argvs)


# LiteRT's benchmark code (the aarch64 build here) prints percentiles on its count lines
LITERT_LINES = """INFO: count=1 curr=109272 p5=109272 median=109272 p95=109272
INFO: count=3 first=52127 curr=47519 min=47519 max=62426 avg=54024 std=6231 p5=47519 median=52127 p95=62426
INFO: Inference timings in us: Init: 80820, First inference: 109272, Warmup (avg): 109272, Inference (avg): 54024
"""  # noqa: E501


def test_a_median_the_tool_prints_is_read_and_none_is_invented_where_it_prints_none():
    result = parse_benchmark_output(LITERT_LINES)
    assert (result.count, result.min_ms, result.mean_ms) == (3, 47.519, 54.024)
    assert result.median_ms == 52.127
    assert parse_benchmark_output(SPACE_OUTPUT).median_ms is None


def test_what_a_tool_is_comes_from_its_first_bytes():
    assert file_format(elf_header(0xB7)) == "ELF aarch64"
    assert file_format(b"#!/usr/bin/env python3\nPK\x03\x04") == "script (#!/usr/bin/env python3)"
    assert file_format(b"\x00\x01") == "unknown"
