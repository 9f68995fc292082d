"""Does bnnexport train BinaryNet as fast as larq does? Training images per second, side by side.

Question: BinaryNet (CIFAR shape 3x32x32, 10 classes), synthetic data (one
fixed batch of uniform [-1, 1] images and random labels), the same batch size and the same
number of threads on both sides:
- `bnnexport`: one training step as `bnnexport train` takes it -- forward, cross-entropy,
  zero_grad, backward, `bop_with_adam` step (Bop for the binary kernels, Adam for the rest);
- `bnnexport+flips`: the same plus the per-step flip counting `bnnexport train` does for its
  flip-rate metrics (`FlipCounter`);
- `bnnexport-channels-last`: `bnnexport` with model and batch in `torch.channels_last` (NHWC,
  TensorFlow's layout; oneDNN's convolutions need no reorder then). Not what `bnnexport train`
  does today: it shows what that one-line change would give;
- `larq`: the same network written with larq layers (`larq_side.py`), `model.train_on_batch`
  with larq's `CaseOptimizer(Bop, tf.keras.optimizers.legacy.Adam)`, run in its own venv
  (benchmarks/.venv-larq, created on first use) as a subprocess that answers in JSON.

The larq process stays up; rounds alternate between the contenders (order rotated each round),
each timing `--steps` steps, and images/s is the median over rounds. Images per CPU-second
(process CPU time) is reported too: on a shared, overloaded machine a side that runs more threads
gets more of the CPU, which wall-clock rates alone would hide. Data loading, metrics files
and checkpoints are outside the timed region on both sides.

Run:
    .venv/bin/python benchmarks/train_throughput.py                  # ~3-4 minutes
    .venv/bin/python benchmarks/train_throughput.py --batch 100 --threads 2 --rounds 10 --json
"""

from __future__ import annotations

import json
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
from bnnexport.optimizers import FlipCounter, bop_with_adam

GAMMA, THRESHOLD, LR = 1e-4, 1e-8, 1e-2


def torch_stepper(
    batch: int, count_flips: bool, channels_last: bool = False
) -> Callable[[int], tuple[float, float]]:
    """run(steps) -> (wall, CPU) seconds of `steps` bnnexport training steps on one batch."""
    torch.manual_seed(0)
    model = create_model("binarynet", input_shape=(3, 32, 32)).train()
    optimizer = bop_with_adam(model, GAMMA, THRESHOLD, LR)
    counter = FlipCounter(model) if count_flips else None
    generator = torch.Generator().manual_seed(0)
    x = torch.rand((batch, 3, 32, 32), generator=generator) * 2 - 1
    if channels_last:  # NHWC, as TensorFlow lays tensors out; parameters stay the same objects
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), generator=generator)

    def run(steps: int) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if counter is not None:
                counter.before_step()
            optimizer.step()
            if counter is not None:
                counter.after_step()
            loss.item()
        return time.perf_counter() - start, time.process_time() - cpu

    return run


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
        help="intra-op threads on both sides (default 1: the machine is shared)",
    )
    p.add_argument("--steps", type=int, default=2, help="timed steps per round (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--no-flips", action="store_true", help="skip the bnnexport+flips contender")
    p.add_argument(
        "--no-channels-last", action="store_true", help="skip the bnnexport-channels-last contender"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    log("starting the larq side")
    larq = LarqTrainer(larq_python(), args.batch, args.threads)
    runners: dict[str, Callable[[int], tuple[float, float]]] = {
        "bnnexport": torch_stepper(args.batch, False)
    }
    if not args.no_flips:
        runners["bnnexport+flips"] = torch_stepper(args.batch, True)
    if not args.no_channels_last:
        runners["bnnexport-channels-last"] = torch_stepper(args.batch, False, channels_last=True)
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
    median = {n: statistics.median(v) for n, v in rates.items()}
    median_cpu = {n: statistics.median(v) for n, v in per_cpu.items()}
    result: dict[str, Any] = {
        "machine": machine(),
        "batch": args.batch,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "torch": torch.__version__,
        "larq_side": larq.info,
        "images_per_s": median,
        "images_per_s_all_rounds": rates,
        "images_per_cpu_s": median_cpu,
        "cpu_ratio_bnnexport_vs_larq": median_cpu["bnnexport"] / median_cpu["larq"],
        "ratio_bnnexport_vs_larq": median["bnnexport"] / median["larq"],
        "target_met": median["bnnexport"] >= median["larq"],
    }
    if "bnnexport+flips" in median:
        result["ratio_bnnexport_flips_vs_larq"] = median["bnnexport+flips"] / median["larq"]
    rows = [
        [
            n,
            median[n],
            min(rates[n]),
            max(rates[n]),
            median[n] / median["larq"],
            median_cpu[n],
            median_cpu[n] / median_cpu["larq"],
        ]
        for n in runners
    ]
    text = table(
        ["trainer", "img/s (median)", "min", "max", "x larq", "img/CPU-s", "x larq (CPU)"], rows
    )
    text += (
        f"\n\nBinaryNet 3x32x32, batch {args.batch}, {args.threads} thread(s), "
        f"{args.rounds} rounds x {args.steps} steps interleaved; torch {torch.__version__}, "
        f"larq {larq.info.get('larq')} / TF {larq.info.get('tensorflow')}; "
        f"load {result['machine']['load_average']}"
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
