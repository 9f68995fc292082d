"""How long does bnnexport take to convert a larq-zoo architecture, next to LCE's own converter,
and where does the time go? (issue 47, item 4: conversion time <= 2x native)

Each model (bnnexport's name; default every larq-zoo architecture of the zoo) is initialised
(`init`: ±1 kernels, randomised BatchNorm) and exported (`export`, `--samples` synthetic uniform
images: its own time, ONNX Runtime's check included, is the "export" stage) in this process.
Then, in `--rounds` interleaved rounds (the order of the two swapped every round), it is
converted by
- bnnexport: `bnnexport convert RUN --target arm64 --json` in a child process
  (`convert_scaling.convert_child`), its gate included; the report's `stage_seconds` say where
  the time went (load, normalise, import, translate, lce_converter, gate, twin:
  `converters.lce.STAGES`);
- native: larq-zoo's Keras model at the same size through LCE's `convert_keras_model` in the
  larq venv (`larq_side.py native`), timed around that call alone (model building and
  TensorFlow's import left out; bnnexport's report has its import as a stage of its own).

"convert / native" is the ratio of the medians; "(without import)" leaves TensorFlow's and LCE's
import out of ours, as the native side is timed after it; "export + convert / native" adds
the export, which a user of the native path does not run. Run heavy models under `nice`, and
read the load (both JSON `machine` entries): the ratio is side by side, the absolute times the
load's.

Run (from the repository root, with the main venv):
    .venv/bin/python benchmarks/convert_vs_native.py --models dorefanet --rounds 3
    .venv/bin/python benchmarks/convert_vs_native.py --size 64 --rounds 2 --json
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    LARQ_ZOO_NAMES,
    emit,
    larq_zoo_python,
    log,
    machine,
    native_flatbuffer,
    parser,
    table,
)
from bnnexport.converters.flatbuffer import op_kinds
from convert_scaling import convert_child, prepare

STAGES = ("export", "load", "normalise", "import", "translate", "lce_converter", "gate", "twin")


def one_round(name: str, size: int, run: Path, python: Path, ours_first: bool) -> dict:
    """One conversion each, ours and native, in the given order."""
    measured: dict[str, Any] = {}
    native = run.parent / "native.tflite"
    native.unlink(missing_ok=True)  # a failed native conversion leaves no earlier round's file
    for side in ("ours", "native") if ours_first else ("native", "ours"):
        if side == "ours":
            measured["ours"] = convert_child(run)
        else:
            measured["native"] = native_flatbuffer(name, size, native, python)
    # the op kinds of both (docs/BENCHMARKS.md "Op parity"), where each side wrote a flatbuffer
    for side, path in (("ours", run / "model-arm64.tflite"), ("native", native)):
        if path.is_file():
            measured[side]["op_kinds"] = op_kinds(path)
    return measured


def summary(name: str, size: int, rounds: list[dict], export: dict) -> dict[str, Any]:
    """Medians over rounds: native seconds, ours, ratios, and ours per stage."""
    native = [r["native"]["seconds"] for r in rounds if "seconds" in r["native"]]
    ours = [r["ours"]["convert_seconds"] for r in rounds if r["ours"]["convert_seconds"]]
    # the native side is timed after TensorFlow's import: ours without it too, beside the whole
    bare = [
        r["ours"]["convert_seconds"] - r["ours"]["stage_seconds"].get("import", 0.0)
        for r in rounds
        if r["ours"]["convert_seconds"]
    ]
    stages: dict[str, list[float]] = {}
    for r in rounds:
        for stage, seconds in (r["ours"].get("stage_seconds") or {}).items():
            stages.setdefault(stage, []).append(seconds)
    median = {k: statistics.median(v) for k, v in stages.items()}
    median["export"] = export["export_seconds"]
    n, o, b = (statistics.median(v) if v else None for v in (native, ours, bare))
    return {
        "model": name,
        "size": size,
        "native_seconds": n,
        "convert_seconds": o,
        "convert_seconds_without_import": b,
        "export_seconds": export["export_seconds"],
        "convert_over_native": o / n if n and o else None,
        "convert_without_import_over_native": b / n if n and b else None,
        "export_and_convert_over_native": (o + export["export_seconds"]) / n if n and o else None,
        "stage_seconds": median,
        "rounds": rounds,
        "native_error": next(
            (r["native"]["error"] for r in rounds if "error" in r["native"]), None
        ),
        "error": next((r["ours"]["error"] for r in rounds if r["ours"]["error"]), None),
    }


def text_report(rows: list[dict[str, Any]], result: dict[str, Any]) -> str:
    failed = [f"\n{r['model']}: FAILED: {r['error'][:300]}" for r in rows if "rounds" not in r]
    rows = [r for r in rows if "rounds" in r]
    return _table(rows, result) + "".join(failed)


def _table(rows: list[dict[str, Any]], result: dict[str, Any]) -> str:
    head = ["model", "size", "native s", "convert s", "export s", "convert / native",
            "(without import)", "export + convert / native",
            *(f"{s} s" for s in STAGES[1:])]  # fmt: skip
    cells = [
        [
            r["model"],
            r["size"],
            r["native_seconds"],
            r["convert_seconds"],
            r["export_seconds"],
            r["convert_over_native"],
            r["convert_without_import_over_native"],
            r["export_and_convert_over_native"],
            *(r["stage_seconds"].get(s) for s in STAGES[1:]),
        ]  # fmt: skip
        for r in rows
    ]
    notes = [
        f"{r['model']}: {r['error'] or r['native_error']}"
        for r in rows
        if r["error"] or r["native_error"]
    ]
    return (
        table(head, cells)
        + "".join(f"\n{n}" for n in notes)
        + f"\n\nmedians of {result['rounds']} interleaved rounds; load "
        f"{result['machine']['load_average']} -> {result['machine_after']['load_average']}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--models", default=",".join(LARQ_ZOO_NAMES), help="bnnexport model names")
    p.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--samples", type=int, default=16, help="export and convert check samples")
    args = p.parse_args(argv)
    python = larq_zoo_python(tf2onnx=False)
    result: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "models": []}
    with tempfile.TemporaryDirectory(prefix="bench-convert-native-") as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            run = Path(tmp) / name / "run"
            log(f"{name}@{args.size}: init + export")
            try:
                prepared = prepare(name, (3, args.size, args.size), run, args.samples)
            except Exception as error:  # noqa: BLE001 - one model's export must not end the rest
                log(f"{name}@{args.size}: FAILED before converting: {error}")
                result["models"].append({"model": name, "size": args.size, "error": str(error)})
                continue
            rounds = []
            for r in range(args.rounds):
                log(f"{name}@{args.size}: round {r + 1}/{args.rounds}, ours and native")
                rounds.append(one_round(name, args.size, run, python, ours_first=r % 2 == 0))
            row = summary(name, args.size, rounds, prepared)
            log(f"{name}@{args.size}: convert / native {row['convert_over_native']}")
            result["models"].append(row)
    result["machine_after"] = machine()
    emit(result, text_report(result["models"], result), args.json)
    return result


if __name__ == "__main__":
    main()
