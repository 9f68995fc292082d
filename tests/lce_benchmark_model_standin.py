#!/usr/bin/env python3
"""Stands in for lce_benchmark_model on the emulated aarch64 device (no LCE binary in a registry).

Honours exactly the flags and file formats bnnexport uses (docs/LCE_NOTES.md §7,
deploy/device_accuracy.py):
`--help` lists the flags; `--graph` must exist; `--input_layer_value_files=NAME:PATH` must name
`--input_layer` and hold exactly the bytes of `--input_layer_shape` float32 (else it aborts, as the
real tool does); `--output_filepath` gets the raw little-endian float32 outputs. Its "model":
out[i, j] = sum_k x[i, k] * cos(0.01 * (k + 1) * (j + 1)), with j < C, C from a JSON graph file
({"classes": C}) and 10 for any other file (a real flatbuffer). It prints timing lines in the
tool's format. Runs under the device's python3 with numpy; imports nothing from the project.
Tests set LOG (each invocation's argv as a JSON line) and WRITES_OUTPUTS (False: an LCE <= 0.7
binary, which lacks --output_filepath) in a copy.
"""

import json
import os
import sys

import numpy as np

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
"""
if "--help" in sys.argv:
    print(HELP if WRITES_OUTPUTS else HELP.replace("\t--output_filepath=\tstring\n", ""))
    sys.exit(0)
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
if LOG:
    with open(LOG, "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
if not os.path.isfile(flags.get("graph", "")):
    sys.exit(f"ERROR: Could not open '{flags.get('graph')}'.")
if "input_layer_value_files" in flags:
    name, path = flags["input_layer_value_files"].split(":", 1)
    shape = [int(d) for d in flags["input_layer_shape"].split(",")]
    assert name == flags["input_layer"], "value file for an unknown layer"
    size = 4 * int(np.prod(shape))
    if os.path.getsize(path) != size:
        sys.stderr.write(
            f"ERROR: file {path} has {os.path.getsize(path)} bytes, the tensor {size}\n"
        )
        sys.stderr.flush()
        os.abort()
    x = np.fromfile(path, "<f4").reshape(shape[0], -1)
    try:
        classes = json.load(open(flags["graph"]))["classes"]
    except ValueError:  # a real flatbuffer (bench end to end): a 10-class model
        classes = 10
    k = np.arange(1, x.shape[1] + 1)[:, None]
    j = np.arange(1, classes + 1)[None, :]
    out = (x.astype(np.float64) @ np.cos(0.01 * k * j)).astype("<f4")
    if "output_filepath" in flags:
        if WRITES_OUTPUTS:
            out.tofile(flags["output_filepath"])
        else:
            sys.stderr.write("WARNING: unconsumed flag --output_filepath\n")
print("count=1 curr=2000(all same)")
print(f"count={flags['num_runs']} first=2100 curr=2000 min=1990 max=2100 avg=2010 std=40")
print("Inference timings in us: Init: 3120, First inference: 2100, Warmup (avg): 2010")
print("Overall peak memory footprint (MB) via periodic monitoring: 4.25")
