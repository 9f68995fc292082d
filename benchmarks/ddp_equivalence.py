"""Is `torchrun` with N processes at batch B/N the same experiment as one process at batch B?

Question: trained from the same seed on the same data, do N gloo processes at `--batch-size
B/N` flip the same binary weights at every step as one process at `--batch-size B`, and end
with the same weights?

Both train mnist-bnn (BatchNorm after every layer) for one epoch on the first 2,500 images of
mnist5k's training split, so an epoch is 2500 / B optimizer steps (50 at B = 50), every step
logged (`--log-every 1`), through the command line a user would type: `python -m bnnexport train`
and `python -m torch.distributed.run --nproc-per-node N -m bnnexport train` on loopback.
Reported: the flips of steps 1, 10 and the last step in each, the first step whose flips differ,
the binary weights that differ at the end (of how many), and the largest difference of the
real-valued parameters and BatchNorm statistics. Beside them, the floor no data-parallel run
can go below: the one-process run again with two threads, which changes nothing but the order
of its float32 sums. Extra `train` options (after `--`) go to every run.

`--batchnorm-cost` instead times one step of mnist-bnn (batch 50, one thread) with torch's
BatchNorm and with AllReduceBatchNorm, side by side: what one process pays for statistics that
round alike in one process and in N.

Run:
    .venv/bin/python benchmarks/ddp_equivalence.py                       # ~1 minute here
    .venv/bin/python benchmarks/ddp_equivalence.py --json -- --per-process-batchnorm
    .venv/bin/python benchmarks/ddp_equivalence.py --batchnorm-cost
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from _common import ROOT, emit, log, machine, parser, table
from torch.utils.data import Subset

SAMPLES = 2500  # images of mnist5k's training split: 50 steps at batch 50
HERE = Path(__file__).resolve().parent


def mnist_subset(data_dir: str | None = None, augment: bool = True) -> Any:
    """The first SAMPLES training images of mnist5k and its whole test split (`--dataset
    ddp_equivalence:mnist_subset`, imported with this folder as the working directory)."""
    from bnnexport.datasets import load_mnist5k

    data = load_mnist5k(data_dir, augment)
    data.train = Subset(data.train, range(SAMPLES))
    return data


def _launcher(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "bnnexport"]
    import socket

    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
            "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "bnnexport"]  # fmt: skip


# the bnnexport checkout whose `train` runs (`--code`): this one, or another version's
CODE = {"root": ROOT}


def train_args(out: Path, batch_size: int | None, extra: list[str]) -> list[str]:
    """`bnnexport train` on the subset for one epoch, every step logged."""
    batch = ["--batch-size", str(batch_size)] if batch_size is not None else []
    return ["train", "--dataset", "ddp_equivalence:mnist_subset", "--epochs", "1", *batch,
            "--log-every", "1", "--seed", "0", "--out", str(out), "--json", *extra]  # fmt: skip


def launch(processes: int, args: list[str], threads: int = 1) -> subprocess.CompletedProcess:
    """Run `python -m bnnexport ARGS` in one process or under torchrun."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(CODE["root"])}
    return subprocess.run(
        [*_launcher(processes), *args], cwd=HERE, env=env, capture_output=True, text=True
    )


