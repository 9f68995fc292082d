"""Op parity: does any bnnexport flatbuffer of a larq-zoo architecture carry an op kind more often
than LCE's own conversion of larq-zoo's Keras model? (issue 47, item 1)

The native side: larq-zoo's model (`weights=None`, seed 0, random BatchNorm statistics, its
final softmax removed: bnnexport's zoo models end at the logits) at `--sizes` (default 64 and
its native 224) through LCE's `convert_keras_model`, in the larq venv (`larq_side.py native`,
docs/BENCHMARKS.md "The larq virtual environment"; larq-zoo is added on first use). Each
flatbuffer's op histogram and its op kinds (`converters.flatbuffer.op_kinds`: a global average
pool, MEAN or AVERAGE_POOL_2D, is one kind; LceBMaxPool2d counts as MAX_POOL_2D) are written
with `--write` to benchmarks/data/native_ops.json, with where they came from (this script,
the versions, the date, the machine). `tests/converters/gate/test_matrix.py` compares
bnnexport's flatbuffers with that committed data.

With `--ours`, bnnexport's side too: each model initialised (`init`: ±1 kernels, randomised
BatchNorm), exported and converted through the whole gate (`convert --target arm64`), and the
op kinds it has more often than native printed (the extra-op table of docs/BENCHMARKS.md "Op
parity"). TRANSPOSE, the NCHW input turned NHWC inside the model, is issue 47's item 2 and is
listed apart.

Run (from the repository root, with the main venv):
    .venv/bin/python benchmarks/native_ops.py --write             # every model, 64 and 224
    .venv/bin/python benchmarks/native_ops.py --ours --sizes 64 --models meliusnet22 --json
"""

from __future__ import annotations

import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    LARQ_ZOO_NAMES,
    ROOT,
    emit,
    larq_json,
    larq_zoo_python,
    log,
    machine,
    native_flatbuffer,
    parser,
    table,
    torch_pipeline,
)
from bnnexport.converters.flatbuffer import kinds_beyond, op_histogram, op_kinds

DATA = ROOT / "benchmarks" / "data" / "native_ops.json"
# the NCHW input's TRANSPOSE: issue 47's item 2 (the NHWC input), not a fold of this item
INPUT_LAYOUT_OPS = ("TRANSPOSE",)


def native_row(model: str, size: int, work: Path, python: Path) -> dict[str, Any]:
    """The native flatbuffer of `model` at `size`: histogram, kinds, bytes, conversion time."""
    out = work / f"{model}-{size}-native.tflite"
    side = native_flatbuffer(model, size, out, python)
    if "error" in side:
        log(f"[{model}@{size}] native: {side['error']}")
        return {"error": side["error"]}
    log(f"[{model}@{size}] native: {side['bytes']} bytes in {side['seconds']:.1f} s")
    return {
        "op_histogram": op_histogram(out),
        "op_kinds": op_kinds(out),
        "bytes": side["bytes"],
        "convert_keras_model_seconds": round(side["seconds"], 2),
        "keras_binary_layers": side["keras_binary_layers"],
        "versions": side["versions"],
    }


def our_row(model: str, size: int, work: Path, native: dict[str, Any]) -> dict[str, Any]:
    """bnnexport's flatbuffer of `model` at `size` (init, export, convert through the gate)
    and the op kinds it has more often than `native`."""
    channels = 3
    made = torch_pipeline(model, work / f"{model}-{size}", input_shape=(channels, size, size))
    flatbuffer = Path(made["convert"].output)
    kinds = op_kinds(flatbuffer)
    beyond = kinds_beyond(kinds, native.get("op_kinds", {}))
    return {
        "op_kinds": kinds,
        "bytes": flatbuffer.stat().st_size,
        "extra": {k: v for k, v in beyond.items() if k not in INPUT_LAYOUT_OPS},
        "input_layout_ops": {k: v for k, v in beyond.items() if k in INPUT_LAYOUT_OPS},
        "seconds": made["seconds"],
    }


