#!/usr/bin/env python3
"""Stands in for lce_benchmark_model on the emulated aarch64 device (no LCE binary in a registry).

Honours exactly the flags and file formats bnnexport uses (docs/LCE_NOTES.md "aarch64 device",
deploy/runners/lce_benchmark_model/chunked_accuracy.py):
`--help` lists the flags; `--graph` must exist; `--input_layer_value_files=NAME:PATH` must name
`--input_layer` and hold exactly the bytes of `--input_layer_shape` of the input tensor's type
(else it aborts, as the real tool does); `--output_filepath` gets the raw little-endian outputs.
What it computes: for a real TFLite/LCE flatbuffer, the model itself, by the NumPy reference
interpreter lce_reference.py beside it (which travels with it: support/stand_in.py packs both
into one executable zip), with the ARM build's int8 rounding (requantization ties away from
zero, as the real aarch64 tool computes; docs/LCE_NOTES.md "int8 on ARM"); asked for outputs,
an op that interpreter lacks is one "ERROR: ..." line naming it and exit 1, never a made-up
answer (a latency-only run does not look). For
the tests' JSON graphs ({"classes": C}; 10 classes for any other file) a formula:
out[i, j] = sum_k x[i, k] * cos(0.01 * (k + 1) * (j + 1)), j < C. Its timing, memory and
profile lines are made up, in the tool's format.
Like the real tool with LCE's default kernels, it refuses a flatbuffer holding a grouped
`LceBconv2d` (its packed filter depth below its packed input depth) unless
`--use_indirect_bgemm=true` (or `--use_reference_bconv=true`) is given: the bconv kernel's two
error lines (as LCE 0.16's kernel prints them), TFLite's benchmark's "Failed to allocate
tensors!" and "Benchmarking failed.", exit 1, no timing line (docs/LCE_NOTES.md "Grouped
convolutions"). Runs under the device's python3 with numpy; imports nothing from the project
but lce_reference.py. Tests set LOG (each invocation's argv as a JSON line) and WRITES_OUTPUTS
(False: an LCE <= 0.7 binary, which lacks --output_filepath) in a copy.
"""

import json
import os
import sys

import numpy as np
from lce_reference import UnsupportedOp, is_flatbuffer, load

LOG = None
WRITES_OUTPUTS = True

HELP = """usage: lce_benchmark_model
Flags:
	--graph=	string	graph file
	--num_threads=	int32
	--num_runs=	int32
	--min_secs=	float
	--warmup_runs=	int32
	--warmup_min_secs=	float
	--enable_op_profiling=	bool
	--report_peak_memory_footprint=	bool
	--input_layer=	string
	--input_layer_shape=	string
	--input_layer_value_files=	string
	--output_filepath=	string
	--use_xnnpack=	bool
	--use_reference_bconv=	bool
	--use_indirect_bgemm=	bool
"""
# --- op profiling: the real tool's tables, for the ops of the --graph flatbuffer -------------
# What the real tool prints with --enable_op_profiling=true (shared/data/lce_benchmark_model/):
# an initialisation table, then per op in run order `[OUTPUT TENSOR NAME]:N` (N its index in the
# execution plan) for ops the interpreter runs, `Delegate/<XNNPACK op>:K` for float ops XNNPACK
# takes (K counts within each run of consecutive delegated ops). Times here are made up.
XNNPACK = {  # builtin op code -> the XNNPACK operator the real tool names
    3: "Convolution (NHWC, F32) IGEMM", 4: "Convolution (NHWC, F32) DWCONV",
    9: "Fully Connected (NC, F32) GEMM", 17: "Max Pooling (NHWC, F32)",
    1: "Average Pooling (NHWC, F32)", 22: "Copy (NC, X32)", 39: "Transpose (ND, X32)",
    0: "Add (ND, F32)", 2: "Concatenate (X32)", 34: "Constant Pad (ND, X32)",
}  # fmt: skip
ROW = "\t{:>40}\t{:>9.3f}\t{:>9.3f}\t{:>7.3f}%\t{:>7.3f}%\t{:>10.3f}\t{:>9d}\t{}"
HEAD = "\t{:>40}\t{:>9}\t{:>9}\t{:>8}\t{:>8}\t{:>10}\t{}\t[Name]".format(
    "[node type]", "[first]", "[avg ms]", "[%]", "[cdf%]", "[mem KB]", "[times called]"
)
TYPE_ROW = "\t{:>40}\t{:>9d}\t{:>10.3f}\t{:>10.3f}%\t{:>10.3f}%\t{:>10.3f}\t{:>9d}"
TYPE_HEAD = "\t{:>40}\t{:>9}\t{:>10}\t{:>11}\t{:>11}\t{:>10}\t{}".format(
    "[Node type]", "[count]", "[avg ms]", "[avg %]", "[cdf %]", "[mem KB]", "[times called]"
)


