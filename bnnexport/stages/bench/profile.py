"""Where the device's milliseconds go, by PyTorch layer (`bench --device --profile`).

`lce_benchmark_model --enable_op_profiling=true` prints one row per op, in run order
(`deploy.runners.lce_benchmark_model.OpTime`). An op the interpreter runs itself is named
`[TENSOR NAMES]:N`, N its index in the flatbuffer's execution plan; the float ops XNNPACK took
over are rows `Delegate/<XNNPACK op>:K`, K counting from 0 within each delegated partition (a
run of consecutive delegated ops). The tensor names are cut, so rows are matched by index:
`[...]:N` is op N; the delegate rows between two interpreter rows are the delegated ops
between those two ops, in order. Each op's layer comes from `converters.layer_map`.

`profile_change` sets two profiles side by side, layer by layer: what running the float layers
in int8 (`convert --float-layers int8`) changed where.

Example:
    >>> from bnnexport.stages.bench.profile import row_node
    >>> row_node("[add_6;mul_3;Conv2D_3;Sign_5;Sign_4;add_5;Const_9;C]:9")
    9
    >>> row_node("Delegate/Convolution (NHWC, F32) IGEMM:1") is None
    True
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

_INDEXED = re.compile(r"^\[.*\]:(\d+)$")
DELEGATE_PREFIX = "Delegate/"


def row_node(name: str) -> int | None:
    """The execution-plan index of an op the interpreter ran itself (`[...]:N`), else None."""
    match = _INDEXED.match(name.strip())
    return int(match.group(1)) if match else None


@dataclasses.dataclass
class LayerTime:
    """One source layer's share of the device's time: its ops' average ms summed."""

    layer: str
    ms: float
    share: float  # of the profiled total, 0..1
    op_types: list[str]
    binary: bool  # any of its ops is an LCE binary op (LceBconv2d, LceQuantize, ...)
    ops: list[int]  # flatbuffer op indices


@dataclasses.dataclass
class DeviceProfile:
    """The device's op profile by source layer, slowest first, with what could not be
    matched (`notes`)."""

    layers: list[LayerTime]
    total_ms: float
    threads: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def binary_share(self) -> float:
        """The share of the profiled time spent in binary layers."""
        return sum(t.share for t in self.layers if t.binary)

    def summary(self) -> str:
        """One line: binary against float time, and the slowest layers."""
        if not self.layers:
            return "device profile: no op rows to attribute"
        binary = 100 * self.binary_share
        top = ", ".join(f"{t.layer} {100 * t.share:.0f} %" for t in self.layers[:3])
        return (
            f"device profile: binary layers {binary:.0f} % of device time, float layers "
            f"{100 - binary:.0f} %; slowest: {top}"
        )

    def to_json(self) -> dict[str, Any]:
        """The profile as a JSON-ready dict."""
        return {**dataclasses.asdict(self), "binary_share": self.binary_share}


def row_ops(rows: list[dict[str, Any]], op_types: list[str]) -> tuple[list[int | None], list[str]]:
    """The flatbuffer op index of each profile row (None where none fits), and notes on what
    was matched by position only. `op_types[i]` is op i's type."""
    found: list[int | None] = [row_node(r["name"]) for r in rows]
    notes: list[str] = []
    k = 0
    while k < len(rows):
        if found[k] is not None or not rows[k]["name"].startswith(DELEGATE_PREFIX):
            k += 1
            continue
        end = k
        while end < len(rows) and found[end] is None:
            end += 1
        before = next((found[j] for j in range(k - 1, -1, -1) if found[j] is not None), -1)
        after = found[end] if end < len(rows) else len(op_types)
        # the ops the interpreter did not run itself between its two rows: the delegated ones
        ran = {n for n in found if n is not None}
        candidates = [i for i in range(before + 1, after) if i not in ran]
        if len(candidates) != end - k:
            notes.append(
                f"{end - k} XNNPACK rows for the {len(candidates)} delegated ops {before + 1}.."
                f"{after - 1}: matched by position"
            )
        for j in range(k, end):
            if candidates:
                found[j] = candidates[min(j - k, len(candidates) - 1)]
        k = end
    return found, notes


def profile_by_layer(
    rows: list[dict[str, Any]], flatbuffer: str | Path, onnx_model: str | Path | None = None
) -> DeviceProfile:
    """The op profile `rows` (`OpTime` dicts, run order) of `flatbuffer` summed per source
    layer (`converters.layer_map.op_layers`, with the ONNX model it came from when known)."""
    from bnnexport.converters.layer_map import op_layers

    mapped = op_layers(flatbuffer, onnx_model)
    indices, notes = row_ops(rows, [m.op_type for m in mapped])
    total = sum(r["avg_ms"] for r in rows)
    by_layer: dict[str, LayerTime] = {}
    unmatched = 0
    for row, index in zip(rows, indices, strict=True):
        if index is None or index >= len(mapped):
            unmatched += 1
            layer, binary = "(unmatched)", False
        else:
            layer, binary = mapped[index].layer or "(unnamed)", mapped[index].binary
        entry = by_layer.setdefault(layer, LayerTime(layer, 0.0, 0.0, [], False, []))
        entry.ms += row["avg_ms"]
        entry.binary |= binary
        if row["node_type"] not in entry.op_types:
            entry.op_types.append(row["node_type"])
        if index is not None:
            entry.ops.append(index)
    if unmatched:
        notes.append(f"{unmatched} profile row(s) match no op of {Path(flatbuffer).name}")
    for entry in by_layer.values():
        entry.share = entry.ms / total if total > 0 else 0.0
    layers = sorted(by_layer.values(), key=lambda t: t.ms, reverse=True)
    return DeviceProfile(layers, total, notes=notes)


def profile_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per source layer, the device's ms in two profiles (`DeviceProfile.to_json()`: the float
    flatbuffer's `before`, the int8 one's `after`) and their ratio, slowest before first, with
    a one-line summary: what int8 changed where."""
    old = {t["layer"]: t for t in before.get("layers", [])}
    new = {t["layer"]: t for t in after.get("layers", [])}
    rows = []
    for layer in sorted(old.keys() | new.keys(), key=lambda n: -old.get(n, {}).get("ms", 0.0)):
        was, now = old.get(layer, {}).get("ms", 0.0), new.get(layer, {}).get("ms", 0.0)
        binary = old.get(layer, new.get(layer, {})).get("binary", False)
        ratio = now / was if was > 0 else None
        rows.append({"layer": layer, "float_ms": was, "int8_ms": now, "ratio": ratio,
                     "binary": binary})  # fmt: skip
    float_before = sum(r["float_ms"] for r in rows if not r["binary"])
    float_after = sum(r["int8_ms"] for r in rows if not r["binary"])
    total_before, total_after = before.get("total_ms", 0.0), after.get("total_ms", 0.0)
    summary = "int8 device profile: no op rows to compare"
    if total_before > 0 and total_after > 0:
        summary = (
            f"int8 device profile: float layers {float_before:.3f} -> {float_after:.3f} ms, "
            f"binary layers {total_before - float_before:.3f} -> "
            f"{total_after - float_after:.3f} ms, total {total_before:.3f} -> "
            f"{total_after:.3f} ms ({total_after / total_before:.2f}x)"
        )
    return {"layers": rows, "summary": summary}
