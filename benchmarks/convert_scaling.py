"""How do conversion time and memory grow with the model? ONNX -> LCE, per model size.

Question: for models of growing size -- the default `mnist-bnn` (1x28x28), BinaryNet
(3x32x32) and Bi-Real-Net-18 (3x224x224) -- how long does `bnnexport convert --target arm64`
take, and how much memory does it need at its peak?

Each model is initialised and exported in this process (`init`, `export`), then every conversion
runs in its own child process (`python -m bnnexport convert RUN --target arm64 --json`), so its
peak resident memory is the child's own high-water mark (VmHWM, reported as it exits; its
`ru_maxrss` from `os.wait4` would include this process's size at the fork) and nothing is left
over from an earlier conversion. Time is the child's wall-clock time (TensorFlow's import included)
and, from the ConvertReport, the conversion itself (translation, LCE converter, fidelity gate).
When a model's export gate refuses it (PyTorch and ONNX Runtime disagree on the synthetic
samples), the ONNX model is written with the same exporter settings without the gate and the
conversion is still timed; the table says so, and a conversion whose own gate refuses the
flatbuffer is timed up to that refusal (child wall time and peak memory only).
`--repeat` converts each model that many times (children in turn: model A, B, C, A, B, C, ...)
and reports medians.

Run:
    .venv/bin/python benchmarks/convert_scaling.py                   # ~3-5 minutes
    .venv/bin/python benchmarks/convert_scaling.py --repeat 3 --json
    .venv/bin/python benchmarks/convert_scaling.py --models mnist-bnn,binarynet,quicknet@224
    .venv/bin/python benchmarks/convert_scaling.py --samples 50 --models \
        mnist-bnn,binarynet,binary-alexnet,xnornet,birealnet18,quicknet,quicknet-small  # native

"agree plain/resolved" is the LCE flatbuffer's argmax agreement with ONNX Runtime before and after
the convert gate replays LCE's own signs at rounding ties (`converters.gate`); "torch" the same
against PyTorch; "tie samples" counts the samples a replay explained at the export gate (PyTorch
vs ONNX Runtime) / the convert gate (LCE vs ONNX Runtime) / the samples checked, and "tie pos"
the signs imposed at the convert gate (all samples). "twin |diff|" is the largest difference
of the exact-grid twin's checks (0 = bit-exact).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, emit, log, machine, parser, synthetic_dataset, table

from bnnexport.errors import FidelityError
from bnnexport.models import model_info
from bnnexport.stages.export import export_onnx
from bnnexport.stages.init import init_run

DEFAULT = "mnist-bnn,binarynet@32,birealnet18@224"


def parse_models(spec: str) -> list[tuple[str, tuple[int, int, int]]]:
    """'name@size,...' -> [(name, (C, size, size))]; no @size = the model's native input."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, size = item.partition("@")
        shape = model_info(name).input_shape
        if size:
            shape = (shape[0], int(size), int(size))
        out.append((name, shape))
    return out


def prepare(name: str, shape: tuple[int, int, int], out: Path, samples: int = 16) -> dict[str, Any]:
    """init + export in this process; returns what describes the model's size."""
    dataset = (
        None if name == "mnist-bnn" else synthetic_dataset(shape, model_info(name).num_classes)
    )
    init = init_run(name, input_shape=shape, out=out, force=True, dataset=dataset)
    gate, ties = None, None
    start = time.perf_counter()
    try:
        ties = len(export_onnx(out, samples=samples).tie_samples)
    except FidelityError as error:  # keep measuring the conversion; say so in the table
        gate = str(error)
        log(f"{name}: export gate failed, exporting without it: {gate[:200]}")
        raw_export(out)
    return {
        "export_seconds": time.perf_counter() - start,  # its check included
        "parameters": init.parameters,
        "binary_parameters": init.binary_parameters,
        "binary_layers": init.binary_layers,
        "onnx_bytes": (out / "model.onnx").stat().st_size,
        "export_gate_error": gate,
        "export_sign_ties": ties,
    }


