"""`DatasetSplits`: what every data set loader returns (shared by the loaders and the registry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset


@dataclass
class DatasetSplits:
    """A data set's training and test splits and what a model needs to know about it."""

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, int, int]
    # the loader options that rebuild exactly this data, what the loader chose itself included
    # (imagefolder: the images' own size); train records them as config.json's dataset_options
    options: dict[str, Any] = field(default_factory=dict)
    note: str | None = None  # the choices the loader made for the user, one line each
    # the name of each class, in the order of the model's outputs (None: unnamed); the run
    # records them (config.json, the checkpoint, samples.npz, convert.json, the flatbuffer's
    # metadata) so an app can map outputs to labels
    class_names: list[str] | None = None
