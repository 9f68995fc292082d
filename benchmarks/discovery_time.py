"""How long does deciding a model's binary kernels take? The one discovery, zoo model by model.

Question: the record of binary kernels (`bnnexport.nn.discover.find_binary_kernels`) is decided
when a run starts, from one traced forward pass of a marked copy of the model. For every zoo
model at its native input size: the seconds of the first call in the process and the median of
`--repeats` more, on one thread, with the kernels and binary parameters it found.

The discovery it replaced exported the model to ONNX and normalised it; that code is gone, so
its figures come from the commit before the change (docs/BENCHMARKS.md "Discovery time" gives
the command that times both side by side).

Run:
    .venv/bin/python benchmarks/discovery_time.py                 # about a minute
    .venv/bin/python benchmarks/discovery_time.py --models birealnet18 --json
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from _common import emit, log, machine, parser, table

from bnnexport.models import create_model, list_models
from bnnexport.nn.discover import find_binary_kernels


def time_discovery(name: str, repeats: int) -> dict[str, Any]:
    """The first call's seconds and the median of `repeats` more, for zoo model `name`."""
    model = create_model(name).eval()
    start = time.perf_counter()
    record = find_binary_kernels(model)
    first = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        find_binary_kernels(model)
        seconds.append(time.perf_counter() - start)
    shape = model.bnnexport_config["input_shape"]
    return {"model": name, "input": "x".join(map(str, shape)), "kernels": len(record),
            "binary_parameters": record.parameters, "first_s": first,
            "median_s": statistics.median(seconds)}  # fmt: skip


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--models", default=",".join(list_models()))
    args_parser.add_argument("--repeats", type=int, default=3)
    args = args_parser.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(list_models()))
    if unknown:
        args_parser.error(
            f"--models: unknown {', '.join(unknown)}; known: {', '.join(list_models())}"
        )
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        log(f"{name} ...")
        rows.append(time_discovery(name, args.repeats))
    head = ["model", "input", "kernels", "binary_parameters", "first_s", "median_s"]
    text = table(head, [[row[k] for k in head] for row in rows])
    emit({"machine": machine(), "rows": rows}, text, args.json)


if __name__ == "__main__":
    main()
