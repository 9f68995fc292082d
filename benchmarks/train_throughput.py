"""Does bnnexport train BinaryNet as fast as larq does? Training images per second, side by side.

Question: BinaryNet (CIFAR shape 3x32x32, 10 classes), synthetic data (one
fixed batch of uniform [-1, 1] images and random labels), the same batch size and the same
number of threads on both sides. Every bnnexport row is one training step -- forward,
cross-entropy, zero_grad, backward, `bop_with_adam` step (Bop for the binary kernels, Adam for
the rest) -- and the rows differ in one technique each, so the table shows what each one buys:
- `bnnexport`: the step as `bnnexport train` takes it by default: model and batch in
  `torch.channels_last` (NHWC, so oneDNN needs no layout reorder around each conv), flip
  counting (`FlipCounter`, for the flip-rate metrics) and `--precision auto`, which on a CPU
  with bf16 arithmetic is `bf16-exact` (`bnnexport.nn.precision`);
- `float32`: the same with `--precision float32` (the previous default);
- `float32-nchw`: `float32` in torch's default NCHW layout (what channels_last buys);
- `bf16`: `--precision bf16`, the binary layers' backward in bf16 too (opt-in, not exact);
- `amp`: `--precision amp`, bf16 autocast over the whole model (opt-in, not exact);
- `compile`: `float32` with the model wrapped in `torch.compile` (TorchInductor fuses the
  elementwise work between the convolutions: BatchNorm, sign, the STE mask, the clip; one graph,
  no break); not something `bnnexport train` does, measured to see what fusion would buy. (Not
  combined with `bf16-exact`: its exactness check is data-dependent control flow, so the graph
  breaks at every binary layer and each layer's shapes compile on their own.)
- `larq`: the same network written with larq layers (`larq_side.py`), `model.train_on_batch`
  with larq's `CaseOptimizer(Bop, tf.keras.optimizers.legacy.Adam)`, run in its own venv
  (benchmarks/.venv-larq, created on first use) as a subprocess that answers in JSON.

The larq process stays up; rounds alternate between the contenders (order rotated each round),
each timing `--steps` steps, and images/s is the median over rounds. Images per CPU-second
(process CPU time) is reported too: on a shared, overloaded machine a side that runs more threads
gets more of the CPU, which wall-clock rates alone would hide. Data loading, metrics files
and checkpoints are outside the timed region on both sides.

Run:
    .venv/bin/python benchmarks/train_throughput.py                  # ~4 minutes
    .venv/bin/python benchmarks/train_throughput.py --threads 0      # all cores
    .venv/bin/python benchmarks/train_throughput.py --only bnnexport,bf16 --rounds 10 --json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import ROOT, emit, larq_env, larq_python, log, machine, parser, table

from bnnexport.models import create_model
from bnnexport.nn.layers import bf16_counts, set_precision
from bnnexport.nn.precision import resolve_precision
from bnnexport.optim.composite import bop_with_adam
from bnnexport.training.flips import FlipCounter

GAMMA, THRESHOLD, LR = 1e-4, 1e-8, 1e-2

# row -> (precision, channels_last, torch.compile); every row counts flips as `bnnexport train`
TORCH_ROWS = {
    "bnnexport": ("auto", True, False),
    "float32": ("float32", True, False),
    "float32-nchw": ("float32", False, False),
    "bf16": ("bf16", True, False),
    "amp": ("amp", True, False),
    "compile": ("float32", True, True),
}


class TorchTrainer:
    """`run(steps) -> (wall, CPU) seconds` of bnnexport training steps on one fixed batch."""

    def __init__(self, batch: int, precision: str, channels_last: bool, compiled: bool) -> None:
        torch.manual_seed(0)
        self.precision = resolve_precision(precision, "cpu")
        layout = torch.channels_last if channels_last else torch.contiguous_format
        self.model = create_model("binarynet", input_shape=(3, 32, 32)).train()
        self.model = self.model.to(memory_format=layout)
        set_precision(self.model, self.precision)
        self.optimizer = bop_with_adam(self.model, GAMMA, THRESHOLD, LR)
        self.counter = FlipCounter(self.model)
        # the optimizer and the flip counter hold the module's own parameters; the compiled
        # wrapper shares them and only changes how the forward (and its backward) run
        self.forward = torch.compile(self.model) if compiled else self.model
        generator = torch.Generator().manual_seed(0)
        x = torch.rand((batch, 3, 32, 32), generator=generator) * 2 - 1
        self.x = x.contiguous(memory_format=layout)
        self.y = torch.randint(0, 10, (batch,), generator=generator)

    def run(self, steps: int) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "amp"):
                loss = F.cross_entropy(self.forward(self.x).float(), self.y)
            self.optimizer.zero_grad()
            loss.backward()
            self.counter.before_step()
            self.optimizer.step()
            self.counter.after_step()
            loss.item()
        return time.perf_counter() - start, time.process_time() - cpu


class LarqTrainer:
    """The larq side as a long-lived subprocess: `run(steps) -> (wall, CPU) seconds`, timed
    inside it."""

    def __init__(self, python: Path, batch: int, threads: int) -> None:
        self.process = subprocess.Popen(
            [
                str(python),
                str(ROOT / "benchmarks" / "larq_side.py"),
                "serve-train",
                "--batch",
                str(batch),
                "--threads",
                str(threads),
                "--gamma",
                str(GAMMA),
                "--threshold",
                str(THRESHOLD),
                "--lr",
                str(LR),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=larq_env(),
        )
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the larq side exited ({self.process.wait()}) without answering")

    def run(self, steps: int) -> tuple[float, float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        answer = self._read()
        return float(answer["seconds"]), float(answer["cpu_seconds"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(timeout=60)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=50, help="batch size (default 50, the paper's)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads on both sides (default 1: the machine is shared; 0: all cores)",
    )
    p.add_argument("--steps", type=int, default=2, help="timed steps per round (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument(
        "--only",
        default=",".join(TORCH_ROWS),
        help=f"comma-separated bnnexport rows to run beside larq (default all: "
        f"{','.join(TORCH_ROWS)})",
    )
    args = p.parse_args(argv)
    rows = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(rows) - set(TORCH_ROWS))
    if unknown or not rows:
        p.error(f"--only: unknown row(s) {', '.join(unknown)}; known: {', '.join(TORCH_ROWS)}")
    args.threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    log("starting the larq side")
    larq = LarqTrainer(larq_python(), args.batch, args.threads)
    trainers = {name: TorchTrainer(args.batch, *TORCH_ROWS[name]) for name in rows}
    runners: dict[str, Callable[[int], tuple[float, float]]] = {
        name: trainer.run for name, trainer in trainers.items()
    }
    runners["larq"] = larq.run
    try:
        for run in runners.values():
            run(args.warmup)
        rates: dict[str, list[float]] = {n: [] for n in runners}
        per_cpu: dict[str, list[float]] = {n: [] for n in runners}
        names = list(runners)
        images = args.batch * args.steps
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = runners[name](args.steps)
                rates[name].append(images / wall)
                per_cpu[name].append(images / cpu)
            log(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{n} {v[-1]:.1f} img/s" for n, v in rates.items())
            )
    finally:
        larq.close()
    result = summarize(args, larq.info, trainers, rates, per_cpu)
    text = render(result)
    emit(result, text, args.json)
    return result


# docs/BENCHMARKS.md "Training throughput": the default path at least 1.5x larq's images/s
TARGET = 1.5


def summarize(
    args: Any,
    larq_info: dict[str, Any],
    trainers: dict[str, TorchTrainer],
    rates: dict[str, list[float]],
    per_cpu: dict[str, list[float]],
) -> dict[str, Any]:
    """The JSON result: medians, ratios to larq, each row's precision and bf16 fallbacks."""
    median = {n: statistics.median(v) for n, v in rates.items()}
    median_cpu = {n: statistics.median(v) for n, v in per_cpu.items()}
    result: dict[str, Any] = {
        "machine": machine(),
        "batch": args.batch,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "torch": torch.__version__,
        "larq_side": larq_info,
        "precision": {n: t.precision for n, t in trainers.items()},
        "bf16": {n: bf16_counts(t.model) for n, t in trainers.items()},
        "images_per_s": median,
        "images_per_s_all_rounds": rates,
        "images_per_cpu_s": median_cpu,
        "ratio_vs_larq": {n: median[n] / median["larq"] for n in median},
        "cpu_ratio_vs_larq": {n: median_cpu[n] / median_cpu["larq"] for n in median},
    }
    if "bnnexport" in median:
        result["target_met"] = result["ratio_vs_larq"]["bnnexport"] >= TARGET
    return result


def render(result: dict[str, Any]) -> str:
    median, rates = result["images_per_s"], result["images_per_s_all_rounds"]
    rows = [
        [
            n,
            result["precision"].get(n, "-"),
            median[n],
            min(rates[n]),
            max(rates[n]),
            result["ratio_vs_larq"][n],
            result["images_per_cpu_s"][n],
            result["cpu_ratio_vs_larq"][n],
        ]
        for n in median
    ]
    header = ["trainer", "precision", "img/s (median)", "min", "max", "x larq", "img/CPU-s"]
    text = table([*header, "x larq (CPU)"], rows)
    larq = result["larq_side"]
    return text + (
        f"\n\nBinaryNet 3x32x32, batch {result['batch']}, {result['threads']} thread(s), "
        f"{result['rounds']} rounds x {result['steps_per_round']} steps interleaved; "
        f"torch {result['torch']}, larq {larq.get('larq')} / TF {larq.get('tensorflow')}; "
        f"load {result['machine']['load_average']}; bf16-exact fallbacks "
        + ", ".join(
            f"{n} {c['bf16_fallbacks']}/{c['bf16_calls']}"
            for n, c in result["bf16"].items()
            if c["bf16_calls"]
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
