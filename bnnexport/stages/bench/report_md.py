"""RUN_DIR/report.md: the bench results for people, with latency, size and accuracy plots.

The plots are PNGs next to the report (bench_latency.png, bench_size.png, bench_accuracy.png);
the training curves written by `train` (accuracy.png, flip_rate.png) are embedded when present.

Example:
    >>> from bnnexport.stages.bench.measure import bench
    >>> report = bench("runs/demo", write_report=False)             # doctest: +SKIP
    >>> write_report(report, "runs/demo")                           # doctest: +SKIP
    [PosixPath('runs/demo/report.md'), PosixPath('runs/demo/bench_latency.png'), ...]
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from bnnexport.run.files import write_bytes_atomic
from bnnexport.stages.report import pyplot, save_figure_atomic


def _tick_label(backend: Any) -> str:
    """The x-axis label of a backend's bar: its name, and where it ran when not on the host."""
    return backend.name if backend.where == "host" else f"{backend.name}\n@{backend.where}"


def _bar(
    path: Path,
    labels: list[str],
    values: list[float],
    ylabel: str,
    title: str,
    errors: list[list[float]] | None = None,
    log: bool = False,
) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(labels)), 3.6))
    bars = ax.bar(labels, values, yerr=errors, capsize=4, color="#4c72b0")
    ax.bar_label(bars, fmt="%.3g", padding=2)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_bench(report: Any, out: Path, prefix: str = "") -> list[Path]:
    """Write the bench plots into `out` (names start with `prefix`); return their paths."""
    written = []
    timed = [b for b in report.backends if b.latency_ms.get("mean") is not None]
    if timed:
        centre, whiskers = _latency_bars(timed)
        title = f"Batch-1 latency, {report.threads} thread(s): median (min..p90)"
        labels = [_tick_label(b) for b in timed]
        written.append(
            _bar(out / f"{prefix}bench_latency.png", labels, centre, "ms", title, whiskers)
        )
    sized = {name: size / 1024 for name, size in report.files.items()}
    if sized:
        log = max(sized.values()) > 20 * min(sized.values())
        sizes = list(sized.values())
        path = out / f"{prefix}bench_size.png"
        written.append(_bar(path, list(sized), sizes, "KB", "Model file size", log=log))
    scaling = _thread_scaling(report.backends)
    if len(scaling) > 1:
        written.append(_scaling_plot(out / f"{prefix}bench_device_threads.png", scaling))
    layers = (getattr(report, "profile", None) or {}).get("layers")
    if layers:
        written.append(_layer_plot(out / f"{prefix}bench_device_layers.png", layers, report))
    scored = [b for b in report.backends if b.top1 is not None]
    if scored:
        title = f"Top-1 accuracy on {report.samples} test samples"
        top1 = [100 * b.top1 for b in scored]
        labels = [_tick_label(b) for b in scored]
        written.append(_bar(out / f"{prefix}bench_accuracy.png", labels, top1, "top-1 %", title))
    return written


def _thread_scaling(backends: list[Any]) -> dict[int, Any]:
    """Thread count -> the device's LCE row measured at it (`bench --threads 1,2,4`)."""
    return {
        b.extra["threads"]: b
        for b in backends
        if b.where != "host" and b.extra.get("threads") and b.name.startswith("lce")
        and b.latency_ms.get("mean") is not None
    }  # fmt: skip


def _scaling_plot(path: Path, scaling: dict[int, Any]) -> Path:
    """Mean (and min) batch-1 latency on the device against its thread count, with the
    speed-up over the fewest threads written at each point."""
    plt = pyplot()
    threads = sorted(scaling)
    mean = [scaling[t].latency_ms["mean"] for t in threads]
    low = [scaling[t].latency_ms.get("min") or m for t, m in zip(threads, mean, strict=True)]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(threads, mean, "o-", color="#4c72b0", label="mean")
    ax.plot(threads, low, "s--", color="#55a868", label="min")
    for t, m in zip(threads, mean, strict=True):
        ax.annotate(f"{mean[0] / m:.2f}x", (t, m), textcoords="offset points", xytext=(4, 6))
    ax.set_xticks(threads)
    ax.set_xlabel("threads (--num_threads)")
    ax.set_ylabel("ms")
    ax.set_title(f"LCE batch-1 latency on {scaling[threads[0]].where}")
    ax.legend()
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return path


BINARY_COLOUR, FLOAT_COLOUR = "#4c72b0", "#dd8452"


