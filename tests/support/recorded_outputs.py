"""Recorded outputs of the real `lce_benchmark_model` that several test files parse: the
shared folder's captures (skipped where it is absent) and a tab-separated run."""
# ruff: noqa: E501  (the sample outputs keep benchmark_model's own long lines)

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the shared folder sits next to the repository (a CI clone may have none)
SHARED = Path(os.environ.get("BNNEXPORT_SHARED", Path(__file__).resolve().parents[3] / "shared"))
REAL = SHARED / "data" / "lce_benchmark_model"
needs_real = pytest.mark.skipif(
    not (REAL / "profile_mnist_bnn.txt").is_file(),
    reason=f"the real tool's recorded output is not at {REAL}",
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
