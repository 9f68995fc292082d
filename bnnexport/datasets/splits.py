"""`DatasetSplits`: what every data set loader returns (shared by the loaders and the registry)."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset


@dataclass
class DatasetSplits:
    """A data set's training and test splits and what a model needs to know about it."""

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, int, int]
