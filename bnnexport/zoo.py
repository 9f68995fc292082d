"""What the model zoo holds: every registered model with its size and binary share.

Parameters are counted on torch's "meta" device, so listing ImageNet-sized models allocates no
memory and takes about a second.

Example:
    >>> from bnnexport.zoo import zoo_entries
    >>> entry = next(e for e in zoo_entries() if e.name == "binarynet")
    >>> entry.input_shape, entry.binary_layers
    ([3, 32, 32], 9)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnexport.models import create_model, list_models, model_info
from bnnexport.nn.layers import binary_layers
from bnnexport.run.reports import Report


@dataclass
class ZooEntry(Report):
    """One row of `bnnexport zoo list`."""

    name: str
    input_shape: list[int]
    num_classes: int
    parameters: int
    binary_parameters: int
    binary_share: float  # binary parameters / all parameters
    binary_layers: int
    description: str


def zoo_entry(name: str) -> ZooEntry:
    """Size and binary share of `name` at its native input size and number of classes."""
    info = model_info(name)
    with torch.device("meta"):
        model = create_model(name)
    layers = binary_layers(model)
    total = sum(p.numel() for p in model.parameters())
    binary = sum(layer.weight.numel() for _, layer in layers)
    return ZooEntry(
        name=name,
        input_shape=list(info.input_shape),
        num_classes=info.num_classes,
        parameters=total,
        binary_parameters=binary,
        binary_share=binary / total if total else 0.0,
        binary_layers=len(layers),
        description=info.description,
    )


def zoo_entries(pattern: str = "*") -> list[ZooEntry]:
    """`zoo_entry` for every registered model matching a shell-style pattern."""
    return [zoo_entry(name) for name in list_models(pattern)]
