"""larq-zoo models through tf2onnx and bnnexport's converter, beside LCE's native Keras converter.

Question (docs/BENCHMARKS.md "larq-zoo via tf2onnx"): a larq user who exports a larq-zoo model with
tf2onnx and converts the ONNX file with bnnexport (`converters.lce.convert_onnx`) instead of calling
LCE's `convert_keras_model` on the Keras model: does every binary layer become an LceBconv2d, is the
flatbuffer as small, as exact and as fast?

For each model (`--models`), in the larq venv (benchmarks/.venv-larq, `larq_side.py zoo`, with
larq-zoo 2.4.0 and tf2onnx 1.17.0 added on first use; docs/BENCHMARKS.md): the model is built at
`--size` x `--size` with `weights=None` (pretrained weights cannot be downloaded here), random
BatchNorm statistics and its final softmax removed (random models saturate it; logits show every
difference), converted by `convert_keras_model` (the native flatbuffer) and by tf2onnx
(the ONNX file), and run by Keras on `--samples` standard-normal NHWC inputs. Then, in this
process: `convert_onnx(model.onnx, ours.tflite, inputs=the samples)` (a dynamic batch fixed at
1; its gate compares with ONNX Runtime on those samples), and both flatbuffers are
compared with the Keras outputs (argmax agreement, max |diff|) and timed in LCE's interpreter
(`converters.runtimes.open_model("lce")`, its `run_one`: 1 thread, indirect BGEMM, batch 1),
interleaved: each round runs native then ours (order swapped every round), `--runs` inferences
each; the figure is the median over `--rounds` of each round's median.

A model whose strict conversion fails gets a row with bnnexport's one-line error; unless
`--no-fallback` it is converted again with `allow_float=("all",)` (layers the translator has no
binary form for are translated as float convs on the ±1 tensor; LCE's converter may still
binarize them) and that flatbuffer is measured in its own row: it shows whether the rest of the
tf2onnx graph converts exactly, and what LCE makes of those layers.

Targets: LceBconv2d(ours) = LceBconv2d(native); bytes(ours) <= 1.01 x bytes(native); latency
ratio ours/native <= 1.0.

Run (from the repository root, with the main venv):
    .venv/bin/python benchmarks/larq_zoo_tf2onnx.py --keep DIR           # 5 models, ~15 min
    .venv/bin/python benchmarks/larq_zoo_tf2onnx.py --models QuickNetSmall --samples 50 --json
    .venv/bin/python benchmarks/larq_zoo_tf2onnx.py --retime DIR --rounds 60 --runs 5
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, interleaved, larq_json, larq_zoo_python, log, machine, parser, table
from bnnexport.converters.errors import ConverterError
from bnnexport.converters.flatbuffer import op_histogram
from bnnexport.converters.gate import TIE_RTOL, GateOptions
from bnnexport.converters.lce import ConvertOptions, convert_onnx
from bnnexport.converters.runtimes import open_model, run_lce

DEFAULT_MODELS = "QuickNetSmall,QuickNet,BinaryAlexNet,BiRealNet,RealToBinaryNet"


def agreement(outputs: np.ndarray, keras: np.ndarray) -> dict[str, float]:
    """Argmax agreement and max |diff| of a flatbuffer's outputs against Keras'."""
    a, b = (np.asarray(v, np.float64).reshape(len(keras), -1) for v in (outputs, keras))
    return {
        "argmax_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
        "max_abs_diff": float(np.abs(a - b).max()),
        "keras_output_range": float(np.abs(b).max()),
    }


def caller(flatbuffer: Path, sample: np.ndarray):  # noqa: ANN201 - a zero-argument callable
    """One batch-1 inference in LCE's interpreter (1 thread, indirect BGEMM) on `sample`."""
    model = open_model("lce", flatbuffer, threads=1)
    x = np.ascontiguousarray(sample[None], dtype=np.float32)
    return lambda: model.run_one(x)


def our_conversion(
    onnx_path: Path, out: Path, inputs: np.ndarray, options: ConvertOptions
) -> dict[str, Any]:
    """convert_onnx with the gate on `inputs`; a summary, or {"error": one line}."""
    start = time.perf_counter()
    try:
        result = convert_onnx(onnx_path, out, inputs=inputs, options=options)
    except ConverterError as error:
        return {
            "error": f"{type(error).__name__}: {str(error).splitlines()[0]}",
            "seconds": time.perf_counter() - start,
        }
    onnx_gate = result.gate("ONNX Runtime")
    return {
        "binary_layers": result.binary_layers,
        "lce_bconv2d": result.lce_bconv2d,
        "bytes": result.lce_bytes,
        "op_histogram": result.op_histogram,
        "float_fallbacks": result.float_fallbacks,
        "rewrites": dict(result.normalized.applied),
        "gate_vs_onnxruntime": onnx_gate.to_json() if onnx_gate else None,
        "seconds": time.perf_counter() - start,
    }