def raw_export(run: Path) -> None:
    """model.onnx with the export stage's exporter settings but without its fidelity gate."""
    import warnings

    import torch

    from bnnexport.run.checkpoint import load_model
    from bnnexport.run.directory import RunDir
    from bnnexport.run.samples import load_samples

    model = load_model(run)
    dummy = torch.from_numpy(load_samples(RunDir(run), 1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            dummy,
            str(run / "model.onnx"),
            dynamo=False,
            opset_version=17,
            do_constant_folding=False,
            input_names=["input"],
            output_names=["logits"],
        )


# Linux carries a forked child's resident set over into its ru_maxrss when it execs, so a child
# of this (large) process would report at least this process's size. The child reports its own
# high-water mark (VmHWM, which starts afresh at exec) as it exits instead.
PEAK_MARK = "bnnexport-peak-kib"
RUN_AND_REPORT_PEAK = f"""
import atexit, runpy, sys
def report_peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("{PEAK_MARK} " + line.split()[1] + "\\n")
atexit.register(report_peak)
sys.argv = ["bnnexport", *sys.argv[1:]]
runpy.run_module("bnnexport", run_name="__main__")
"""


def _reported_peak_mib(stderr: str) -> float | None:
    marks = [ln.split()[1] for ln in stderr.splitlines() if ln.startswith(PEAK_MARK)]
    return int(marks[-1]) / 1024 if marks else None


def convert_child(run: Path) -> dict[str, Any]:
    """`bnnexport convert` in a child process: wall seconds, peak RSS (MiB), its report."""
    for stale in run.glob("model-*.tflite"):
        stale.unlink()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUN_AND_REPORT_PEAK,
                "convert",
                str(run),
                "--target",
                "arm64",
                "--json",
            ],
            stdout=out,
            stderr=err,
            cwd=ROOT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    report = json.loads(lines[-1]) if child.returncode == 0 and lines else {}
    error = None
    if child.returncode != 0:  # the conversion ran; its gate (or something else) refused it
        lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith(PEAK_MARK)]
        error = (lines or ["?"])[-1][:300]
        log(f"convert {run.name} exited {child.returncode}: {error}")
    return {
        "wall_seconds": wall,
        "convert_seconds": report.get("seconds"),
        "stage_seconds": report.get("stage_seconds"),
        "peak_rss_mib": _reported_peak_mib(stderr) or usage.ru_maxrss / 1024,
        "lce_bytes": report.get("lce_bytes"),
        "lce_bconv2d": report.get("lce_bconv2d"),
        "binary_layers": report.get("binary_layers"),
        "argmax_agreement": report.get("argmax_agreement"),
        "resolved_argmax_agreement": _check(report, "ONNX Runtime", "argmax_agreement"),
        "torch_argmax_agreement": report.get("torch_argmax_agreement"),
        "torch_resolved_argmax_agreement": _check(report, "PyTorch", "argmax_agreement"),
        "sign_ties": len(report["tie_samples"]) if "tie_samples" in report else None,
        "tie_positions": report.get("tie_positions"),
        "twin_max_abs_diff": report.get("twin_max_abs_diff"),
        "samples": report.get("samples"),
        "exit_code": child.returncode,
        "error": error,
    }


def _check(report: dict[str, Any], reference: str, field: str) -> Any:
    """A field of the convert gate's check of LCE against `reference`, if it ran."""
    for check in report.get("checks", []):
        if check["reference"] == reference and check["candidate"] == "LCE":
            return check[field]
    return None


def _pair(a: Any, b: Any) -> str:
    return "-" if a is None else f"{a:.3g}/{b:.3g}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument(
        "--models", default=DEFAULT, help=f"comma-separated name[@size] (default {DEFAULT})"
    )
    p.add_argument("--repeat", type=int, default=1, help="conversions per model (default 1)")
    p.add_argument(
        "--samples",
        type=int,
        default=16,
        help="samples the export and convert gates check (default 16)",
    )
    args = p.parse_args(argv)
    models = parse_models(args.models)
    result: dict[str, Any] = {"machine": machine(), "repeat": args.repeat, "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        runs = {}
        for name, shape in models:
            key = f"{name}@{shape[1]}"
            log(f"{key}: init + export")
            runs[key] = (Path(tmp) / key, shape)
            result["models"][key] = {
                "input_shape": list(shape),
                **prepare(name, shape, runs[key][0], args.samples),
            }
        samples: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
        for r in range(args.repeat):
            for key, (run, _) in runs.items():
                log(f"{key}: convert ({r + 1}/{args.repeat}) in a child process")
                samples[key].append(convert_child(run))
    rows, notes = [], []
    for key, measured in samples.items():
        entry = result["models"][key]
        for field in ("wall_seconds", "convert_seconds", "peak_rss_mib"):
            values = [m[field] for m in measured if m[field] is not None]
            entry[field] = statistics.median(values) if values else None
        last = (
            "lce_bytes",
            "lce_bconv2d",
            "error",
            "argmax_agreement",
            "resolved_argmax_agreement",
            "torch_argmax_agreement",
            "torch_resolved_argmax_agreement",
            "sign_ties",
            "tie_positions",
            "twin_max_abs_diff",
            "samples",
        )
        entry.update({k: measured[-1][k] for k in last})
        entry["all"] = measured
        lce_mb = entry["lce_bytes"] / 1e6 if entry["lce_bytes"] else None
        bconv = f"{entry['lce_bconv2d']}/{entry['binary_layers']}" if lce_mb else "-"
        rows.append(
            [
                key,
                "x".join(map(str, entry["input_shape"])),
                entry["parameters"],
                entry["onnx_bytes"] / 1e6,
                lce_mb,
                bconv,
                _pair(entry["argmax_agreement"], entry["resolved_argmax_agreement"]),
                _pair(entry["torch_argmax_agreement"], entry["torch_resolved_argmax_agreement"]),
                f"{entry['export_sign_ties']}/{entry['sign_ties']}/{entry['samples']}",
                entry["tie_positions"],
                entry["twin_max_abs_diff"],
                entry["convert_seconds"],
                entry["wall_seconds"],
                entry["peak_rss_mib"],
                "ok"
                if not entry["error"]
                else "refused by gate"
                if "FidelityError" in str(entry["error"]) or "disagree" in str(entry["error"])
                else "failed",
            ]
        )
        if entry["export_gate_error"] or entry["error"]:
            notes.append(
                f"{key}: export gate: {entry['export_gate_error'] or 'passed'}; "
                f"convert: {entry['error'] or 'passed'}"
            )
    text = table(
        [
            "model",
            "input",
            "parameters",
            "onnx MB",
            "lce MB",
            "bconv/binary",
            "agree plain/resolved",
            "torch plain/resolved",
            "tie samples export/convert/of",
            "tie pos",
            "twin |diff|",
            "convert s",
            "child wall s",
            "peak RSS MiB",
            "gate",
        ],
        rows,
    )
    text += "".join(f"\n{n}" for n in notes)
    text += (
        f"\n\none child process per conversion (medians of {args.repeat}); "
        f"load {result['machine']['load_average']}"
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
