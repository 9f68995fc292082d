"""How fast does every zoo model run on this host, per backend? Batch-1 latency and file sizes.

Question: each zoo model at its native input (or `--input-size`), initialised
(`bnnexport init`: ±1 kernels, randomised BatchNorm), exported and converted in a temporary
directory (`export`, `convert --format tflite`), then timed at batch 1 with 1 thread in
PyTorch (float, eager), ONNX Runtime, TFLite (float, stock interpreter) and LCE (LCE's
interpreter, indirect BGEMM). The four backends are built exactly as `bnnexport bench` builds
them (`bnnexport.stages.bench`); a fifth, `lce-app`, is the flatbuffer in LCE's interpreter with the
settings `convert.json`'s `lce_settings` names (LCE's default kernels when it is empty: what a
user's own app runs). They are timed interleaved, per model, and the medians over rounds are
reported with each backend's speed-up over PyTorch. Also: parameters, binary MAC share (the
summary's), conversion seconds (`convert`, gate included), sizes (ONNX, float TFLite, LCE).

With `--native`, a sixth contender for every larq-zoo architecture: `lce-native`, larq-zoo's
own Keras model at the same size converted by LCE's `convert_keras_model` in the larq venv
(`larq_side.py native`, docs/BENCHMARKS.md "The larq virtual environment"; the flatbuffer comes
back as a file), run with exactly `lce`'s interpreter settings (LCE's interpreter, 1 thread,
indirect BGEMM, batch 1, an NHWC copy of the same sample) in the same interleaved rounds; the
table adds its time and `lce/native`. `lce-again`, the control, is bnnexport's flatbuffer
opened a second time and timed as one more contender: `lce/again` is what the measurement
cannot tell apart (two identical models), the yardstick for `lce/native`. `--backends` keeps
only some contenders (e.g. `lce,lce-native,lce-again`), which saves the other backends'
conversions and rounds.

Run:
    .venv/bin/python benchmarks/zoo_latency.py                       # every zoo model
    .venv/bin/python benchmarks/zoo_latency.py --models binarynet,quicknet-small --input-size 64
    .venv/bin/python benchmarks/zoo_latency.py --rounds 20 --runs 20 --json
    .venv/bin/python benchmarks/zoo_latency.py --models birealnet18,quicknet --across-models
    .venv/bin/python benchmarks/zoo_latency.py --models dorefanet --grid-inputs --json
    .venv/bin/python benchmarks/zoo_latency.py --native --backends lce,lce-native,lce-again \
        --input-size 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    LARQ_ZOO_NAMES,
    emit,
    interleaved,
    larq_zoo_python,
    log,
    machine,
    native_flatbuffer,
    parser,
    table,
    torch_pipeline,
)
from bnnexport.converters.flatbuffer import input_layout, op_kinds
from bnnexport.converters.runtimes import LceModel, lce_interpreter, open_model

from bnnexport.models import list_models, model_info
from bnnexport.run.checkpoint import load_model
from bnnexport.run.directory import RunDir
from bnnexport.run.samples import load_samples
from bnnexport.stages.bench.host import host_backends
from bnnexport.stages.summary import summarize

BACKENDS = ("pytorch", "onnxruntime", "tflite-float", "lce", "lce-app", "lce-native", "lce-again")


def app_lce_call(flatbuffer: Path, settings: dict[str, bool], x1: np.ndarray) -> Any:
    """One batch-1 call of `flatbuffer` in LCE's interpreter as an app opens it: LCE's default
    kernels, plus `settings` (convert.json's `lce_settings`) where the flatbuffer needs them."""
    opened = lce_interpreter(flatbuffer, 1, default_kernels=not settings)
    model = LceModel(opened, input_layout(flatbuffer))
    x = model.feed(x1)  # in the layout the flatbuffer declares, before the timing, as bench
    return lambda: model.run_one(x)


def native_call(model: str, size: int, tmp: Path, x1: np.ndarray, python: Path) -> tuple:
    """(a batch-1 call of larq-zoo's `model` converted natively, as `lce` is timed: 1 thread,
    indirect BGEMM, `x1` in NHWC; the side's answer: bytes, conversion seconds, versions)."""
    path = tmp / f"{model}-native.tflite"
    side = native_flatbuffer(model, size, path, python)
    if "error" in side:
        raise RuntimeError(f"larq-zoo's {model} at {size}: {side['error']}")
    native = open_model("lce", path, 1)
    x = np.ascontiguousarray(np.transpose(x1, (0, 2, 3, 1)))
    return (lambda: native.run_one(x)), {**side, "op_kinds": op_kinds(path)}


def measure(
    model: str, tmp: Path, args: argparse.Namespace, lce_calls: dict[str, Any]
) -> dict[str, Any]:
    """One model: init -> export -> convert, sizes, and (unless `--across-models`) its backends
    timed side by side. Its two LCE calls go to `lce_calls` for the across-model set."""
    input_size, rounds, runs = args.input_size, args.rounds, args.runs
    info = model_info(model)
    shape = info.input_shape
    if input_size is not None and shape[1] > input_size:  # only ever shrinks (ImageNet models)
        shape = (shape[0], input_size, input_size)
    start = time.perf_counter()
    fmt = "tflite" if "tflite-float" in args.backends else "lce"  # the float model if timed
    made = torch_pipeline(
        model, tmp / model, input_shape=shape, samples=8, fmt=fmt, grid_inputs=args.grid_inputs
    )
    pipeline_s = time.perf_counter() - start
    run = RunDir(tmp / model)
    inputs, _ = load_samples(run, 1)
    x1 = np.ascontiguousarray(inputs[:1])
    convert = made["convert"]
    summary = summarize(load_model(run.root), tuple(shape))
    threads = torch.get_num_threads()
    calls, sizes = {}, {}
    try:
        for name, path, factory in host_backends(run, "arm64", 1):
            if name not in args.backends and name != "lce":  # lce: also the across-model set
                continue
            _, call = factory(x1)
            calls[name] = call
            sizes[name] = path.stat().st_size if path is not None else None
            if name == "lce" and "lce-again" in args.backends:  # the control: a second opening
                calls["lce-again"] = factory(x1)[1]
        calls["lce-app"] = app_lce_call(run.flatbuffer("arm64"), convert.lce_settings, x1)
        lce_calls[model], lce_calls[f"{model} (app)"] = calls["lce"], calls["lce-app"]
        native = None
        if args.native and model in LARQ_ZOO_NAMES:
            log(f"{model}: larq-zoo's model through convert_keras_model (larq venv)")
            calls["lce-native"], native = native_call(model, shape[1], tmp, x1, args.python)
        calls = {n: c for n, c in calls.items() if n in args.backends}
        times = {} if args.across_models else interleaved(calls, rounds, runs, warmup=3)
    finally:
        torch.set_num_threads(threads)
    return {
        "input_shape": list(shape),
        "native_input_shape": list(info.input_shape),
        "parameters": made["init"].parameters,
        "binary_layers": made["init"].binary_layers,
        "lce_bconv2d": convert.lce_bconv2d,
        "binary_mac_share": summary.binary_mac_share,
        "lce_settings": convert.lce_settings,
        "latency_ms": {n: t["median"] for n, t in times.items()},
        "latency_min_ms": {n: t["min"] for n, t in times.items()},
        "bytes": {
            "onnx": convert.onnx_bytes,
            "tflite_float": convert.tflite_float_bytes,
            "lce": convert.lce_bytes,
            "checkpoint": sizes.get("pytorch"),
        },
        "pipeline_seconds": pipeline_s,
        "seconds": made["seconds"],  # init, export, convert (the gate included)
        "stage_seconds": convert.stage_seconds,
        "op_kinds": op_kinds(run.flatbuffer("arm64")),
        "native": native,  # larq_side.py native's answer, with --native
    }


def across_table(across: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    """The across-model set: each flatbuffer's median and min, and its ratio to the first's."""
    first = next(iter(across.values()))["median"]
    rows = [[name, t["median"], t["min"], t["median"] / first] for name, t in across.items()]
    text = table(["flatbuffer", "lce median ms", "lce min ms", "x first"], rows)
    return text + (
        f"\n\nbatch 1, 1 thread, every flatbuffer in one interleaved set: medians of "
        f"{args.rounds} rounds x {args.runs} runs; (app): LCE's default kernels plus the "
        "flatbuffer's lce_settings"
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def model_row(model: str, r: dict[str, Any]) -> list[Any]:
    """One model's row of the table: each timed backend's median, the ratios, sizes, times."""
    lat, b = r["latency_ms"], r["bytes"]
    native = r.get("native") or {}
    return [
        model,
        "x".join(map(str, r["input_shape"])),
        *(lat.get(n) for n in ("pytorch", "onnxruntime", "tflite-float", "lce", "lce-app")),
        "+".join(k for k, on in r["lce_settings"].items() if on) or "default",
        _ratio(lat.get("pytorch"), lat.get("lce")),
        _ratio(lat.get("tflite-float"), lat.get("lce")),
        lat.get("lce-native"),
        _ratio(lat.get("lce"), lat.get("lce-native")),
        _ratio(lat.get("lce"), lat.get("lce-again")),
        f"{r['lce_bconv2d']}/{r['binary_layers']}",
        r["parameters"] / 1e6,
        r["binary_mac_share"],
        r["seconds"]["convert"],
        native.get("seconds"),
        b["onnx"] / 1e6,
        b["tflite_float"] / 1e6 if b["tflite_float"] else None,
        b["lce"] / 1e6,
        native["bytes"] / 1e6 if native else None,
    ]


HEAD = [
    "model", "input", "pytorch ms", "ort ms", "tflite ms", "lce ms", "lce-app ms",
    "app settings", "pytorch/lce", "tflite/lce", "native ms", "lce/native", "lce/again",
    "bconv/binary",
    "params M", "binary MACs", "convert s", "native convert s", "onnx MB", "tflite MB", "lce MB",
    "native MB",
]  # fmt: skip


def model_table(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The per-model table (a contender not timed is '-'), failures, and how it was measured."""
    rows, failed = [], []
    for model, r in result["models"].items():
        if "error" in r:
            failed.append(f"{model}: {r['error'][:200]}")
        else:
            rows.append(model_row(model, r))
    text = table(HEAD, rows) + "".join(f"\nFAILED {f}" for f in failed)
    return text + (
        f"\n\nbatch 1, 1 thread, medians of {args.rounds} interleaved rounds x {args.runs} "
        f"runs; load {result['machine']['load_average']}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument(
        "--models",
        default=",".join(list_models()),
        help="comma-separated zoo models (default: all of them)",
    )
    p.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="cap the input's height and width (e.g. 64 for the ImageNet models)",
    )
    p.add_argument(
        "--grid-inputs",
        action="store_true",
        help="export and convert check on the run's default inputs (a 1/64 grid) instead of "
        "uniform [-1, 1] images",
    )
    p.add_argument(
        "--across-models",
        action="store_true",
        help="time only the LCE flatbuffers (indirect BGEMM, and as an app opens them), every "
        "model's in one interleaved set, so ratios between models are side by side",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="also time larq-zoo's own model converted by convert_keras_model (lce-native)",
    )
    p.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"the contenders to time (default all: {','.join(BACKENDS)})",
    )
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per backend per round")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    args.python = larq_zoo_python(tf2onnx=False) if args.native else None
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    result: dict[str, Any] = {
        "machine": machine(),
        "threads": 1,
        "batch": 1,
        "rounds": args.rounds,
        "runs_per_round": args.runs,
        "check_inputs": "grid" if args.grid_inputs else "uniform",
        "models": {},
    }
    lce_calls: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-zoo-") as tmp:
        for model in models:
            log(f"{model}: init -> export -> convert, then timing")
            try:
                result["models"][model] = measure(model, Path(tmp), args, lce_calls)
            except Exception as error:  # noqa: BLE001 - one failing model must not hide the rest
                result["models"][model] = {"error": f"{type(error).__name__}: {error}"}
                log(f"{model}: FAILED: {result['models'][model]['error'][:300]}")
        if args.across_models:
            log(f"timing {len(lce_calls)} LCE flatbuffers side by side")
            across = interleaved(lce_calls, args.rounds, args.runs, warmup=3)
            result["across_models"] = across
            result["machine_after"] = machine()
            emit(result, across_table(across, args), args.json)
            return result
    result["machine_after"] = machine()
    emit(result, model_table(result, args), args.json)
    return result


if __name__ == "__main__":
    main()