def _layer_plot(path: Path, layers: list[dict[str, Any]], report: Any) -> Path:
    """The device's time per PyTorch layer as horizontal bars, slowest at the top, binary
    layers and float layers in two colours."""
    plt = pyplot()
    from matplotlib.patches import Patch

    shown = layers[:30]  # the slowest; the table in report.md lists them all
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.32 * len(shown) + 1.2)))
    colours = [BINARY_COLOUR if t["binary"] else FLOAT_COLOUR for t in shown]
    bars = ax.barh([t["layer"] for t in shown], [t["ms"] for t in shown], color=colours)
    ax.bar_label(bars, labels=[f"{100 * t['share']:.1f} %" for t in shown], padding=2)
    ax.invert_yaxis()
    ax.set_xlabel("ms per inference (op profile, average)")
    where = report.device.get("destination") if report.device else "the device"
    ax.set_title(f"Where the time goes on {where}, by PyTorch layer")
    ax.legend(handles=[Patch(color=BINARY_COLOUR, label="binary"),
                       Patch(color=FLOAT_COLOUR, label="float")], loc="lower right")  # fmt: skip
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return path


def _profile_section(profile: dict[str, Any] | None, device: dict[str, Any] | None) -> list[str]:
    """The device's time per PyTorch layer (`bench --profile`), slowest first."""
    if profile is None:
        return []
    where = device.get("destination") if device else "the device"
    lines = ["", f"## Time by PyTorch layer on {where}", "", profile["summary"] + "."]
    if profile["layers"]:
        lines += [
            "",
            f"Average of the op profile over the batch-1 latency run "
            f"({profile.get('threads') or 1} thread(s)); total {profile['total_ms']:.3f} ms.",
            "",
            "| layer | ms | share | kind | op types | flatbuffer ops |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {t['layer']} | {t['ms']:.3f} | {100 * t['share']:.1f} % | "
            f"{'binary' if t['binary'] else 'float'} | {', '.join(t['op_types'])} | "
            f"{', '.join(str(i) for i in t['ops'])} |"
            for t in profile["layers"]
        ]
    lines += [f"\nNote: {note}." for note in profile["notes"]]
    return lines


def _int8_change_section(int8_profile: dict[str, Any] | None) -> list[str]:
    """Per PyTorch layer, the device's ms in the float and in the int8 flatbuffer."""
    if int8_profile is None:
        return []
    change = int8_profile["change"]
    lines = ["", "## What int8 changed, by PyTorch layer", "", change["summary"] + "."]
    if change["layers"]:
        lines += [
            "",
            "| layer | kind | float ms | int8 ms | int8 / float |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['layer']} | {'binary' if r['binary'] else 'float'} | {r['float_ms']:.3f} | "
            f"{r['int8_ms']:.3f} | {'-' if r['ratio'] is None else format(r['ratio'], '.2f')} |"
            for r in change["layers"]
        ]
    lines += [f"\nNote: {note}." for note in int8_profile["notes"]]
    return lines


def _latency_bars(timed: list[Any]) -> tuple[list[float], list[list[float]]]:
    """Bar = median (mean where the tool gives no median); whiskers down to min, up to p90."""
    centre = [b.latency_ms.get("median") or b.latency_ms["mean"] for b in timed]
    pairs = list(zip(timed, centre, strict=True))
    low = [max(c - (b.latency_ms.get("min") or c), 0.0) for b, c in pairs]
    high = [max((b.latency_ms.get("p90") or c) - c, 0.0) for b, c in pairs]
    return centre, [low, high]


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def render_markdown(report: Any, plots: list[Path], out: Path, curves: bool = True) -> str:
    """The report text: tables, the device's identity and op profile, plot links (and a run's
    training curves, with `curves`)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Benchmark of `{report.run_dir}`",
        "",
        f"{now}. {_samples_said(report)}, {report.runs} timed runs at batch 1 after warm-up, "
        f"{report.threads} thread(s). Agreement is with the first row on the same samples.",
        "",
        *_backend_table(report.backends),
        *_file_table(report.files),
        *_machines(report.host, report.device),
    ]
    for backend in report.backends:
        lines += _device_sections(backend)
    lines += _profile_section(getattr(report, "profile", None), report.device)
    lines += _int8_change_section(getattr(report, "int8_profile", None))
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    found = [n for n in ("accuracy.png", "flip_rate.png") if curves and (out / n).is_file()]
    if found:
        lines += ["", "## Training", ""] + [f"![{Path(c).stem}]({c})" for c in found]
    return "\n".join(lines) + "\n"


def _samples_said(report: Any) -> str:
    if getattr(report, "random_inputs", False):
        return f"{report.samples} random standard-normal inputs (no labels: no accuracy)"
    return f"{report.samples} test samples"


def _backend_table(backends: list[Any]) -> list[str]:
    lines = [
        "| backend | where | top-1 | top-5 | argmax agreement | max abs diff | median ms "
        "| p90 ms | mean ms | std ms | min ms | size KB | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in backends:
        lat = b.latency_ms
        size = None if b.size_bytes is None else b.size_bytes / 1024
        lines.append(
            f"| {b.name} | {b.where} | {_fmt(b.top1, '.4f')} | {_fmt(b.top5, '.4f')} | "
            f"{_fmt(b.argmax_agreement, '.4f')} | {_fmt(b.max_abs_diff, '.3g')} | "
            f"{_fmt(lat.get('median'), '.3f')} | {_fmt(lat.get('p90'), '.3f')} | "
            f"{_fmt(lat.get('mean'), '.3f')} | {_fmt(lat.get('std'), '.3f')} | "
            f"{_fmt(lat.get('min'), '.3f')} | {_fmt(size, '.1f')} | "
            f"{_fmt(b.extra.get('peak_memory_mb'), '.3g')} |"
        )
    return lines


def _file_table(files: dict[str, int]) -> list[str]:
    if not files:
        return []
    return [
        "",
        "| file | KB |",
        "|---|---|",
        *(f"| {name} | {size / 1024:.1f} |" for name, size in files.items()),
        "",
        "checkpoint.pt also holds the optimizer state; model.safetensors (from "
        "`pack`) holds the bit-packed weights.",
    ]


def _machines(host: dict[str, Any], device: dict[str, Any] | None) -> list[str]:
    lines = [
        "",
        "## Machines",
        "",
        f"- host: {host.get('cpu_model')} ({host.get('machine')}), `{host.get('uname')}`",
    ]
    if device:
        board = f", board {device['board']}" if device.get("board") else ""
        lines.append(
            f"- device `{device.get('destination')}`: {device.get('cpu_model')}, "
            f"{device.get('cores')} cores{board}, {device.get('os')}; `{device.get('uname')}`"
        )
        if device.get("emulated"):
            lines.append(
                f"- **emulated**: {device['emulated']}. The device rows' latencies are the "
                "emulator's on the host's CPU, not ARM timings; their outputs are the ARM "
                "build's."
            )
    return lines


def _at_threads(b: Any) -> str:
    """ ", 4 threads": which of a device's rows (one per thread count) a section is of."""
    threads = b.extra.get("threads")
    return f", {threads} thread{'s' if threads != 1 else ''}" if threads is not None else ""


