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


SUBSET_VARIABLE = "BNNEXPORT_DDP_SUBSET"  # which subset mnist_subset takes (--subsets)


def mnist_subset(data_dir: str | None = None, augment: bool = True) -> Any:
    """SAMPLES training images of mnist5k and its whole test split (`--dataset
    ddp_equivalence:mnist_subset`, imported with this folder as the working directory): the
    first ones, or with SUBSET_VARIABLE k > 0 a random draw seeded k."""
    from bnnexport.datasets import load_mnist5k

    data = load_mnist5k(data_dir, augment)
    subset = int(os.environ.get(SUBSET_VARIABLE, "0"))
    if subset == 0:
        data.train = Subset(data.train, range(SAMPLES))
    else:
        order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(subset))
        data.train = Subset(data.train, sorted(order[:SAMPLES].tolist()))
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
        "test_accuracy": test_accuracy(other),
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
        "--subsets",
        type=int,
        default=1,
        metavar="K",
        help="compare on K subsets of SAMPLES images (0: the first ones; k > 0: a "
        "random draw seeded k) [default: 1]",
    )
    p.add_argument(
        "--reduction-cost",
        action="store_true",
        help="only time what order-independent weight-gradient sums would cost",
    )
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
    if args.reduction_cost:
        cost = {"models": reduction_cost(), "machine": machine()}
        emit(cost, reduction_table(cost["models"]), args.json)
        return
    results = []
    for subset in range(args.subsets):
        log(f"subset {subset} of {args.subsets}")
        results.append(divergence(subset, extra))
    result = {"subsets": results, "train_options": extra, "machine": machine()}
    emit(result, "\n\n".join(divergence_table(r) for r in results), args.json)


def divergence(subset: int, extra: list[str]) -> dict[str, Any]:
    """One process at batch 50, the same with two threads, and 2 processes sharing each batch
    of 50, on subset `subset` (SUBSET_VARIABLE): how the other two differ from the first."""
    processes, batch = 2, 50
    runs = {  # name: (processes, the global batch, threads per process)
        "one": (1, batch, 1),
        "one_two_threads": (1, batch, 2),  # the same run, only its float sums in another order
        "processes": (processes, batch, 1),
    }
    os.environ[SUBSET_VARIABLE] = str(subset)
    with tempfile.TemporaryDirectory() as folder:
        seconds = {}
        for name, (count, size, threads) in runs.items():
            log(f"{name}: {count} process(es) sharing batch {size}, {threads} thread(s) each")
            seconds[name] = round(run_training(Path(folder) / name, count, size, extra, threads), 1)
        one = Path(folder) / "one"
        flips = step_flips(one)
        steps = [s for s in (1, 10, max(flips)) if s in flips]
        return {
            "subset": subset, "processes": processes, "global_batch": batch, "steps": max(flips),
            "one_process_flips": {s: flips[s] for s in steps},
            "one_process_test_accuracy": test_accuracy(one),
            "one_process_two_threads": compare(one, Path(folder) / "one_two_threads"),
            "processes_vs_one": compare(one, Path(folder) / "processes"),
            "seconds": seconds,
        }  # fmt: skip


def test_accuracy(run: Path) -> float:
    return float(json.loads((run / "train.json").read_text())["test_accuracy"])


def divergence_table(result: dict[str, Any]) -> str:
    flips = {int(k): v for k, v in result["one_process_flips"].items()}
    two, many = result["one_process_two_threads"], result["processes_vs_one"]

    def at(other: dict[str, Any], step: int) -> Any:
        return other["flips"].get(step, other["flips"].get(str(step)))

    rows = [[f"flips at step {s}", flips[s], at(two, s), at(many, s)] for s in flips]
    rows += [
        ["first step whose flips differ", "", two["first_step_flips_differ"] or "none",
         many["first_step_flips_differ"] or "none"],
        ["binary weights differing at the end", "",
         f"{two['binary_weights_differing']} of {two['binary_weights']}",
         f"{many['binary_weights_differing']} of {many['binary_weights']}"],
        ["test accuracy (one process: the first column)", result["one_process_test_accuracy"],
         two["test_accuracy"], many["test_accuracy"]],
        ["real-valued max |diff| at the end", "", two["real_max_abs_diff"],
         many["real_max_abs_diff"]],
    ]  # fmt: skip
    head = [f"subset {result['subset']}", f"1 process, batch {result['global_batch']}",
            "the same, 2 threads", f"{result['processes']} processes sharing it"]  # fmt: skip
    return table(head, rows)


