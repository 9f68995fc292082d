#!/usr/bin/env python3
"""The python runner's device script: latency and accuracy of an LCE flatbuffer with LCE's Python
interpreter.

Standalone on purpose: it is copied to the device and run there, so it imports only the standard
library, numpy and larq_compute_engine. Inputs in the samples file (`inputs`, float32, with int64
`labels`) are in the flatbuffer's own input layout, as the python runner sends them
(`Samples.fed()`: NHWC for a flatbuffer that declares so, bnnexport's default): the script feeds
them as they are and refuses, in one line, samples of another shape; it never guesses a layout.

Example (on the device):
    python3 device_script.py --model model-arm64.tflite --samples samples.npz --runs 100 \
        --threads 1 --json --outputs outputs.npz
    {"runtime": "lce-python", "latency_ms": {"min": 1.2, "median": 1.3, ...}, "accuracy": ...}
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np


def percentile(values: list, q: float) -> float:
    """Linear-interpolated percentile `q` (0-100) of `values`, like numpy's default."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def latency_stats(times_ms: list) -> dict:
    """min / median / p90 / mean / std (population) of per-run times in ms."""
    return {
        "min": float(min(times_ms)),
        "median": float(statistics.median(times_ms)),
        "p90": percentile(times_ms, 90),
        "mean": float(statistics.fmean(times_ms)),
        "std": float(statistics.pstdev(times_ms)),
        "runs": len(times_ms),
    }


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float | None:
    """Fraction of samples whose label is among the k largest logits; None when any label is
    negative (the random samples of an untrained `init` run have no ground truth)."""
    if (np.asarray(labels) < 0).any():
        return None
    top = np.argsort(-logits.reshape(len(logits), -1), axis=1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=1)))


def load_interpreter(model_path: str, threads: int):
    """LCE's interpreter with indirect BGEMM (the fastest kernels on x86, docs/LCE_NOTES.md "Running
    flatbuffers")."""
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    with open(model_path, "rb") as handle:
        flatbuffer = handle.read()
    return Interpreter(flatbuffer, num_threads=threads, use_indirect_bgemm=True)


def model_inputs(batch: np.ndarray, model_shape: list) -> np.ndarray:
    """Samples of exactly the model's input shape per sample, as float32; SystemExit (one line)
    otherwise: NCHW samples for an NHWC model are refused, not transposed here."""
    batch = np.ascontiguousarray(batch, dtype=np.float32)
    if list(batch.shape[1:]) == list(model_shape[1:]):
        return batch
    nhwc = " (NCHW samples for an NHWC model? transpose them (0, 2, 3, 1))" * (batch.ndim == 4)
    raise SystemExit(
        f"runner: samples have shape {list(batch.shape[1:])} per sample but "
        f"the model takes {list(model_shape[1:])}{nhwc}"
    )


def run(model: str, samples: str | None, runs: int, threads: int, warmup: int) -> tuple:
    """Measure batch-1 latency after warm-up and, with samples, the outputs on every sample."""
    interpreter = load_interpreter(model, threads)
    shape = [int(d) for d in interpreter.input_shapes[0]]
    inputs = labels = None
    if samples:
        with np.load(samples) as data:
            inputs = model_inputs(data["inputs"], shape)
            labels = np.asarray(data["labels"], dtype=np.int64) if "labels" in data else None
    # timing input: a real sample when there is one (binary nets may branch on data), else noise
    probe = (
        inputs[:1]
        if inputs is not None
        else np.random.default_rng(0).standard_normal([1, *shape[1:]]).astype(np.float32)
    )
    # time the wrapper's own predict: the Python-side `predict` adds a generator and a concat
    raw = interpreter.interpreter
    for _ in range(warmup):
        raw.predict([probe])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        raw.predict([probe])
        times.append((time.perf_counter() - start) * 1000.0)
    result = {
        "runtime": "lce-python",
        "python": platform.python_version(),
        "threads": threads,
        "warmup": warmup,
        "latency_ms": latency_stats(times),
    }
    try:
        import larq_compute_engine

        result["lce_version"] = getattr(larq_compute_engine, "__version__", None)
    except Exception:  # version is nice to have, never a reason to fail
        result["lce_version"] = None
    outputs = None
    if inputs is not None:
        # LCE's predict runs the samples one by one at batch 1 (the model's batch size)
        outputs = np.asarray(interpreter.predict(inputs), dtype=np.float32)
        outputs = outputs.reshape(len(inputs), -1)
        accuracy = {"samples": int(len(inputs))}
        if labels is not None:
            accuracy["top1"] = topk_accuracy(outputs, labels, 1)
            if outputs.shape[1] > 5:
                accuracy["top5"] = topk_accuracy(outputs, labels, 5)
        result["accuracy"] = accuracy
    return result, outputs


def main(argv: list | None = None) -> int:
    """Parse arguments, run, print one JSON object (or a short text summary)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the LCE flatbuffer (.tflite)")
    parser.add_argument(
        "--samples", help="npz with `inputs` (float32, the model's input layout) and `labels`"
    )
    parser.add_argument("--runs", type=int, default=100, help="timed runs at batch 1")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs before timing")
    parser.add_argument("--threads", type=int, default=1, help="interpreter threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--outputs", help="write the model's outputs on the samples to this .npz")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    result, outputs = run(args.model, args.samples, args.runs, args.threads, args.warmup)
    if args.outputs and outputs is not None:
        np.savez(args.outputs, outputs=outputs)
    if args.json:
        print(json.dumps(result))
    else:
        lat = result["latency_ms"]
        print(
            f"latency ms: min {lat['min']:.3f} median {lat['median']:.3f} "
            f"p90 {lat['p90']:.3f} mean {lat['mean']:.3f} std {lat['std']:.3f}"
        )
        if "accuracy" in result:
            print(f"accuracy: {result['accuracy']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
