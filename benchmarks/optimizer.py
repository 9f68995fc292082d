"""Is Bop cheaper than Adam on latent weights? Step time and state bytes per binary weight.

Question: on BinaryNet's binary kernels (`create_model("binarynet")`, 3x32x32,
about 10.5 M binary weights), how long does one optimizer step take and how many bytes of
optimizer state does each binary weight cost, for Bop (bnnexport's `bop_with_adam`, its Bop part)
against the latent-weight baseline (`latent_adam`, its Adam-on-latent-weights part) -- and `bop2`
when `bnnexport.optim.composite.OPTIMIZERS` has it.

Gradients are synthetic (a few fixed standard-normal sets scaled by 1e-3, cycled), identical for
every contender. Steps are timed interleaved in one process (see `_common.interleaved`); the
reported time is the median over rounds. State bytes are measured from the optimizer's actual
state tensors; for adam-latent the latent weight itself counts as state too (Bop's parameter IS
the binary kernel, the latent baseline keeps a real-valued copy the kernel is the sign of).
Per-tensor scalars (Bop's flip count, Adam's step counter) are reported apart, in bytes.

`bop-bf16` and `bop-bf16-sr` are benchmark-local variants (not in the library): Bop with the
momentum stored in bfloat16, rounded to nearest or stochastically. `--fidelity-steps` runs them
beside the float32 Bop from the same start on the same gradient stream and reports how their
flips differ.

Run:
    .venv/bin/python benchmarks/optimizer.py                 # quick: ~1-2 minutes
    .venv/bin/python benchmarks/optimizer.py --rounds 30 --steps 10 --json
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from _common import emit, interleaved, log, machine, parser, table
from torch import nn

from bnnexport.models import create_model
from bnnexport.nn.layers import binary_parameters
from bnnexport.optim.bop import Bop
from bnnexport.optim.composite import OPTIMIZERS, bop_with_adam, latent_adam

# the paper's CIFAR-10 BinaryNet settings (docs/LCE_NOTES.md "Paper recipes")
GAMMA, THRESHOLD, LR = 1e-4, 1e-8, 1e-2


class ReferenceBop(Bop):
    """Bop.step as first written (bool mask and `torch.where`): the before of the speed-up."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self._apply_schedules()
        for group in self.param_groups:
            gamma, threshold = group["gamma"], group["threshold"]
            for weight in group["params"]:
                state = self.state[weight]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(weight)
                momentum = state["momentum"]
                momentum.mul_(1.0 - gamma).add_(weight.grad * gamma)
                flip = (weight * momentum) > threshold
                weight.copy_(torch.where(flip, -weight, weight))
                state["flips"] = flip.sum()
        self.steps += 1
        return None


class CompactBop(Bop):
    """Bop with its momentum stored in bfloat16 (2 bytes per weight instead of 4).

    The update is computed in float32 and rounded once per step, to nearest or stochastically
    (unbiased: add 16 random low bits, truncate). Benchmark-local: measured, not shipped.
    """

    def __init__(
        self, params: Any, gamma: float, threshold: float, stochastic: bool, seed: int = 0
    ) -> None:
        super().__init__(params, gamma, threshold)
        self.stochastic = stochastic
        self.generator = torch.Generator().manual_seed(seed)

    def _store(self, m32: torch.Tensor, out: torch.Tensor) -> None:
        if self.stochastic:
            bits = m32.view(torch.int32)
            bits.add_(
                torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, generator=self.generator)
            )
            bits.bitwise_and_(-65536)  # keep the top 16 bits: exactly representable in bf16
        out.copy_(m32)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        self._apply_schedules()
        for group in self.param_groups:
            gamma, threshold = group["gamma"], group["threshold"]
            for weight in group["params"]:
                if weight.grad is None:
                    continue
                state = self.state[weight]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(weight, dtype=torch.bfloat16)
                scratch = torch.mul(weight.grad, gamma)
                m32 = state["momentum"].float().mul_(1.0 - gamma).add_(scratch)
                flip = torch.mul(weight, m32, out=scratch).gt_(threshold)
                weight.addcmul_(weight, flip, value=-2.0)
                state["flips"] = flip.sum().to(torch.int64)
                self._store(m32, state["momentum"])
        self.steps += 1
        return None