def measure(name: str, work: Path, args: Any, python: Path) -> dict[str, Any]:
    folder = work / name
    log(
        f"[{name}] larq venv: build ({args.size}x{args.size}), convert_keras_model, tf2onnx, "
        f"Keras on {args.samples} samples"
    )
    side = larq_json(
        [
            "zoo",
            "--model",
            name,
            "--out",
            str(folder),
            "--samples",
            str(args.samples),
            "--size",
            str(args.size),
            "--batch",
            args.batch,
            "--opset",
            str(args.opset),
            "--threads",
            "1",
        ],
        timeout=3600,
        python=python,
    )
    log(
        f"[{name}]   native {side['native_bytes']} bytes in {side['native_seconds']:.1f} s, "
        f"ONNX {side['onnx_bytes']} bytes in {side['tf2onnx_seconds']:.1f} s"
    )
    inputs, keras = np.load(folder / "inputs.npy"), np.load(folder / "keras.npy")
    native_path = folder / "native.tflite"
    hist_native = op_histogram(native_path)
    row: dict[str, Any] = {
        "model": name,
        "larq_side": side,
        "native": {
            "bytes": native_path.stat().st_size,
            "op_histogram": hist_native,
            "lce_bconv2d": hist_native.get("LceBconv2d", 0),
            "vs_keras": agreement(run_lce(native_path, inputs), keras),
        },
    }
    gate = GateOptions(tie_rtol=args.tie_rtol)
    attempts = [("ours", ConvertOptions(gate=gate, twin=args.twin))]
    if args.fallback:
        attempts.append(
            (
                "ours, allow_float=all",
                ConvertOptions(gate=gate, twin=args.twin, allow_float=("all",)),
            )
        )
    for label, options in attempts:
        log(f"[{name}] bnnexport: convert_onnx ({label}), gate on {len(inputs)} samples")
        ours_path = folder / f"{label.replace(', ', '-').replace(' ', '-')}.tflite"
        ours = our_conversion(folder / "model.onnx", ours_path, inputs, options)
        row[label] = ours
        if "error" in ours:
            log(f"[{name}]   failed in {ours['seconds']:.0f} s: {ours['error'][:300]}")
            continue
        log(
            f"[{name}]   {ours['lce_bconv2d']} LceBconv2d of {ours['binary_layers']} binary "
            f"layers, {ours['bytes']} bytes, {ours['seconds']:.0f} s"
        )
        ours["vs_keras"] = agreement(run_lce(ours_path, inputs), keras)
        log(f"[{name}] LCE latency, interleaved: {args.rounds} rounds x {args.runs} runs")
        times = interleaved(
            {"native": caller(native_path, inputs[0]), "ours": caller(ours_path, inputs[0])},
            rounds=args.rounds,
            runs=args.runs,
            warmup=3,
        )
        ours["latency_ms"], ours["native_latency_ms"] = times["ours"], times["native"]
        ours["latency_ratio"] = times["ours"]["median"] / times["native"]["median"]
        ours["bytes_ratio"] = ours["bytes"] / row["native"]["bytes"]
        ours["targets"] = {
            "all_binary": ours["lce_bconv2d"] == row["native"]["lce_bconv2d"],
            "bytes": ours["bytes_ratio"] <= 1.01,
            "latency": ours["latency_ratio"] <= 1.0,
        }
        break  # the fallback only runs when the strict conversion failed
    return row


def _histogram(histogram: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in histogram.items())


def _versus(side: dict[str, Any]) -> str:
    return f"{side['vs_keras']['argmax_agreement']:.3g} / {side['vs_keras']['max_abs_diff']:.2g}"


