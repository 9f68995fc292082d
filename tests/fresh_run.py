"""An untrained bnnexport run directory, for the export and convert tests (no training)."""

from __future__ import annotations

from pathlib import Path

import torch

from bnnexport.models import create_model
from bnnexport.runs import save_checkpoint
from bnnexport.train import TrainConfig


def fresh_run(root: Path, **model_kwargs) -> Path:
    """An untrained mnist-bnn run directory: fresh BatchNorm, so many exact-zero ties."""
    torch.manual_seed(0)
    model = create_model("mnist-bnn", **model_kwargs)
    kwargs = {k: v for k, v in model.bnnexport_config.items() if k != "name"}
    root.mkdir(parents=True)
    save_checkpoint(
        root / "checkpoint.pt",
        {
            "model_name": "mnist-bnn",
            "model_kwargs": kwargs,
            "model": model.state_dict(),
            "latent": None,
            "optimizer": {},
            "epoch": 0,
            "step": 0,
            "config": TrainConfig(out=str(root)).to_json(),
        },
    )
    return root
