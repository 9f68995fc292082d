"""Does torch -> ONNX -> LCE give the flatbuffer larq's own path gives? Ops, bytes, latency.

Question: BinaryNet at 3x32x32 built in larq (Keras, in benchmarks/.venv-larq,
`larq_side.py`) and converted by LCE's `convert_keras_model`, against the same architecture
through bnnexport (`init` -> `export` -> `convert --target arm64`): op histograms, flatbuffer
bytes, and batch-1 latency in LCE's interpreter with identical settings (num_threads=1,
use_indirect_bgemm=True), both flatbuffers timed interleaved in this one process.

Two variants (`--variants`):
- `full`: the whole BinaryNet. larq's native path leaves the three binary dense layers as float
  FULLY_CONNECTED (docs/LCE_NOTES.md "Binary ops" and "Running flatbuffers"); bnnexport turns them
  into LceBconv2d, so bytes differ on purpose.
- `convs`: the six convs, BatchNorms and max-pools only (no dense layers): the like-for-like
  comparison of what both paths binarize.

Run:
    .venv/bin/python benchmarks/native_vs_torch.py              # ~3 minutes
    .venv/bin/python benchmarks/native_vs_torch.py --rounds 30 --runs 20 --json
The larq venv is created on first use (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _common import (
    emit,
    interleaved,
    larq_json,
    lce_caller,
    log,
    machine,
    parser,
    register_binarynet_convs,
    table,
    torch_pipeline,
)
from bnnexport.converters.flatbuffer import op_histogram

VARIANTS = {"full": ("binarynet", False), "convs": ("binarynet-convs", True)}


def binary_ops(histogram: dict[str, int]) -> dict[str, int]:
    """The LCE custom ops (binary convs, quantize/dequantize, binary max-pool)."""
    return {k: v for k, v in sorted(histogram.items()) if k.startswith("Lce")}


def compare_variant(variant: str, tmp: Path, rounds: int, runs: int) -> dict[str, Any]:
    model, conv_only = VARIANTS[variant]
    log(f"[{variant}] larq: build + convert_keras_model")
    native_path = tmp / f"native-{variant}.tflite"
    native = larq_json(["convert", "--out", str(native_path)] + (["--conv-only"] * conv_only))
    log(f"[{variant}] bnnexport: init -> export -> convert")
    ours = torch_pipeline(model, tmp / f"run-{variant}")
    ours_path = Path(ours["convert"].output)
    hist_native = op_histogram(native_path.read_bytes())
    hist_ours = op_histogram(ours_path.read_bytes())
    log(f"[{variant}] LCE latency, interleaved: {rounds} rounds x {runs} runs")
    times = interleaved(
        {"bnnexport": lce_caller(ours_path), "native": lce_caller(native_path)},
        rounds=rounds,
        runs=runs,
        warmup=5,
    )
    b_native, b_ours = native_path.stat().st_size, ours_path.stat().st_size
    return {
        "model": model,
        "native": {
            "bytes": b_native,
            "op_histogram": hist_native,
            "latency_ms": times["native"],
            "convert_seconds": native["seconds"],
            "keras_parameters": native["parameters"],
        },
        "bnnexport": {
            "bytes": b_ours,
            "op_histogram": hist_ours,
            "latency_ms": times["bnnexport"],
            "convert_seconds": ours["seconds"]["convert"],
            "parameters": ours["init"].parameters,
        },
        "binary_ops_identical": binary_ops(hist_native) == binary_ops(hist_ours),
        "lce_bconv2d": {
            "native": hist_native.get("LceBconv2d", 0),
            "bnnexport": hist_ours.get("LceBconv2d", 0),
        },
        "bytes_ratio": b_ours / b_native,
        "latency_ratio": times["bnnexport"]["median"] / times["native"]["median"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--variants", default="full,convs", help="comma-separated: full, convs")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--runs", type=int, default=10, help="timed inferences per round (default 10)")
    args = p.parse_args(argv)
    register_binarynet_convs()
    result: dict[str, Any] = {
        "machine": machine(),
        "threads": 1,
        "use_indirect_bgemm": True,
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-native-") as tmp:
        for variant in args.variants.split(","):
            result["variants"][variant] = compare_variant(
                variant.strip(), Path(tmp), args.rounds, args.runs
            )
    rows, ops = [], []
    for variant, r in result["variants"].items():
        for side in ("native", "bnnexport"):
            s = r[side]
            rows.append(
                [
                    variant,
                    side,
                    s["bytes"],
                    s["latency_ms"]["median"],
                    s["latency_ms"]["min"],
                    s["op_histogram"].get("LceBconv2d", 0),
                    s["op_histogram"].get("FULLY_CONNECTED", 0),
                    s["op_histogram"].get("CONV_2D", 0),
                ]
            )
            ops.append([variant, side, ", ".join(f"{k} {v}" for k, v in s["op_histogram"].items())])
        rows.append(
            [
                variant,
                "ratio bnnexport/native",
                r["bytes_ratio"],
                r["latency_ratio"],
                None,
                None,
                None,
                None,
            ]
        )
    text = table(
        [
            "variant",
            "path",
            "bytes",
            "LCE ms (median)",
            "LCE ms (min)",
            "LceBconv2d",
            "FULLY_CONNECTED",
            "CONV_2D",
        ],
        rows,
    )
    text += "\n\n" + table(["variant", "path", "op histogram"], ops)
    text += "\n\nbinary (Lce*) op counts identical: " + ", ".join(
        f"{v}: {r['binary_ops_identical']}" for v, r in result["variants"].items()
    )
    text += (
        f"\nLCE interpreter, 1 thread, use_indirect_bgemm=True, batch 1, {args.rounds} rounds"
        f" x {args.runs} runs interleaved; load {result['machine']['load_average']}"
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