def graph_ops(path):
    """(builtin code or custom name, output tensor name) per op of the main subgraph; [] for a
    file that is not a flatbuffer (the tests' JSON graphs)."""
    if not is_flatbuffer(path):
        return []
    model = load(path)
    return [
        (op.name if op.code is None else op.code, model.tensors[op.outputs[0]].name)
        for op in model.ops
    ]


def grouped_bconvs(path):
    """Execution-plan indices of the LceBconv2d ops whose filter is grouped: its last (packed
    input channel) dimension is smaller than the packed input's, as LCE's kernel decides."""
    if not is_flatbuffer(path):
        return []
    model = load(path)
    return [
        n
        for n, op in enumerate(model.ops)
        if op.name == "LceBconv2d"
        and model.tensors[op.inputs[1]].shape[-1] < model.tensors[op.inputs[0]].shape[-1]
    ]


def input_itemsize(graph):
    """Bytes per element of the input tensor (float32 for a JSON graph)."""
    if not is_flatbuffer(graph):
        return 4
    model = load(graph)
    return np.dtype(model.tensors[model.inputs[0]].dtype).itemsize


def outputs(graph, path, shape):
    """What the tool writes to --output_filepath. A real flatbuffer: the model's first output,
    computed by the reference interpreter (lce_reference.py; exit 1 naming an op it lacks). A
    JSON graph ({"classes": C}): the formula out = x @ cos(0.01 * k * j)."""
    if not is_flatbuffer(graph):
        x = np.fromfile(path, "<f4").reshape(shape[0], -1)
        k = np.arange(1, x.shape[1] + 1)[:, None]
        try:
            classes = json.load(open(graph))["classes"]
        except ValueError:  # neither flatbuffer nor JSON: a 10-class "model"
            classes = 10
        j = np.arange(1, classes + 1)[None, :]
        return (x.astype(np.float64) @ np.cos(0.01 * k * j)).astype("<f4")
    model = load(graph, rounding="arm")  # what LCE's aarch64 build computes, int8 included
    dtype = np.dtype(model.tensors[model.inputs[0]].dtype).newbyteorder("<")
    try:
        return model.run(np.fromfile(path, dtype).reshape(shape))  # checks every op first
    except UnsupportedOp as error:
        sys.exit(f"ERROR: the stand-in's reference interpreter cannot run {graph}: {error}")


def _table(rows, total):
    cdf, lines = 0.0, [HEAD]
    for node_type, avg, name in rows:
        cdf += 100 * avg / total
        lines.append(ROW.format(node_type, avg * 1.1, avg, 100 * avg / total, cdf, 0.0, 1, name))
    return lines