def sizes_of(args: Any) -> list[int]:
    return sorted({int(s) for s in args.sizes.split(",") if s.strip()})


def source(data: dict[str, Any], args: Any, versions: dict[str, Any]) -> dict[str, Any]:
    """Where the data came from: what a reader needs to make it again; each --write run adds
    its command, date and machine (with its load) to `runs`."""
    runs = data.get("source", {}).get("runs", [])
    run = {
        "command": f"benchmarks/native_ops.py --write --models {args.models} --sizes {args.sizes}",
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "versions": versions,
    }
    return {
        "script": "benchmarks/native_ops.py",
        "native_model": "larq-zoo model, weights=None, seed 0, random BatchNorm statistics "
        "(larq_side.randomize_batchnorm), final softmax removed; convert_keras_model defaults",
        "runs": [*runs, run],
    }


def write_data(result: dict[str, Any], args: Any, python: Path) -> None:
    """Merge this run's native rows into benchmarks/data/native_ops.json."""
    data = json.loads(DATA.read_text()) if DATA.is_file() else {"models": {}}
    data["source"] = source(data, args, larq_json(["versions"], python=python))
    for model, rows in result["models"].items():
        entry = data["models"].setdefault(model, {"larq_zoo": LARQ_ZOO_NAMES[model], "sizes": {}})
        for size, row in rows.items():
            native = {k: v for k, v in row["native"].items() if k != "versions"}
            entry["sizes"][str(size)] = native
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    log(f"wrote {DATA.relative_to(ROOT)}")


def text_report(result: dict[str, Any]) -> str:
    rows = []
    for model, by_size in result["models"].items():
        for size, row in by_size.items():
            native, ours = row["native"], row.get("ours")
            if "error" in native:
                rows.append([model, size, f"native: {native['error'][:60]}", "-", "-"])
                continue
            if ours is not None and "error" in ours:
                rows.append([model, size, f"ours: {ours['error'][:60]}", "-", native["bytes"]])
                continue
            extra = "-" if ours is None else _pairs(ours["extra"]) or "none"
            layout = "-" if ours is None else _pairs(ours["input_layout_ops"]) or "none"
            rows.append([model, size, extra, layout, native["bytes"]])
    head = ["model", "size", "op kinds more often than native (ours/native)", "input layout",
            "native bytes"]  # fmt: skip
    return table(head, rows)


def _pairs(beyond: dict[str, Any]) -> str:
    return ", ".join(f"{k} {a}/{b}" for k, (a, b) in beyond.items())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--models", default=",".join(LARQ_ZOO_NAMES), help="bnnexport model names")
    p.add_argument("--sizes", default="64,224", help="input sizes (default 64,224)")
    p.add_argument("--write", action="store_true", help=f"write the native rows to {DATA.name}")
    p.add_argument("--ours", action="store_true", help="convert bnnexport's side and compare")
    p.add_argument("--keep", type=Path, help="keep the flatbuffers (and runs) in this folder")
    args = p.parse_args(argv)
    python = larq_zoo_python(tf2onnx=False)
    result: dict[str, Any] = {"machine": machine(), "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-native-ops-") as scratch:
        tmp = args.keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            for size in sizes_of(args):
                start = time.perf_counter()
                row: dict[str, Any] = {"native": native_row(model, size, Path(tmp), python)}
                if args.ours:
                    try:
                        row["ours"] = our_row(model, size, Path(tmp), row["native"])
                    except Exception as error:  # noqa: BLE001 - one model must not hide the rest
                        row["ours"] = {"error": f"{type(error).__name__}: {error}"[:300]}
                log(f"[{model}@{size}] done in {time.perf_counter() - start:.0f} s")
                result["models"].setdefault(model, {})[size] = row
    result["machine_after"] = machine()
    if args.write:
        write_data(result, args, python)
    emit(result, text_report(result), args.json)
    return result


if __name__ == "__main__":
    main()
