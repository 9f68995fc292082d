"""What the model zoo holds: every registered model with its size, binary share and published
top-1.

Each model is built at its native input size and summarised (`bnnexport.summary.summarize`: one
forward pass traced by `bnnexport.nn.discover`, the discovery every stage reads), so the binary
MAC share is the summary's own number: the MACs of calls whose kernel is a binary kernel and
whose input is binarized, over all MACs. That takes a second or a few per ImageNet model.

Example:
    >>> from bnnexport.zoo import zoo_entry
    >>> entry = zoo_entry("binarynet")
    >>> entry.input_shape, entry.binary_layers, f"{entry.binary_mac_share:.3f}"
    ([3, 32, 32], 9, '0.994')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bnnexport.models import create_model, list_models, model_info
from bnnexport.models.papers import paper_of
from bnnexport.nn.layers import binary_layers
from bnnexport.run.reports import Report
from bnnexport.summary import summarize


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
    binary_mac_share: float  # binary MACs / all MACs for one image (the summary's)
    top1: float | None  # published top-1 accuracy in %, None where none is
    top1_source: str
    description: str
    paper: str = ""  # the paper that introduced the architecture (bnnexport.models.papers)


def zoo_entry(name: str) -> ZooEntry:
    """Size, binary shares and published top-1 of `name` at its native input size and number
    of classes."""
    info = model_info(name)
    with torch.random.fork_rng():  # the random kernels of a throwaway model
        model = create_model(name).eval()
    layers = binary_layers(model)
    summary = summarize(model)
    total = sum(p.numel() for p in model.parameters())
    return ZooEntry(
        name=name,
        input_shape=list(info.input_shape),
        num_classes=info.num_classes,
        parameters=total,
        binary_parameters=summary.binary_parameters,
        binary_share=summary.binary_parameters / total if total else 0.0,
        binary_layers=len(layers),
        binary_mac_share=summary.binary_mac_share,
        top1=info.top1,
        top1_source=info.top1_source,
        description=info.description,
        paper=paper_of(name),
    )


def zoo_entries(
    pattern: str = "*", progress: Callable[[str], None] | None = None
) -> list[ZooEntry]:
    """`zoo_entry` for every registered model matching a shell-style pattern; `progress` is
    told each model's name before it is summarised."""
    entries = []
    for name in list_models(pattern):
        if progress is not None:
            progress(name)
        entries.append(zoo_entry(name))
    return entries
