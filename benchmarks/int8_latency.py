"""Does int8 for the float layers pay on the host? Float vs int8 flatbuffers, side by side.

Question (issue 39): with its float layers (stem, shortcut convs, head) in int8 and every binary
layer still an LceBconv2d, how much smaller and faster is a flatbuffer, and what does it cost in
top-1? For each case the float flatbuffer (`convert`) and the int8 one (`convert --float-layers
int8`) are timed in LCE's interpreter at batch 1 with 1 thread (as `bnnexport bench` opens
them), interleaved in one process, and so is every float layer of the model alone: that layer
(the converter's own list of the layers int8 takes, each as a PyTorch module at its input
shape) converted to a flatbuffer by itself. The sum of those is the float layers' share of the
float flatbuffer's time. LCE's Python interpreter has no op profiler (docs/LCE_NOTES.md
"int8 around binary layers"), so this is the share measured, not read off a profile.

Cases: mnist-bnn trained on mnist5k for `--epochs` epochs twice, once plain (its int8 flatbuffer
calibrated on the run's samples) and once with `train --float-layers int8` (quantization-aware:
the ranges it learnt), top-1 on the run's 1000 test samples; BinaryNet at 32x32,
QuickNet-Small and Bi-Real-Net-18 at 64x64 initialised (`bnnexport init`, no top-1: random
weights), calibrated on 32 synthetic samples.

Target: the int8 flatbuffer at most 0.8x the float one's latency on the models whose float
layers carry at least a quarter of the time, and at most 0.5 point of top-1 lost on the trained
model.

Prepare (no timing: conversions), then time under the shared lock:
    .venv/bin/python benchmarks/int8_latency.py --keep /tmp/int8-bench
    flock /tmp/bench.lock .venv/bin/python benchmarks/int8_latency.py --retime /tmp/int8-bench
Or both at once: .venv/bin/python benchmarks/int8_latency.py [--json]
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import ROOT, emit, interleaved, lce_caller, log, machine, parser, table, torch_pipeline

INIT_CASES = {"binarynet": 32, "quicknet-small": 64, "birealnet18": 64}
TRAINED = "mnist-bnn"
SHARE = 0.25  # the float layers' share of time from which the latency target applies
LATENCY_TARGET = 0.8  # int8 / float latency
TOP1_TARGET = 0.5  # points of top-1 lost at most


def _train(out: Path, epochs: int, int8: bool) -> None:
    argv = [sys.executable, "-m", "bnnexport", "train", "--model", TRAINED, "--dataset",
            "mnist5k", "--epochs", str(epochs), "--out", str(out), "--force"]  # fmt: skip
    if int8:
        argv += ["--float-layers", "int8"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"int8_latency.py: error: training {out.name}: {done.stderr.strip()}")


def _top1(flatbuffer: Path, run: Path) -> float:
    from bnnexport.converters.runtimes import run_lce

    with np.load(run / "samples.npz") as samples:
        inputs, labels = samples["inputs"], samples["labels"]
    return float(np.mean(run_lce(flatbuffer, inputs).argmax(1) == labels))


def _float_layers(run: Path, into: Path) -> dict[str, str]:
    """Each layer the int8 conversion took, converted alone (float) into `into`: {module: path}."""
    from bnnexport.converters.layer_map import module_path_of_name

    from bnnexport import convert_module
    from bnnexport.run.checkpoint import load_model

    report = json.loads((run / "convert-int8.json").read_text())
    names = [module_path_of_name(n) for n in report["int8"]["int8_layers"]]
    model = load_model(run)
    modules = dict(model.named_modules())
    shapes: dict[str, tuple[int, ...]] = {}

    def seen(name: str):
        def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
            shapes.setdefault(name, tuple(args[0].shape))

        return hook

    hooks = [modules[n].register_forward_hook(seen(n)) for n in names]
    with np.load(run / "samples.npz") as samples, torch.no_grad():
        model(torch.from_numpy(samples["inputs"][:1]))
    for hook in hooks:
        hook.remove()
    into.mkdir(exist_ok=True)
    found = {}
    for name in names:
        layer = copy.deepcopy(modules[name]).eval()
        out = into / f"{name}.tflite"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert_module(layer, torch.zeros(shapes[name]), out=out, samples=4)
        found[name] = str(out)
    return found


def prepare(keep: Path, epochs: int) -> dict[str, Any]:
    """Every run, flatbuffer and float layer alone, in `keep`; what was made (prepared.json)."""
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx

    cases: dict[str, Any] = {}
    for int8 in (False, True):
        name = f"{TRAINED} trained{' (QAT)' if int8 else ''}"
        run = keep / ("mnist-qat" if int8 else "mnist")
        case: dict[str, Any] = {"run": str(run), "trained": True, "qat": int8}
        if not (run / "convert-int8.json").is_file():  # else made by an earlier --keep
            log(f"{name}: train {epochs} epochs, export, convert")
            _train(run, epochs, int8)
            export_onnx(run)
            if not int8:
                convert_run(run, target="arm64", fmt="lce")
            convert_run(run, target="arm64", float_layers="int8", max_accuracy_drop=None)
        if not int8:
            case["float"] = str(run / "model-arm64.tflite")
        report = json.loads((run / "convert-int8.json").read_text())
        case["int8"] = str(run / "model-arm64-int8.tflite")
        case["int8_accuracy"] = report["int8"]["accuracy"]
        case["ranges"] = report["int8"]["ranges"]
        cases[name] = case
    for model, size in INIT_CASES.items():
        run = keep / model
        name = f"{model}@{size} (init)"
        if not (run / "convert-int8.json").is_file():
            log(f"{name}: init, export, convert float and int8")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch_pipeline(model, run, input_shape=(3, size, size), samples=32)
                convert_run(run, target="arm64", float_layers="int8", max_accuracy_drop=None)
        ranges = json.loads((run / "convert-int8.json").read_text())["int8"]["ranges"]
        cases[name] = {
            "run": str(run), "trained": False, "qat": False, "ranges": ranges,
            "float": str(run / "model-arm64.tflite"), "int8": str(run / "model-arm64-int8.tflite"),
        }  # fmt: skip
    for name, case in cases.items():
        if case["qat"]:
            continue
        log(f"{name}: every int8 layer converted alone")
        case["layers"] = _float_layers(Path(case["run"]), Path(case["run"]) / "layers")
    for case in cases.values():
        if case["trained"]:
            run = Path(case["run"])
            case["top1"] = {k: _top1(Path(case[k]), run) for k in ("float", "int8") if k in case}
    (keep / "prepared.json").write_text(json.dumps(cases, indent=1))
    return cases


def time_cases(cases: dict[str, Any], rounds: int, runs: int) -> dict[str, Any]:
    """Each case's flatbuffers and its float layers alone, interleaved; latency and size."""
    torch.set_num_threads(1)
    rows = {}
    for name, case in cases.items():
        calls = {k: lce_caller(Path(case[k]), 1) for k in ("float", "int8") if k in case}
        layers = case.get("layers", {})
        calls.update({f"layer {n}": lce_caller(Path(p), 1) for n, p in layers.items()})
        log(f"timing {name}: {len(calls)} flatbuffers")
        times = interleaved(calls, rounds=rounds, runs=runs, warmup=5)
        row: dict[str, Any] = {
            "latency_ms": {k: times[k]["median"] for k in ("float", "int8") if k in times},
            "bytes": {k: Path(case[k]).stat().st_size for k in ("float", "int8") if k in case},
            "layers_ms": {n: times[f"layer {n}"]["median"] for n in layers},
            "ranges": case["ranges"], "top1": case.get("top1"),
            "int8_accuracy": case.get("int8_accuracy"),
        }  # fmt: skip
        if "float" in times:
            float_ms = times["float"]["median"]
            row["ratio"] = times["int8"]["median"] / float_ms
            row["float_share"] = sum(row["layers_ms"].values()) / float_ms
            row["size_ratio"] = row["bytes"]["int8"] / row["bytes"]["float"]
        rows[name] = row
    _verdicts(rows)
    return rows