def run_training(
    out: Path, processes: int, batch_size: int | None, extra: list[str], threads: int = 1
) -> float:
    """Train one run; returns its wall-clock seconds."""
    import time

    start = time.perf_counter()
    done = launch(processes, train_args(out, batch_size, extra), threads)
    if done.returncode != 0:
        raise RuntimeError(f"training failed ({processes} processes):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def step_flips(run: Path) -> dict[int, int]:
    """{step: flips over all binary layers} from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: sum(r["flips"].values()) for r in rows if r.get("kind") == "step"}


def differences(one: Path, many: Path) -> dict[str, Any]:
    """Binary weights that differ (and of how many); the largest |difference| elsewhere."""
    a, b = (torch.load(r / "checkpoint.pt", weights_only=True) for r in (one, many))
    kernels = {k["name"] for k in a["binary_kernels"]["kernels"]}
    differ = total = 0
    real = 0.0
    for name, tensor in a["model"].items():
        other = b["model"][name]
        if name in kernels:
            differ += int((tensor != other).sum())
            total += tensor.numel()
        elif tensor.is_floating_point():
            real = max(real, float((tensor - other).abs().max()))
    return {"binary_weights_differing": differ, "binary_weights": total, "real_max_abs_diff": real}


def compare(one: Path, other: Path) -> dict[str, Any]:
    """How `other` differs from the one-process run `one`: flips per step, weights at the end."""
    flips_one, flips_other = step_flips(one), step_flips(other)
    differing = [s for s in sorted(flips_one) if flips_one[s] != flips_other.get(s)]
    return {
        "flips": {s: flips_other.get(s) for s in (1, 10, max(flips_one)) if s in flips_one},
        "first_step_flips_differ": differing[0] if differing else None,
        **differences(one, other),
    }


def recipe_steps(run: Path) -> dict[str, Any]:
    """What makes a run the recipe's experiment: steps per epoch, γ at steps 1, 10 and 40,
    the loss logged at step 1, the flips of steps 1-3."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if r.get("kind") == "step"}
    return {
        "steps_per_epoch": len(steps),
        "gamma": {str(s): steps[s]["bop.gamma"] for s in (1, 10, 40) if s in steps},
        "step_1_loss": steps[1]["loss"],
        "flips": {str(s): sum(steps[s]["flips"].values()) for s in (1, 2, 3)},
    }


def recipe_comparison(recipe: str, extra: list[str]) -> dict[str, Any]:
    """`train --recipe RECIPE --model mnist-bnn` for one epoch on the subset: one process at
    the recipe's batch, 2 processes at the recipe's batch, and 2 processes at half of it (what
    a user would give to keep the recipe's batch if --batch-size were per process)."""
    recipe_batch = 50 if recipe == "paper-cifar10-bop" else None
    cases = {"1 process": (1, None), "2 processes": (2, None)}
    if recipe_batch is not None:
        cases[f"2 processes, --batch-size {recipe_batch // 2}"] = (2, recipe_batch // 2)
    options = ["--recipe", recipe, "--model", "mnist-bnn", *extra]
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (processes, batch) in cases.items():
            log(f"{name}: --recipe {recipe}")
            out = Path(folder) / name.replace(" ", "_").replace(",", "")
            done = launch(processes, train_args(out, batch, options))
            if done.returncode != 0:  # a refusal is a result too: its one line
                lines = [ln for ln in done.stderr.splitlines() if ln.startswith("bnnexport:")]
                result[name] = {"refused": lines[-1] if lines else done.stderr[-500:]}
                continue
            result[name] = recipe_steps(out)
    return result


def recipe_table(result: dict[str, Any]) -> str:
    names = [n for n in result if "refused" not in result[n]]
    rows = [["steps per epoch", *(result[n]["steps_per_epoch"] for n in names)]]
    for step in (1, 10, 40):
        rows.append([f"γ at step {step}", *(result[n]["gamma"].get(str(step)) for n in names)])
    rows.append(["loss at step 1", *(result[n]["step_1_loss"] for n in names)])
    rows.append(
        [
            "flips at steps 1-3",
            *(" / ".join(str(v) for v in result[n]["flips"].values()) for n in names),
        ]
    )
    refused = [f"{n}: {result[n]['refused']}" for n in result if "refused" in result[n]]
    return "\n".join([table(["", *names], rows), *refused])


def batchnorm_cost(rounds: int = 15) -> dict[str, Any]:
    """One training step (forward, backward) of mnist-bnn at batch 50, 1 thread, with torch's
    BatchNorm and with AllReduceBatchNorm (one process), timed interleaved."""
    import copy

    from _common import interleaved

    from bnnexport.models import create_model
    from bnnexport.training.distributed import global_batchnorm

    torch.set_num_threads(1)
    torch.manual_seed(0)
    plain = create_model("mnist-bnn").to(memory_format=torch.channels_last)
    ours = global_batchnorm(copy.deepcopy(plain))
    x = torch.randn(50, 1, 28, 28).to(memory_format=torch.channels_last)

    def step(model: torch.nn.Module) -> None:
        model.zero_grad()
        model(x).sum().backward()

    times = interleaved({"torch": lambda: step(plain), "all-reduce": lambda: step(ours)},
                        rounds=rounds, runs=5)  # fmt: skip
    ratio = times["all-reduce"]["median"] / times["torch"]["median"]
    return {"step_ms": {k: v["median"] for k, v in times.items()}, "ratio": ratio}


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--batchnorm-cost",
        action="store_true",
        help="only time a step with torch's BatchNorm and with AllReduceBatchNorm",
    )
    p.add_argument("--recipe", metavar="NAME", help="only compare `train --recipe NAME` runs")
    p.add_argument(
        "--code",
        metavar="DIR",
        help="the bnnexport checkout to train with "
        "(another version's, e.g. from `git archive`) [default: this one]",
    )
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.code:
        CODE["root"] = Path(args.code).resolve()
    if args.recipe:
        result = {"recipe": args.recipe, "runs": recipe_comparison(args.recipe, extra),
                  "code": str(CODE["root"]), "machine": machine()}  # fmt: skip
        emit(result, recipe_table(result["runs"]), args.json)
        return
    if args.batchnorm_cost:
        cost = {**batchnorm_cost(), "machine": machine()}
        rows = [[name, ms] for name, ms in cost["step_ms"].items()]
        emit(cost, table(["BatchNorm", "step ms (median)"], rows) + f"\nratio {cost['ratio']:.3f}",
             args.json)  # fmt: skip
        return
    processes, batch = 2, 50
    runs = {  # name: (processes, batch size, threads per process)
        "one": (1, batch, 1),
        "one_two_threads": (1, batch, 2),  # the same run, only its float sums in another order
        "processes": (processes, batch // processes, 1),
    }
    with tempfile.TemporaryDirectory() as folder:
        seconds = {}
        for name, (count, size, threads) in runs.items():
            log(f"{name}: {count} process(es) at batch {size}, {threads} thread(s) each")
            seconds[name] = round(run_training(Path(folder) / name, count, size, extra, threads), 1)
        one = Path(folder) / "one"
        flips = step_flips(one)
        steps = [s for s in (1, 10, max(flips)) if s in flips]
        result = {
            "processes": processes, "global_batch": batch, "steps": max(flips),
            "train_options": extra, "one_process_flips": {s: flips[s] for s in steps},
            "one_process_two_threads": compare(one, Path(folder) / "one_two_threads"),
            "processes_vs_one": compare(one, Path(folder) / "processes"),
            "seconds": seconds, "machine": machine(),
        }  # fmt: skip
    two, many = result["one_process_two_threads"], result["processes_vs_one"]
    rows = [[f"flips at step {s}", flips[s], two["flips"][s], many["flips"][s]] for s in steps]
    rows += [
        ["first step whose flips differ", "", two["first_step_flips_differ"] or "none",
         many["first_step_flips_differ"] or "none"],
        ["binary weights differing at the end", "",
         f"{two['binary_weights_differing']} of {two['binary_weights']}",
         f"{many['binary_weights_differing']} of {many['binary_weights']}"],
        ["real-valued max |diff| at the end", "", two["real_max_abs_diff"],
         many["real_max_abs_diff"]],
    ]  # fmt: skip
    head = ["", f"1 process, batch {batch}", "the same, 2 threads",
            f"{processes} processes, batch {batch // processes}"]  # fmt: skip
    emit(result, table(head, rows), args.json)


if __name__ == "__main__":
    main()
