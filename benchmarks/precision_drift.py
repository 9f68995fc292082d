"""How far do the opt-in bf16 modes drift from float32 training? Bop's flips, step by step.

Question: BinaryNet (3x32x32) trained on one fixed synthetic batch (uniform [-1, 1] images,
random labels) for `--steps` Bop steps under each `--precision`, from the same initial weights.
For each mode, against `float32`: the fraction of the first step's flips that differ (from the
same weights, so this isolates one backward), the steps whose flip sets are identical, the
binary weights that differ at the end, and the last loss. Later steps start from weights that
already differ, so their differences compound: the first Bop steps flip about half the kernel
(the momentum starts at 0 and τ is tiny), which makes the trajectory chaotic. `bf16-exact`
is a control: it must be identical (0 everywhere).

Run:
    .venv/bin/python benchmarks/precision_drift.py                  # ~2 minutes
    .venv/bin/python benchmarks/precision_drift.py --steps 50 --json
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _common import emit, log, machine, parser, table
from train_throughput import TorchTrainer

from bnnexport.nn.layers import binary_parameters

MODES = ("float32", "bf16-exact", "bf16", "amp")


def trajectory(precision: str, steps: int, batch: int) -> dict[str, Any]:
    """Each step's flip masks (one bool tensor per binary layer), the final kernels, the losses.

    The model, optimizer and batch are train_throughput's (`TorchTrainer`, channels_last)."""
    trainer = TorchTrainer(batch, precision, channels_last=True)
    kernels = binary_parameters(trainer.model)
    flips, losses = [], []
    for _ in range(steps):
        before = [k.detach().clone() for k in kernels]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp"):
            loss = F.cross_entropy(trainer.model(trainer.x).float(), trainer.y)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        flips.append([k.detach() != b for k, b in zip(kernels, before, strict=True)])
        losses.append(loss.item())
    return {"flips": flips, "kernels": [k.detach().clone() for k in kernels], "losses": losses}


def compare(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    steps = list(zip(reference["flips"], other["flips"], strict=True))
    differing = [sum(int((a ^ b).sum()) for a, b in zip(r, o, strict=True)) for r, o in steps]
    first = next((i for i, d in enumerate(differing) if d), None)
    final = sum(
        int((a != b).sum()) for a, b in zip(reference["kernels"], other["kernels"], strict=True)
    )
    total = sum(k.numel() for k in reference["kernels"])
    first_step_flips = sum(int(m.sum()) for m in reference["flips"][0])
    return {
        # the step-1 forward is the same in every mode but amp: this is the backward's doing
        "step1_flips_differing_fraction": differing[0] / max(first_step_flips, 1),
        "identical_steps": sum(d == 0 for d in differing),
        "first_differing_step": None if first is None else first + 1,
        "flips_reference": sum(int(m.sum()) for step in reference["flips"] for m in step),
        "flips_differing": sum(differing),
        "final_weights_differing": final,
        "final_weights_differing_fraction": final / total,
        "last_loss": other["losses"][-1],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=20, help="Bop steps (default 20)")
    p.add_argument("--batch", type=int, default=50, help="batch size (default 50)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = {}
    for mode in MODES:
        log(f"{mode}: {args.steps} steps")
        runs[mode] = trajectory(mode, args.steps, args.batch)
    rows = {mode: compare(runs["float32"], runs[mode]) for mode in MODES[1:]}
    result = {"machine": machine(), "steps": args.steps, "batch": args.batch, "modes": rows}
    result["float32_last_loss"] = runs["float32"]["losses"][-1]
    keys = list(next(iter(rows.values())))
    text = table(["mode", *keys], [[mode, *row.values()] for mode, row in rows.items()])
    text += (
        f"\n\nBinaryNet 3x32x32, batch {args.batch}, {args.steps} Bop steps on one fixed batch; "
        f"float32's last loss {result['float32_last_loss']:.4f}; torch {torch.__version__}"
    )
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