def state_bytes(optimizer: torch.optim.Optimizer, latent: bool) -> tuple[int, int, int]:
    """(bytes of per-weight state, bytes of per-tensor scalars, binary weights) of `optimizer`.

    Per-weight state: every state tensor with one entry per weight (momentum; exp_avg,
    exp_avg_sq), plus the latent weights themselves when `latent`. Per-tensor scalars (Bop's
    flip count, Adam's step) are bookkeeping, counted apart.
    """
    per_weight, scalars, weights = 0, 0, 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            weights += param.numel()
            if latent:
                per_weight += param.numel() * param.element_size()
            for value in optimizer.state[param].values():
                if torch.is_tensor(value):
                    size = value.numel() * value.element_size()
                    if value.numel() == param.numel():
                        per_weight += size
                    else:
                        scalars += size
    return per_weight, scalars, weights


def contenders(include_compact: bool) -> dict[str, tuple[torch.optim.Optimizer, bool]]:
    """name -> (the optimizer of the binary kernels only, latent weights count as state)."""
    torch.manual_seed(0)
    base = create_model("binarynet", input_shape=(3, 32, 32))
    out: dict[str, tuple[torch.optim.Optimizer, bool]] = {}
    out["bop"] = (bop_with_adam(copy.deepcopy(base), GAMMA, THRESHOLD, LR).optimizers["bop"], False)
    out["adam-latent"] = (latent_adam(copy.deepcopy(base), LR).optimizers["latent"], True)
    out["bop-reference"] = (
        ReferenceBop(binary_parameters(copy.deepcopy(base)), GAMMA, THRESHOLD),
        False,
    )
    if "bop2" in OPTIMIZERS:  # a colleague's second-order Bop, when present
        model = copy.deepcopy(base)
        binary = {id(q) for q in binary_parameters(model)}
        case = OPTIMIZERS["bop2"](model)
        owner = next(
            o
            for o in case.optimizers.values()
            if all(id(q) in binary for g in o.param_groups for q in g["params"])
        )
        out["bop2"] = (owner, False)
    if include_compact:
        for name, stochastic in (("bop-bf16", False), ("bop-bf16-sr", True)):
            params = binary_parameters(copy.deepcopy(base))
            out[name] = (CompactBop(params, GAMMA, THRESHOLD, stochastic), False)
    return out


def binary_parameters_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [q for g in optimizer.param_groups for q in g["params"]]


def gradient_sets(
    params: list[nn.Parameter], sets: int, scale: float = 1e-3, seed: int = 1
) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(p.shape, generator=generator) * scale for p in params] for _ in range(sets)
    ]


def stepper(optimizer: torch.optim.Optimizer, grads: list[list[torch.Tensor]]) -> Callable[[], Any]:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    counter = [0]

    def step() -> None:
        for p, g in zip(params, grads[counter[0] % len(grads)], strict=True):
            p.grad = g
        optimizer.step()
        counter[0] += 1

    return step


