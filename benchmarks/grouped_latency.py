"""Is a grouped binary convolution worth it on the host? LCE latency of one block, side by side.

Question: a block of two 3x3 convs with `--channels` channels on a `--size` x `--size` input
(binarize -> conv -> BatchNorm, twice; +1 padding, so LCE keeps the first conv's output
bit-packed), written in plain torch with groups=1, 4 and 8 by default (`--groups`; 32 and 16
input channels per group at 128 channels), binary and float, is converted by
`bnnexport.convert_module` (the whole gate) and the flatbuffers are timed in LCE's interpreter
(1 thread, indirect BGEMM, as `bench` runs them), interleaved. Binary groups of 32 channels are
one grouped LceBconv2d per conv; groups of 16 one LceBconv2d per group on a channel slice; float
grouped convs one CONV_2D per group (`converters/translate/groups.py`, docs/LCE_NOTES.md "Grouped
convolutions"). Ratios are against the binary groups=1 block.

Run:
    .venv/bin/python benchmarks/grouped_latency.py
    .venv/bin/python benchmarks/grouped_latency.py --channels 256 --size 16 --rounds 20 --json
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import emit, interleaved, log, machine, parser, table


class Block(nn.Module):
    """(binarize ->) +1 pad -> 3x3 conv (groups) -> BatchNorm, twice."""

    def __init__(self, channels: int, groups: int, binary: bool):
        super().__init__()
        self.binary = binary
        self.convs = nn.ModuleList(
            nn.Conv2d(channels, channels, 3, groups=groups, bias=False) for _ in range(2)
        )
        self.bns = nn.ModuleList(nn.BatchNorm2d(channels) for _ in range(2))
        g = torch.Generator().manual_seed(groups)
        with torch.no_grad():
            for conv, bn in zip(self.convs, self.bns, strict=True):
                if binary:
                    conv.weight.copy_(torch.where(conv.weight >= 0, 1.0, -1.0))
                bn.running_mean.copy_(torch.randn(channels, generator=g))
                bn.running_var.copy_(torch.rand(channels, generator=g) + 0.5)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns, strict=True):
            if self.binary:
                x = F.pad(torch.sign(torch.sign(x) + 0.1), (1, 1, 1, 1), value=1.0)
            else:
                x = F.pad(x, (1, 1, 1, 1))
            x = bn(conv(x))
        return x


def measure(
    channels: int, size: int, groups_list: list[int], rounds: int, runs: int
) -> dict[str, Any]:
    from bnnexport import convert_module
    from converters.runtimes import lce_interpreter

    contenders = [(binary, groups) for binary in (True, False) for groups in groups_list]
    x = np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)
    calls, rows = {}, {}
    with tempfile.TemporaryDirectory(prefix="grouped-") as tmp:
        for binary, groups in contenders:
            name = f"{'binary' if binary else 'float'} g={groups}"
            log(f"converting {name}")
            torch.manual_seed(0)
            block = Block(channels, groups, binary).eval()
            out = Path(tmp) / f"{name.replace(' ', '-').replace('=', '')}.tflite"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = convert_module(block, torch.from_numpy(x), out=out, samples=8)
            interpreter = lce_interpreter(out.read_bytes())
            calls[name] = lambda i=interpreter: i.predict(x)
            rows[name] = {
                "binary": binary,
                "groups": groups,
                "channels_per_group": channels // groups,
                "lce_bconv2d": report.lce_bconv2d,
                "conv_2d": report.float_conv2d,
                "lce_bytes": report.lce_bytes,
                "agreement": report.argmax_agreement,
            }
        log("timing")
        times = interleaved(calls, rounds=rounds, runs=runs, warmup=5)
    base = times["binary g=1"]["median"]
    for name, row in rows.items():
        row.update(times[name])
        row["ratio_vs_binary_g1"] = row["median"] / base
    return rows


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--groups", default="1,4,8", help="comma-separated; 1 comes first")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    groups = sorted({1, *(int(g) for g in args.groups.split(","))})
    rows = measure(args.channels, args.size, groups, args.rounds, args.runs)
    result = {"machine": machine(), "channels": args.channels, "size": args.size, "rows": rows}
    head = ["block", "ch/group", "LceBconv2d", "CONV_2D", "median ms", "min ms", "x binary g=1"]
    text = table(head, [
        [name, r["channels_per_group"], r["lce_bconv2d"], r["conv_2d"], r["median"], r["min"],
         r["ratio_vs_binary_g1"]]
        for name, r in rows.items()
    ])  # fmt: skip
    emit(result, f"{text}\n\nmachine: {result['machine']}", args.json)


if __name__ == "__main__":
    main()