def _verdicts(rows: dict[str, Any]) -> None:
    """Each row's verdict on the targets (module doc)."""
    plain = rows.get(f"{TRAINED} trained", {}).get("top1") or {}
    for row in rows.values():
        if "ratio" in row:
            applies = row["float_share"] >= SHARE
            row["latency_target"] = (row["ratio"] <= LATENCY_TARGET) if applies else None
        if row.get("top1") and "float" in plain:
            # the calibrated flatbuffer against its own float one; the QAT run against the
            # plain run's float flatbuffer (two trainings: their difference is in it too)
            row["top1_lost_points"] = 100 * (plain["float"] - row["top1"]["int8"])
            row["top1_target"] = row["top1_lost_points"] <= TOP1_TARGET


def _text(rows: dict[str, Any]) -> str:
    head = ["case", "ranges", "float ms", "int8 ms", "x float", "float share", "float KB",
            "int8 KB", "top-1 float", "top-1 int8", "lost", "latency target",
            "top-1 target"]  # fmt: skip

    def cell(row: dict[str, Any], key: str, scale: float = 1.0) -> Any:
        return None if row.get(key) is None else row[key] * scale

    lines = []
    for name, row in rows.items():
        top1 = row.get("top1") or {}
        lat = row.get("latency_target")
        lines.append([
            name, row["ranges"], row["latency_ms"].get("float"), row["latency_ms"]["int8"],
            cell(row, "ratio"), cell(row, "float_share"),
            row["bytes"].get("float", 0) / 1024 or None, row["bytes"]["int8"] / 1024,
            top1.get("float"), top1.get("int8"), cell(row, "top1_lost_points"),
            "n/a (share < 1/4)" if lat is None and "ratio" in row else lat,
            row.get("top1_target"),
        ])  # fmt: skip
    return table(head, lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--keep", type=Path, help="prepare into this folder, time nothing")
    p.add_argument("--retime", type=Path, help="time a --keep folder's flatbuffers only")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args(argv)
    if args.retime is not None and not (args.retime / "prepared.json").is_file():
        p.error(f"--retime: no prepared.json in {args.retime} (a --keep folder of an earlier run)")
    if args.retime is not None:
        cases = json.loads((args.retime / "prepared.json").read_text())
    elif args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        prepare(args.keep, args.epochs)
        log(f"prepared in {args.keep}; time it with --retime {args.keep}")
        return {}
    else:
        tmp = tempfile.TemporaryDirectory(prefix="int8-bench-")
        cases = prepare(Path(tmp.name), args.epochs)
    rows = time_cases(cases, args.rounds, args.runs)
    result = {"machine": machine(), "rounds": args.rounds, "runs": args.runs, "rows": rows}
    emit(result, f"{_text(rows)}\n\nmachine: {result['machine']}", args.json)
    return result


if __name__ == "__main__":
    main()
