"""Is a grouped binary convolution worth it on the host? LCE latency of one block, side by side.

Question: a block of two 3x3 convs with `--channels` channels on a `--size` x `--size` input
(binarize -> conv -> BatchNorm, twice; +1 padding, so LCE keeps the first conv's output
bit-packed), written in plain torch with groups=1, 4 and 8 by default (`--groups`; 32 and 16
input channels per group at 128 channels), binary and float, is converted by
`bnnexport.convert_module` (the whole gate) and the flatbuffers are timed in LCE's interpreter
(1 thread, indirect BGEMM, as `bench` runs them), interleaved. Binary grouped convs are one
LceBconv2d per group on a channel slice (the form LCE's default kernels run); float grouped
convs one CONV_2D per group (`converters/translate/groups.py`, docs/LCE_NOTES.md "Grouped
convolutions"). With `--lce-grouped`, binary blocks whose groups hold a multiple of 32 channels
are also converted the way LCE's own converter writes them, one grouped LceBconv2d per conv
(rows "... one op"), which only indirect BGEMM and the reference kernel run: the translator's
group plan is replaced for that conversion, nothing else. Ratios are against the binary groups=1
block.

Run:
    .venv/bin/python benchmarks/grouped_latency.py
    .venv/bin/python benchmarks/grouped_latency.py --channels 256 --size 16 --rounds 20 --json
    .venv/bin/python benchmarks/grouped_latency.py --groups 2,4 --lce-grouped
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

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


@contextlib.contextmanager
def one_grouped_op() -> Iterator[None]:
    """The translator writes a grouped binary conv as one conv with the grouped filter, from
    which LCE's converter makes one grouped LceBconv2d (groups of a multiple of 32 channels)."""
    from bnnexport.converters.translate import groups, tf_layers

    def plan(in_channels: int, count: int) -> groups.GroupPlan:
        return groups.GroupPlan("single", count)

    with mock.patch.object(tf_layers, "plan_binary_groups", plan):
        yield


def measure(
    channels: int, size: int, groups_list: list[int], rounds: int, runs: int,
    lce_grouped: bool = False,
) -> dict[str, Any]:  # fmt: skip
    from bnnexport.converters.flatbuffer import input_layout, to_input_layout
    from bnnexport.converters.runtimes import lce_interpreter

    from bnnexport import convert_module

    contenders = [(binary, groups, False) for binary in (True, False) for groups in groups_list]
    if lce_grouped:
        contenders += [
            (True, g, True) for g in groups_list if g > 1 and (channels // g) % 32 == 0
        ]  # fmt: skip
    x = np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)
    calls, rows = {}, {}
    with tempfile.TemporaryDirectory(prefix="grouped-") as tmp:
        for binary, groups, one_op in contenders:
            name = f"{'binary' if binary else 'float'} g={groups}{' one op' if one_op else ''}"
            log(f"converting {name}")
            torch.manual_seed(0)
            block = Block(channels, groups, binary).eval()
            out = Path(tmp) / f"{name.replace(' ', '-').replace('=', '')}.tflite"
            form = one_grouped_op() if one_op else contextlib.nullcontext()
            with warnings.catch_warnings(), form:
                warnings.simplefilter("ignore")
                report = convert_module(block, torch.from_numpy(x), out=out, samples=8)
            interpreter = lce_interpreter(out.read_bytes())
            fed = to_input_layout(x, input_layout(out))  # NHWC: convert_module's default
            calls[name] = lambda i=interpreter, fed=fed: i.predict(fed)
            rows[name] = {
                "binary": binary,
                "groups": groups,
                "channels_per_group": channels // groups,
                "lce_bconv2d": report.lce_bconv2d,
                "conv_2d": report.float_conv2d,
                "lce_bytes": report.lce_bytes,
                "agreement": report.argmax_agreement,
                "lce_settings": report.lce_settings,
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
    p.add_argument("--lce-grouped", action="store_true",
                   help="also time LCE's one grouped LceBconv2d (indirect BGEMM only)")  # fmt: skip
    args = p.parse_args()
    torch.set_num_threads(1)
    groups = sorted({1, *(int(g) for g in args.groups.split(","))})
    rows = measure(args.channels, args.size, groups, args.rounds, args.runs, args.lce_grouped)
    result = {"machine": machine(), "channels": args.channels, "size": args.size, "rows": rows}
    head = ["block", "ch/group", "LceBconv2d", "CONV_2D", "median ms", "min ms", "x binary g=1",
            "LCE settings"]  # fmt: skip
    text = table(head, [
        [name, r["channels_per_group"], r["lce_bconv2d"], r["conv_2d"], r["median"], r["min"],
         r["ratio_vs_binary_g1"], ", ".join(f"{k}={v}" for k, v in r["lce_settings"].items())
         or "default"]
        for name, r in rows.items()
    ])  # fmt: skip
    emit(result, f"{text}\n\nmachine: {result['machine']}", args.json)


if __name__ == "__main__":
    main()
