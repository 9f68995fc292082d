"""What the model zoo holds: every registered model with its size, binary share and published
top-1.

Each model is built at its native input size and summarised (`zoo_entry`;
`bnnexport.stages.summary.summarize`: one forward pass traced by `bnnexport.nn.discover`, the
discovery every stage reads), so the binary MAC share is the summary's own number: the MACs of calls
whose kernel is a binary kernel and whose input is binarized, over all MACs. That takes a second
or a few per ImageNet model (a minute or more for the zoo), so `zoo_entries` reads the figures
the models computed when bnnexport/models/zoo_figures.json was written (`write_figures`,
`python scripts/zoo_figures.py`), each under a fingerprint of the code it came from
(`fingerprint`: the model's own file, the shared layers and blocks, the discovery and the
summary). A model whose code changed since is summarised now, and the caller is told which:
the figures printed are always what the models compute.

Example:
    >>> from bnnexport.stages.zoo import zoo_entry
    >>> entry = zoo_entry("binarynet")
    >>> entry.input_shape, entry.binary_layers, f"{entry.binary_mac_share:.3f}"
    ([3, 32, 32], 9, '0.994')
    >>> matching("mnist"), matching("quicknet-*")
    (['mnist-bnn'], ['quicknet-large', 'quicknet-small'])
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bnnexport.models import create_model, list_models, model_info
from bnnexport.models.papers import paper_of
from bnnexport.nn.layers import binary_layers
from bnnexport.stages.report import Report
from bnnexport.stages.summary import summarize


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


def matching(pattern: str = "*") -> list[str]:
    """The registered models whose name holds `pattern` (`zoo list mnist`), or matches it
    when it is a shell-style pattern (`quicknet-*`)."""
    if any(c in pattern for c in "*?["):
        return [name for name in list_models() if fnmatch.fnmatch(name, pattern)]
    return [name for name in list_models() if pattern in name]


def zoo_entries(
    pattern: str = "*", progress: Callable[[str], None] | None = None
) -> tuple[list[ZooEntry], list[str]]:
    """The zoo entry of every registered model `matching` the pattern, and the names of those
    summarised now (`zoo_entry`) because the stored figures were not made from their current
    code (`fingerprint`); `progress` is told each of those before it is summarised."""
    stored = stored_figures()
    entries, computed = [], []
    for name in matching(pattern):
        found = stored.get(name)
        if found is not None and found.get("fingerprint") == fingerprint(name):
            entries.append(_with_registry(found["entry"], name))
            continue
        if progress is not None:
            progress(name)
        entries.append(zoo_entry(name))
        computed.append(name)
    return entries, computed


PACKAGE = Path(__file__).parents[1]  # bnnexport/
FIGURES = PACKAGE / "models" / "zoo_figures.json"
# what a zoo figure is computed from besides the model's own file (paths from bnnexport/): the
# shared building blocks and layers, the registry's defaults, the discovery and the summary
FIGURE_SOURCES = ("models/blocks.py", "models/registry.py", "nn/layers.py", "nn/quantizers.py",
                  "nn/precision.py", "nn/discover.py", "stages/summary.py")  # fmt: skip


def fingerprint(name: str) -> str:
    """SHA-256 of everything `zoo_entry(name)` depends on: the file defining its factory, the
    `FIGURE_SOURCES` and its registry entry (classes, input shape)."""
    info = model_info(name)
    digest = hashlib.sha256(f"{name} {info.num_classes} {list(info.input_shape)}".encode())
    for path in [Path(inspect.getsourcefile(info.factory)), *(PACKAGE / s for s in FIGURE_SOURCES)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def stored_figures(path: Path = FIGURES) -> dict[str, dict]:
    """{name: {"fingerprint", "entry"}} as `write_figures` stored them; {} without the file
    (or with one written for other fields)."""
    try:
        models = json.loads(path.read_text())["models"]
    except (OSError, ValueError, KeyError):
        return {}
    fields = {f.name for f in dataclasses.fields(ZooEntry)}
    return {n: m for n, m in models.items() if set(m.get("entry", {})) == fields}


def write_figures(path: Path = FIGURES, progress: Callable[[str], None] | None = None) -> Path:
    """Summarise every registered model now and store its figures under its fingerprint."""
    models = {}
    for name in list_models():
        if progress is not None:
            progress(name)
        models[name] = {"fingerprint": fingerprint(name), "entry": zoo_entry(name).to_json()}
    path.write_text(json.dumps({"models": models}, indent=1, sort_keys=True) + "\n")
    return path


def _with_registry(entry: dict, name: str) -> ZooEntry:
    """A stored entry, with what the registry says now (top-1, its source, the description,
    the paper: no model computes those)."""
    info = model_info(name)
    return ZooEntry(**{**entry, "top1": info.top1, "top1_source": info.top1_source,
                       "description": info.description, "paper": paper_of(name)})  # fmt: skip
