"""Plant a real float32 sign tie in a trained model of your own: one binarization input that
PyTorch and ONNX Runtime round to opposite sides of zero, on one sample.

PyTorch's BatchNorm and ONNX Runtime's sum and scale in other orders, so on most positions
their values of a BatchNorm output differ by an ulp or so. At a position where they differ
(PyTorch `a`, ONNX Runtime `b`), shifting that channel's bias (the BatchNorm's own, or one
added after it) by -(a + b) / 2 puts the two on opposite sides of zero, |a - b| / 2 away from
it: a tie of the kind MNIST's backgrounds make by the dozen, planted where the test wants one.
Positions whose value repeats in their channel (a background) are skipped: there one shift
makes hundreds of ties, the degenerate case the gate calls inconclusive. The search runs on this
machine's runtimes, so it finds a tie whatever their summation orders; `side` may require a
third runtime (LCE) to side with ONNX Runtime there, so that only PyTorch stands apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bnnexport.converters.gate.checks import binarization_inputs
from bnnexport.converters.graph import load_onnx
from bnnexport.converters.normalize import normalize
from torch import nn

from bnnexport.stages.torch_probe import TracedProbe


@dataclass(frozen=True)
class TieSite:
    """Where a tie can be planted: a per-channel `bias` parameter (by name) added to the input
    of the model's binarization number `binarization` (0: the first), nothing in between but
    elementwise ops that keep values apart (a BatchNorm's own bias, a pooled mean's shift)."""

    bias: str
    binarization: int = 0


@dataclass(frozen=True)
class PlantedTie:
    """Where the tie is: sample, flat position in the binarization input, its channel, the
    bias shift that made it, and the binarization input's ONNX name."""

    sample: int
    position: int
    channel: int
    shift: float
    source: str


def source_values(
    model: nn.Module, onnx_path: Path, inputs: np.ndarray, k: int = 0
) -> tuple[str, np.ndarray, np.ndarray]:
    """(binarization k's ONNX source, PyTorch's values of it, ONNX Runtime's) on `inputs`, ONNX
    Runtime running the graph as the normaliser writes it (as the gate does)."""
    probe = TracedProbe(model, onnx_path, inputs[0])
    source = probe.sources[k]
    ours = np.stack([probe.run(x)[1][k] for x in inputs]).reshape(len(inputs), -1)
    graph = normalize(load_onnx(onnx_path))[0]
    theirs = binarization_inputs(graph, [source], inputs)[source].reshape(len(inputs), -1)
    return source, ours, theirs


def plant_tie(
    model: nn.Module,
    at: TieSite,
    export: Callable[[nn.Module], Path],
    inputs: np.ndarray,
    side: Callable[[int, int], float] | None = None,
    tries: int = 60,
) -> PlantedTie:
    """Shift one channel of `at.bias` (added to the input of binarization `at.binarization`) so
    that PyTorch and ONNX Runtime (`export(model)` -> the ONNX file) binarize one position of one of
    `inputs` differently and their outputs on it part by more than the gate's tolerance;
    `side(sample, position)`, when given, is a third runtime's value there before the shift,
    which must lie on ONNX Runtime's side. Changes `model` in place.
    AssertionError when no such position is found in `tries` candidates."""
    bias = model.get_parameter(at.bias)
    _, ours, theirs = source_values(model, export(model), inputs, at.binarization)
    channels = bias.numel()
    per_channel = ours.shape[1] // channels
    for sample, position in _candidates(ours, theirs, channels)[:tries]:
        a, b = float(ours[sample, position]), float(theirs[sample, position])
        if side is not None and abs(side(sample, position) - b) >= abs(side(sample, position) - a):
            continue
        channel, shift = position // per_channel, -(a + b) / 2
        with torch.no_grad():
            bias.view(-1)[channel] += shift
        path = export(model)
        source, after_ours, after_theirs = source_values(model, path, inputs, at.binarization)
        split = (after_ours[sample, position] < 0) != (after_theirs[sample, position] < 0)
        if split and _outputs_part(model, path, inputs, sample):
            return PlantedTie(sample, position, channel, shift, source)
        with torch.no_grad():
            bias.view(-1)[channel] -= shift
    raise AssertionError(f"no position of {tries} tried could carry a tie")


def _outputs_part(model: nn.Module, path: Path, inputs: np.ndarray, sample: int) -> bool:
    """Whether PyTorch's and ONNX Runtime's outputs on `sample` differ by more than the gate's
    tolerance (a tie the next layers absorb, behind a max-pool say, needs no replay)."""
    from bnnexport.converters.gate import RTOL, compare_outputs
    from bnnexport.converters.runtimes import run_onnx

    from bnnexport.stages.export import torch_outputs

    ours, theirs = torch_outputs(model, inputs), run_onnx(path, inputs)
    tolerance = compare_outputs(ours, theirs, RTOL).tolerance
    return float(np.abs(ours[sample] - theirs[sample]).max()) > tolerance


def _candidates(ours: np.ndarray, theirs: np.ndarray, channels: int) -> list[tuple[int, int]]:
    """(sample, position) where the two runtimes' values differ and the value is its channel's
    own (not a repeated background), nearest zero first."""
    found = []
    by_channel = ours.reshape(len(ours), channels, -1)
    for sample, position in zip(*np.nonzero(ours != theirs), strict=True):
        row = by_channel[sample, position // by_channel.shape[2]]
        if (row == ours[sample, position]).sum() == 1:
            found.append((abs(float(ours[sample, position])), int(sample), int(position)))
    return [(s, p) for _, s, p in sorted(found)]


def plant_in_run(
    run: Path, at: TieSite, side: Callable[[int, int], float] | None = None
) -> PlantedTie:
    """`plant_tie` on a run's model at `at` (`own_models.TIE_SITES`), on the run's check samples
    (samples.npz, so `bnnexport export` once first); the shifted model goes back into
    checkpoint.pt, where export and convert read it."""
    from bnnexport.run.checkpoint import load_checkpoint, open_run_model, save_checkpoint
    from bnnexport.stages.export import onnx_export

    model = open_run_model(run).model.eval()
    with np.load(run / "samples.npz") as samples:
        inputs = samples["inputs"]
    path = run.parent / f"{run.name}-planting.onnx"

    def export(net: nn.Module) -> Path:
        onnx_export(net, torch.from_numpy(inputs[:1]), path, do_constant_folding=False)
        return path

    tie = plant_tie(model, at, export, inputs, side)
    payload = {k: v for k, v in load_checkpoint(run).items() if k not in ("format", "version")}
    save_checkpoint(run / "checkpoint.pt", {**payload, "model": model.state_dict()})
    return tie