def fidelity(steps: int, signal: float = 3e-4, noise: float = 1e-3) -> dict[str, dict[str, Any]]:
    """Compact variants vs float32 Bop from one start on one gradient stream g = μ + σε.

    μ is a fixed per-weight signal (what a real gradient's mean is), ε fresh noise every step.
    Reports total flips, flips per step in the last 10 % of steps, and the fraction of weights
    whose final sign differs from the float32 reference.
    """
    torch.manual_seed(0)
    base = create_model("binarynet", input_shape=(3, 32, 32))
    runs = {"bop": None, "bop-bf16": False, "bop-bf16-sr": True}
    models = {n: copy.deepcopy(base) for n in runs}
    optims: dict[str, torch.optim.Optimizer] = {}
    for name, stochastic in runs.items():
        params = binary_parameters(models[name])
        optims[name] = (
            Bop(params, GAMMA, THRESHOLD)
            if stochastic is None
            else CompactBop(params, GAMMA, THRESHOLD, stochastic)
        )
    ref_params = binary_parameters(models["bop"])
    generator = torch.Generator().manual_seed(2)
    mean = [torch.randn(p.shape, generator=generator) * signal for p in ref_params]
    flips = {n: [] for n in runs}
    for _ in range(steps):
        grads = [m + torch.randn(m.shape, generator=generator) * noise for m in mean]
        for name, opt in optims.items():
            for p, g in zip(binary_parameters(models[name]), grads, strict=True):
                p.grad = g
            opt.step()
            flips[name].append(
                sum(int(opt.state[p]["flips"]) for p in binary_parameters(models[name]))
            )
    total = sum(p.numel() for p in ref_params)
    tail = max(1, steps // 10)
    out = {}
    for name in runs:
        differ = sum(
            int((a != b).sum())
            for a, b in zip(binary_parameters(models[name]), ref_params, strict=True)
        )
        out[name] = {
            "total_flips": sum(flips[name]),
            "flips_per_step_tail": sum(flips[name][-tail:]) / tail,
            "final_sign_differs_from_fp32": differ / total,
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--no-compact", action="store_true", help="skip the bf16-momentum variants")
    p.add_argument(
        "--fidelity-steps",
        type=int,
        default=200,
        help="steps of the bf16 flip comparison (0 = skip; default 200)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    opts = contenders(not args.no_compact)
    first = next(iter(opts.values()))[0]
    params = binary_parameters_of(first)
    grads = gradient_sets(params, sets=3)
    log(
        f"timing {', '.join(opts)}: {args.rounds} rounds x {args.steps} steps, "
        f"{sum(q.numel() for q in params):,} binary weights"
    )
    times = interleaved(
        {n: stepper(o, grads) for n, (o, _) in opts.items()},
        rounds=args.rounds,
        runs=args.steps,
        warmup=2,
    )
    rows, result = (
        [],
        {
            "machine": machine(),
            "threads": args.threads,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "gamma": GAMMA,
            "threshold": THRESHOLD,
        },
    )
    per_weight: dict[str, float] = {}
    for name, (opt, latent) in opts.items():
        total, scalars, weights = state_bytes(opt, latent)
        per_weight[name] = total / weights
        result[f"{name.replace('-', '_')}_scalar_state_bytes"] = scalars
        key = name.replace("-", "_")
        result[f"{key}_step_ms"] = times[name]["median"]
        result[f"{key}_state_bytes_per_weight"] = per_weight[name]
        result["binary_weights"] = weights
    ref = result["adam_latent_step_ms"]
    for name in opts:
        key = name.replace("-", "_")
        rows.append(
            [
                name,
                result[f"{key}_step_ms"],
                times[name]["min"],
                result[f"{key}_step_ms"] / ref,
                per_weight[name],
                per_weight[name] / per_weight["adam-latent"],
            ]
        )
    result["bop_identical_to_reference"] = all(
        torch.equal(a, b)
        and torch.equal(
            opts["bop"][0].state[a]["momentum"], opts["bop-reference"][0].state[b]["momentum"]
        )
        for a, b in zip(
            *(binary_parameters_of(opts[n][0]) for n in ("bop", "bop-reference")), strict=True
        )
    )
    result["bop_step_ratio_vs_adam_latent"] = result["bop_step_ms"] / ref
    result["bop_state_ratio_vs_adam_latent"] = per_weight["bop"] / per_weight["adam-latent"]
    result["targets_met"] = {
        "step_no_slower": result["bop_step_ratio_vs_adam_latent"] <= 1.0,
        "state_at_most_one_third": 3 * per_weight["bop"] <= per_weight["adam-latent"],
    }
    text = table(
        [
            "optimizer",
            "step ms (median)",
            "step ms (min)",
            "x adam-latent",
            "state B/weight",
            "x adam-latent",
        ],
        rows,
    )
    if args.fidelity_steps > 0 and not args.no_compact:
        log(f"bf16 momentum vs float32 Bop over {args.fidelity_steps} steps")
        fid = fidelity(args.fidelity_steps)
        result["compact_fidelity"] = {"steps": args.fidelity_steps, **fid}
        text += "\n\n" + table(
            ["variant", "total flips", "flips/step (last 10%)", "final signs != fp32 Bop"],
            [
                [n, v["total_flips"], v["flips_per_step_tail"], v["final_sign_differs_from_fp32"]]
                for n, v in fid.items()
            ],
        )
        text += (
            f"\n({args.fidelity_steps} steps, g = mu + sigma*eps, gamma={GAMMA}, tau={THRESHOLD})"
        )
    same = result["bop_identical_to_reference"]
    text += f"\nbop bit-identical to bop-reference (weights, momenta) after the run: {same}"
    text += (
        f"\n\n{result['binary_weights']:,} binary weights, {args.threads} thread(s), "
        f"{args.rounds} rounds x {args.steps} steps, load {result['machine']['load_average']}"
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
