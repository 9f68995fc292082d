"""The real-client table of docs/BENCHMARKS.md: convert every row of
tests/support/client_nets.py (and
the tf2onnx-style larq graph of tests/support/tf2onnx_nets.py) and print one Markdown row each.

    PYTHONPATH=. .venv/bin/python scripts/real_clients.py [--rows ID,ID...] > table.md

Conversion time is `convert_onnx`'s own (normalise, translate, LCE, the gate, the twin), on
16 standard-normal samples; the export is not counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="comma-separated row ids (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import onnx
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import tf
    from support.client_nets import ROWS, export_onnx, sample_inputs
    from support.tf2onnx_nets import larq_like

    tf()  # TensorFlow's and LCE's import time is not the first row's conversion time
    import larq_compute_engine  # noqa: F401

    wanted = set(filter(None, args.rows.split(",")))
    print("| client | model | exporter | binary layers | LceBconv2d | plain agreement (ORT) "
          "| tie samples | rewrites | conversion s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(r.id, r.client, r.model, r.exporter, r.build) for r in ROWS]
        jobs.append(("tf2onnx-larq-like", "tf2onnx (helper-built)", "larq-like QuickNet block",
                     "tf2onnx 1.17 form", larq_like))  # fmt: skip
        for row_id, client, name, exporter, build in jobs:
            if wanted and row_id not in wanted:
                continue
            path = Path(tmp) / f"{row_id}.onnx"
            model, shape = build()
            if isinstance(model, onnx.ModelProto):
                onnx.save(model, str(path))
            else:
                export_onnx(model, shape, path, exporter)
            start = time.perf_counter()
            result = convert_onnx(path, path.with_suffix(".tflite"), inputs=sample_inputs(shape))
            seconds = time.perf_counter() - start
            gate = result.gate("ONNX Runtime")
            rewrites = ", ".join(f"{k} {v}" for k, v in result.normalized.applied.items()
                                 if k not in ("fold-constants", "drop-noise"))  # fmt: skip
            cells = [client, name, exporter, result.binary_layers, result.lce_bconv2d,
                     f"{gate.plain_argmax_agreement:.4g}", len(gate.tie_samples), rewrites,
                     f"{seconds:.1f}"]  # fmt: skip
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