def report(result: dict[str, Any]) -> str:
    rows, ops, errors = [], [], []
    for r in result["models"]:
        n = r["native"]
        ops.append([r["model"], "native", _histogram(n["op_histogram"])])
        for label in ("ours", "ours, allow_float=all"):
            o = r.get(label)
            if o is None:
                continue
            if "error" in o:
                rows.append(
                    [
                        r["model"],
                        label,
                        r["larq_side"]["keras_binary_layers"],
                        None,
                        n["lce_bconv2d"],
                        None,
                        n["bytes"],
                        None,
                        None,
                        None,
                        None,
                        None,
                        "FAILED",
                    ]
                )
                errors.append(f"{r['model']} ({label}): {o['error']}")
                continue
            rows.append(
                [
                    r["model"],
                    label,
                    r["larq_side"]["keras_binary_layers"],
                    o["binary_layers"],
                    n["lce_bconv2d"],
                    o["lce_bconv2d"],
                    n["bytes"],
                    o["bytes"],
                    o["bytes_ratio"],
                    o["native_latency_ms"]["median"],
                    o["latency_ms"]["median"],
                    o["latency_ratio"],
                    _versus(o),
                ]
            )
            ops.append([r["model"], label, _histogram(o["op_histogram"])])
        rows.append(
            [
                r["model"],
                "native vs Keras",
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                _versus(n),
            ]
        )
    text = table(
        [
            "model",
            "path",
            "Keras binary",
            "binary found",
            "LceBconv2d native",
            "LceBconv2d ours",
            "bytes native",
            "bytes ours",
            "bytes ratio",
            "native ms",
            "ours ms",
            "latency ratio",
            "vs Keras: argmax / max|diff|",
        ],
        rows,
    )
    text += "\n\n" + table(["model", "path", "op histogram"], ops)
    if errors:
        text += "\n\nerrors:\n" + "\n".join(errors)
    m = result["machine"]
    text += (
        f"\n\nLCE interpreter, 1 thread, use_indirect_bgemm=True, batch 1, {result['rounds']} "
        f"rounds x {result['runs_per_round']} runs interleaved; load before "
        f"{result['load_before']}, after {m['load_average']}"
    )
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=f"comma-separated larq-zoo model names (default {DEFAULT_MODELS})",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=200,
        help="random NHWC inputs: Keras runs them, the gate and the Keras comparison "
        "use them (default 200)",
    )
    p.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    p.add_argument(
        "--batch",
        choices=("dynamic", "static"),
        default="dynamic",
        help="batch dimension of tf2onnx's input: dynamic (None, fixed to 1 by the "
        "normaliser) or static 1 (default dynamic)",
    )
    p.add_argument("--opset", type=int, default=13, help="tf2onnx's ONNX opset (default 13)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    p.add_argument(
        "--runs", type=int, default=3, help="timed inferences per contender per round (default 3)"
    )
    p.add_argument(
        "--no-fallback",
        dest="fallback",
        action="store_false",
        help="do not convert again with allow_float=('all',) after a refusal",
    )
    p.add_argument(
        "--tie-rtol",
        type=float,
        default=TIE_RTOL,
        help="diagnostics only: the gate's sign-tie bound, |x| / max |x| of a "
        f"binarization input (default {TIE_RTOL}, converters/gate/predicate.py)",
    )
    p.add_argument(
        "--no-twin",
        dest="twin",
        action="store_false",
        help="diagnostics only: skip the exact-grid twin check",
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep the generated files (ONNX, flatbuffers, samples) in this folder; "
        "by default they go to a temporary folder that is removed",
    )
    p.add_argument(
        "--retime",
        type=Path,
        default=None,
        help="only time again the native.tflite and ours.tflite that --keep left in this "
        "folder (one subfolder per model), with --rounds and --runs; nothing is rebuilt",
    )
    args = p.parse_args(argv)
    if args.retime is not None:
        if not args.retime.is_dir():
            p.error(f"--retime: no such folder {args.retime} (a --keep folder of an earlier run)")
        return retime(args)
    python = larq_zoo_python()
    result: dict[str, Any] = {
        "load_before": machine()["load_average"],
        "threads": 1,
        "use_indirect_bgemm": True,
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "samples": args.samples,
        "size": args.size,
        "batch": args.batch,
        "tie_rtol": args.tie_rtol,
        "twin": args.twin,
        "models": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-larqzoo-")) if args.keep is None else args.keep
    try:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            try:
                result["models"].append(measure(name, work, args, python))
            except RuntimeError as error:  # the larq side failed: report, go on
                log(f"[{name}] larq side failed: {str(error)[-500:]}")
                result["models"].append({"model": name, "larq_error": str(error)[-2000:]})
            finally:
                if args.keep is None:
                    shutil.rmtree(work / name, ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result["machine"] = machine()
    versions = next((r["larq_side"]["versions"] for r in result["models"] if "larq_side" in r), {})
    result["versions"] = versions
    done = {
        "machine": result["machine"],
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "load_before": result["load_before"],
        "models": [r for r in result["models"] if "native" in r],
    }
    text = report(done) + f"\nversions: {versions}"
    failed = [r for r in result["models"] if "larq_error" in r]
    if failed:
        text += "\nlarq side failed: " + ", ".join(r["model"] for r in failed)
    emit(result, text, args.json)
    return result


def retime(args: Any) -> dict[str, Any]:
    """Interleaved latency of flatbuffers kept by an earlier run (`--retime DIR`)."""
    result: dict[str, Any] = {
        "load_before": machine()["load_average"],
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "models": {},
    }
    lines = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        folder = args.retime / name
        if not (folder / "ours.tflite").is_file() or not (folder / "native.tflite").is_file():
            log(f"[{name}] no native.tflite and ours.tflite in {folder}: skipped")
            continue
        sample = np.load(folder / "inputs.npy", mmap_mode="r")[0]
        log(f"[{name}] LCE latency, interleaved: {args.rounds} rounds x {args.runs} runs")
        times = interleaved(
            {kind: caller(folder / f"{kind}.tflite", sample) for kind in ("native", "ours")},
            rounds=args.rounds,
            runs=args.runs,
            warmup=3,
        )
        result["models"][name] = times
        ratios = [times["ours"][k] / times["native"][k] for k in ("median", "min")]
        lines.append([name, times["native"]["median"], times["ours"]["median"], *ratios])
    result["machine"] = machine()
    header = ["model", "native ms (median)", "ours ms (median)", "ratio (median)", "ratio (min)"]
    text = (
        table(header, lines)
        + f"\nload before {result['load_before']}, after "
        + str(result["machine"]["load_average"])
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
