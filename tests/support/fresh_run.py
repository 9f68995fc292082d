"""An untrained bnnexport run directory, for the export and convert tests (no training)."""

from __future__ import annotations

from pathlib import Path

import torch

from bnnexport.models import create_model
from bnnexport.stages.init import save_untrained_checkpoint
from bnnexport.training.config import TrainConfig


def fresh_run(root: Path, **model_kwargs) -> Path:
    """An untrained mnist-bnn run directory: fresh BatchNorm, so many exact-zero ties."""
    torch.manual_seed(0)
    model = create_model("mnist-bnn", **model_kwargs)
    root.mkdir(parents=True)
    config = TrainConfig(out=str(root)).to_json()
    save_untrained_checkpoint(root / "checkpoint.pt", "mnist-bnn", model, config)
    return root