def print_profile(graph, runs):
    rows, k = [], 0
    for n, (code, name) in enumerate(graph_ops(graph)):
        if code in XNNPACK:
            rows.append((XNNPACK[code], 0.01 * (n + 1), f"Delegate/{XNNPACK[code]}:{k}"))
            k += 1
        else:
            rows.append(
                (
                    code if isinstance(code, str) else f"BUILTIN_{code}",
                    0.5 * (n + 1),
                    f"[{name}]:{n}",
                )
            )
            k = 0
    print("INFO: Profiling Info for Benchmark Initialization:")
    print("============================== Run Order ==============================")
    print("\n".join(_table([("AllocateTensors", 1.0, "AllocateTensors/0")], 1.0)))
    print("\nTimings (microseconds): count=1 curr=1000\n\n")
    print("INFO: Operator-wise Profiling Info for Regular Benchmark Runs:")
    total = sum(avg for _, avg, _ in rows) or 1.0
    print("============================== Run Order ==============================")
    print("\n".join(_table(rows, total)))
    print("\n============================== Top by Computation Time ==============================")
    print("\n".join(_table(sorted(rows, key=lambda r: -r[1]), total)))
    print(f"\nNumber of nodes executed: {len(rows)}")
    print("============================== Summary by node type ==============================")
    types = {}
    for node_type, avg, _ in rows:
        count, ms = types.get(node_type, (0, 0.0))
        types[node_type] = (count + 1, ms + avg)
    print(TYPE_HEAD)
    cdf = 0.0
    for node_type, (count, ms) in sorted(types.items(), key=lambda t: -t[1][1]):
        cdf += 100 * ms / total
        print(TYPE_ROW.format(node_type, count, ms, 100 * ms / total, cdf, 0.0, count))
    print(f"\nTimings (microseconds): count={runs} curr={total * 1000:.0f}")
    print(f"Memory (bytes): count=0\n{len(rows)} nodes observed\n\n")


if "--help" in sys.argv:
    print(HELP if WRITES_OUTPUTS else HELP.replace("\t--output_filepath=\tstring\n", ""))
    sys.exit(0)
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
if LOG:
    with open(LOG, "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
if not os.path.isfile(flags.get("graph", "")):
    sys.exit(f"ERROR: Could not open '{flags.get('graph')}'.")
default_kernels = "true" not in (flags.get("use_indirect_bgemm"), flags.get("use_reference_bconv"))
grouped = grouped_bconvs(flags["graph"])
if default_kernels and grouped:
    sys.stderr.write(
        "ERROR: larq_compute_engine/tflite/kernels/bconv2d.cc Grouped binary convolutions are "
        "not supported with this kernel.\n"
        f"ERROR: Node number {grouped[0]} (LceBconv2d) failed to prepare.\n"
        "ERROR: Failed to allocate tensors!\nERROR: Benchmarking failed.\n"
    )
    sys.exit(1)
if "input_layer_value_files" in flags:
    name, path = flags["input_layer_value_files"].split(":", 1)
    shape = [int(d) for d in flags["input_layer_shape"].split(",")]
    assert name == flags["input_layer"], "value file for an unknown layer"
    size = input_itemsize(flags["graph"]) * int(np.prod(shape))
    if os.path.getsize(path) != size:
        sys.stderr.write(
            f"ERROR: file {path} has {os.path.getsize(path)} bytes, the tensor {size}\n"
        )
        sys.stderr.flush()
        os.abort()
    out = outputs(flags["graph"], path, shape)
    if "output_filepath" in flags:
        if WRITES_OUTPUTS:
            np.ascontiguousarray(out).tofile(flags["output_filepath"])
        else:
            sys.stderr.write("WARNING: unconsumed flag --output_filepath\n")
print("count=1 curr=2000(all same)")
print(f"count={flags['num_runs']} first=2100 curr=2000 min=1990 max=2100 avg=2010 std=40")
print("Inference timings in us: Init: 3120, First inference: 2100, Warmup (avg): 2010")
print("Overall peak memory footprint (MB) via periodic monitoring: 4.25")
if flags.get("enable_op_profiling") == "true":
    print_profile(flags["graph"], int(flags["num_runs"]))