def reduction_cost(rounds: int = 3) -> dict[str, Any]:
    """What order-independent sums over the batch would cost: for mnist-bnn and BinaryNet at
    batch 50 (one thread), a training step's time beside the time of every conv and dense
    layer's weight gradient (the sums over the batch whose order a split changes) computed
    as torch does (float32), in float64 (the sums' order no longer showing once rounded to
    float32, as AllReduceBatchNorm does for its statistics) and, for mnist-bnn, per sample
    in float32 and added in float64 (each process's part the same kernel on the same data)."""
    torch.set_num_threads(1)
    shapes = {"mnist-bnn": (1, 28, 28), "binarynet": (3, 32, 32)}
    return {name: _model_costs(name, shape, rounds) for name, shape in shapes.items()}


def _median_ms(call: Any, runs: int) -> float:
    import statistics
    import time

    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _model_costs(name: str, shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    from bnnexport.models import create_model
    from bnnexport.training.distributed import global_batchnorm

    torch.manual_seed(0)
    model = global_batchnorm(create_model(name)).train()
    x = torch.randn(50, *shape)
    layers = _weight_gradient_inputs(model, x)

    def step() -> None:
        model.zero_grad()
        model(x).logsumexp(1).sum().backward()

    row = {
        "step_ms": _median_ms(step, rounds),
        "weight_gradients_float32_ms": _median_ms(
            lambda: _weight_gradients(layers, torch.float32), rounds
        ),
        "weight_gradients_float64_ms": _median_ms(
            lambda: _weight_gradients(layers, torch.float64), 1
        ),
    }
    if name == "mnist-bnn":  # BinaryNet's 50 per-sample kernels take minutes here
        row["per_sample_ms"] = _median_ms(lambda: _per_sample(layers), 1)
    return row


def _weight_gradient_inputs(model: torch.nn.Module, x: torch.Tensor) -> list[tuple]:
    """(layer, its binarized or float input, the gradient of its output) of every conv and
    dense layer, from one real backward pass."""
    from torch import nn

    captured: list[tuple] = []

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        seen = inputs[0].detach()
        if hasattr(module, "quantize_input"):
            seen = module.quantize_input(seen).detach()
        output.register_hook(lambda grad: captured.append((module, seen, grad.detach())))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]  # fmt: skip
    model(x).logsumexp(1).sum().backward()
    for handle in handles:
        handle.remove()
    return captured


def _conv_input(module: Any, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    pad = module.padding
    if getattr(module, "pad_value", "zero") == "one" and pad[0]:
        return torch.nn.functional.pad(x, (pad[1], pad[1], pad[0], pad[0]), value=1.0), (0, 0)
    return x, pad


def _weight_gradients(layers: list[tuple], dtype: torch.dtype) -> None:
    for module, x, grad in layers:
        if isinstance(module, torch.nn.Conv2d):
            x, pad = _conv_input(module, x)
            torch.nn.grad.conv2d_weight(x.to(dtype), module.weight.shape, grad.to(dtype),
                                        module.stride, pad)  # fmt: skip
        else:
            grad.to(dtype).T @ x.to(dtype)


def _per_sample(layers: list[tuple]) -> None:
    for module, x, grad in layers:
        if isinstance(module, torch.nn.Conv2d):
            x, pad = _conv_input(module, x)
            total = torch.zeros(module.weight.shape, dtype=torch.float64)
            for i in range(len(x)):
                one, its = x[i : i + 1], grad[i : i + 1]
                total += torch.nn.grad.conv2d_weight(
                    one, module.weight.shape, its, module.stride, pad
                )
        else:
            (grad[:, :, None] * x[:, None, :]).double().sum(0)


def reduction_table(models: dict[str, Any]) -> str:
    rows = []
    for name, row in models.items():
        extra = [
            f"+{100 * (row[k] - row['weight_gradients_float32_ms']) / row['step_ms']:.0f} %"
            if k in row else None
            for k in ("weight_gradients_float64_ms", "per_sample_ms")
        ]  # fmt: skip
        times = [row["step_ms"], row["weight_gradients_float32_ms"]]
        times += [row["weight_gradients_float64_ms"], row.get("per_sample_ms")]
        rows.append([name, *times, *extra])
    head = ["model (batch 50, 1 thread)", "step ms", "weight grads float32 ms", "float64 ms",
            "per sample ms", "a step with float64", "a step per sample"]  # fmt: skip
    return table(head, rows)


if __name__ == "__main__":
    main()
