"""One cell of the own-model matrix: a hand-written BNN (tests/support/own_models.py), trained
on some data, taken to an LCE flatbuffer by one path (`pipeline`; `train` then `export` and
`convert`; or `convert_module` on the trained module), and what came of it: converted or the
refusal's line, how many samples each comparison replayed ties on, how many layers became
`LceBconv2d`. Only the command line and `convert_module` are used, so the same cell runs on
any version of bnnexport (the closing note's "before")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from support.cli import run_in_process
from support.image_folders import write_flat_folder

TRAIN = ["--epochs", "1", "--init-sign"]
BATCH = {"mnist5k": "500", "flat": "32"}  # an epoch of mnist5k's 4000 images in 8 steps
BENCH = ["--runs", "2", "--warmup", "1"]


@dataclass
class Cell:
    """What one path made of one trained model."""

    converted: bool
    refusal: str = ""
    replayed: dict[str, int] = field(default_factory=dict)  # comparison -> tie samples
    lce_bconv2d: int = 0
    binary_layers: int = 0


def data_options(data: str, root: Path) -> list[str]:
    """`train` options for "mnist5k" or "flat" (an image folder of flat backgrounds)."""
    if data == "mnist5k":
        return ["--batch-size", BATCH[data]]
    folder = root / "flat-images"
    if not folder.exists():
        write_flat_folder(folder)
    return ["--dataset", "imagefolder", "--data-dir", str(folder), "--val-split", "0.25",
            "--batch-size", BATCH[data]]  # fmt: skip


def _json(result) -> dict | None:
    return json.loads(result.stdout) if result.returncode == 0 else None


def _refused(result) -> Cell:
    lines = result.stderr.strip().splitlines()
    return Cell(False, lines[-1] if lines else f"exit {result.returncode}")


def _cell_of(exported: dict, converted: dict) -> Cell:
    return Cell(
        True,
        replayed={
            "PyTorch vs ONNX Runtime (export)": len(exported.get("tie_samples") or []),
            "LCE vs ONNX Runtime": len(converted.get("tie_samples") or []),
            "LCE vs PyTorch": len(converted.get("torch_tie_samples") or []),
        },
        lce_bconv2d=converted["lce_bconv2d"],
        binary_layers=converted["binary_layers"],
    )


def train_run(model: str, data: str, root: Path, run: Path) -> dict:
    """Train `model` (an own_models factory) on `data` into `run`; its report."""
    args = ["train", "--model", f"support.own_models:{model}", *TRAIN,
            *data_options(data, root), "--out", run, "--json"]  # fmt: skip
    result = run_in_process(*map(str, args))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def convert_cell(run: Path, samples: int) -> Cell:
    """`export RUN` then `convert RUN` of a trained run."""
    exported = run_in_process("export", str(run), "--samples", str(samples), "--json")
    if exported.returncode:
        return _refused(exported)
    converted = run_in_process("convert", str(run), "--target", "arm64", "--json")
    if converted.returncode:
        return _refused(converted)
    return _cell_of(_json(exported), _json(converted))


def pipeline_cell(model: str, data: str, root: Path, run: Path, samples: int) -> Cell:
    args = ["pipeline", "--model", f"support.own_models:{model}", *TRAIN,
            *data_options(data, root), "--samples", samples, *BENCH, "--out", run,
            "--json"]  # fmt: skip
    result = run_in_process(*map(str, args))
    if result.returncode:
        return _refused(result)
    stages = json.loads(result.stdout)["stages"]
    return _cell_of(stages["export"], stages["convert"])


def module_cell(run: Path, samples: int, out: Path) -> Cell:
    """`convert_module` of the run's trained module on the run's first `samples` test samples
    (an exported run: samples.npz)."""
    import torch

    from bnnexport import convert_module
    from bnnexport.errors import BnnExportError
    from bnnexport.run.checkpoint import open_run_model

    model = open_run_model(run).model.eval()
    with np.load(run / "samples.npz") as data:
        inputs = data["inputs"][:samples]
    try:
        report = convert_module(model, torch.from_numpy(inputs[:1]), out=out, samples=inputs)
    except BnnExportError as error:
        return Cell(False, str(error))
    return Cell(
        True, replayed={"LCE vs ONNX Runtime": len(report.tie_samples)},
        lce_bconv2d=report.lce_bconv2d, binary_layers=report.binary_layers,
    )  # fmt: skip