def _device_sections(b: Any) -> list[str]:
    """The op profile, and how the device's latency and accuracy were measured."""
    lines: list[str] = []
    if b.extra.get("op_types"):
        lines += [
            "",
            f"## Op profile on {b.where}{_at_threads(b)} (lce_benchmark_model)",
            "",
            "| op type | nodes | avg ms | % |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {t['node_type']} | {t['count']} | {t['avg_ms']:.3f} | {t['percent']:.1f} |"
            for t in b.extra["op_types"]
        ]
        if b.extra.get("peak_memory_mb") is not None:
            lines += ["", f"Peak memory footprint: {b.extra['peak_memory_mb']} MB."]
    if b.extra.get("max_steps") is not None:
        lines += [
            "",
            f"`{b.name}`: the device's outputs are up to {b.extra['max_steps']} int8 output "
            f"step(s) of {b.extra['output_step']:.4g} from the host's on "
            f"{b.extra['samples_differing']} of {b.samples} samples. LCE's ARM and x86 builds "
            "compute int8 differently: ARM rounds requantization ties away from zero (x86: up), "
            "and its DEQUANTIZE leaves a value at the zero point a residue of about 1e-9, whose "
            "sign a binarization after it reads (x86: exactly 0, so +1); "
            f"{b.extra.get('binarized_dequantized') or 0} binarization(s) in this flatbuffer "
            'read a dequantized tensor (docs/LCE_NOTES.md "int8 on ARM"). These rows are the '
            "flatbuffer as the ARM build computes it, not a fault of the conversion.",
        ]
    if b.extra.get("runner") != "lce_benchmark_model":
        return lines
    missing = "p90" if b.latency_ms.get("median") is not None else "median or p90"
    lines += ["", f"This lce_benchmark_model prints no {missing}: not given for the device."]
    if b.extra.get("accuracy_batch"):
        lines += [
            "",
            f"Accuracy on the device: `{b.extra['accuracy_model']}` in "
            f"{b.extra['accuracy_invocations']} invocations of "
            f"{b.extra['accuracy_batch']} samples (one model load each), "
            f"{b.extra['accuracy_seconds']:.1f} s with upload and fetch; row "
            "`lce vs host lce` compares its outputs with the host's LCE interpreter.",
        ]
    if b.extra.get("tool"):
        lines += ["", f"Tool: `{b.extra['tool']['label']}` ({b.extra['tool']['path']})."]
    if b.extra.get("note"):
        lines += ["", f"Note: {b.extra['note']}."]
    return lines


def write_report(report: Any, run_dir: str | Path, prefix: str = "") -> list[Path]:
    """Write the plots and RUN_DIR/report.md for a BenchReport; return every path written,
    the report's first. With a `prefix` (a model file's stem and '-'), every file written
    carries it, so the reports of several models in one folder never share a name."""
    out = Path(run_dir)
    plots = plot_bench(report, out, prefix)
    text = render_markdown(report, plots, out, curves=not prefix)
    return [write_bytes_atomic(out / f"{prefix}report.md", text.encode()), *plots]
