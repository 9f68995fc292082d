"""Find the binary kernels of any `nn.Module`: the parameters Bop should train.

A binary layer is what `converters.patterns` calls one (the one definition `verify` and
`convert` use): a Conv/MatMul/Gemm whose input is binarized and whose kernel is ±1, or ±1 times
a positive scale per output channel. A parameter is a binary kernel when it is such a layer's
kernel, either binarized in the forward pass (`F.conv2d(ste(x), ste(self.w))`: sign, an STE,
`torch.where(w >= 0, 1, -1)`, mean|w| x sign(w)) or used as it is (`F.conv2d(ste(x), self.w)`,
bnnexport's own `BinaryConv2d`), in which case it must hold ±1 itself.

How it is found, for a model never seen before: a copy of the model gets a random sign pattern
and random magnitudes in every weight, is exported to ONNX once and normalised exactly as
`convert` does; each binary layer's kernel is traced back to the parameter whose sign pattern
it carries (per output channel up to a sign: a folded BatchNorm may flip a channel). When the
layer is binary although the magnitudes were random, the forward pass binarizes the parameter;
when the kernel is the parameter itself, it is used as it is. Parameters are never matched by
name.

Example:
    >>> import torch
    >>> from torch import nn
    >>> import torch.nn.functional as F
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.stem = nn.Conv2d(1, 8, 3)
    ...         self.w = nn.Parameter(torch.randn(8, 8, 3, 3))
    ...     def forward(self, x):
    ...         sign = lambda t: torch.where(t >= 0, 1.0, -1.0)
    ...         return F.conv2d(sign(self.stem(x)), sign(self.w)).mean((2, 3))
    >>> [(k.name, k.binarized) for k in find_binary_kernels(Net(), torch.randn(1, 1, 8, 8))]
    [('w', True)]
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bnnexport.errors import ConfigError

# Fewer entries than this cannot be told apart reliably by a random sign pattern.
MIN_ENTRIES = 16

BinarySpec = Iterable[str] | Callable[[str, nn.Parameter], bool]


@dataclass(frozen=True)
class BinaryKernel:
    """A parameter that is a binary layer's kernel.

    `name` is its qualified parameter name, `layer` the ONNX node it feeds, `binarized` True when
    the forward pass binarizes it, False when it is used as it is (then it must be ±1 itself).
    """

    name: str
    layer: str
    binarized: bool


def _marked_copy(model: nn.Module, seed: int) -> tuple[nn.Module, dict[str, np.ndarray]]:
    """A copy of `model` in eval mode whose weights (2 or more dimensions) hold random signs
    with random magnitudes in [0.5, 1.5); {name: the signs as [out, rest]}."""
    probe = copy.deepcopy(model).eval()
    generator = torch.Generator().manual_seed(seed)
    marks = {}
    with torch.no_grad():
        for name, param in probe.named_parameters():
            if param.dim() < 2 or not param.is_floating_point():
                continue
            signs = torch.where(torch.rand(param.shape, generator=generator) < 0.5, -1.0, 1.0)
            magnitudes = 0.5 + torch.rand(param.shape, generator=generator)
            param.copy_((signs * magnitudes).to(param.dtype))
            marks[name] = signs.reshape(param.shape[0], -1).numpy()
    return probe, marks


def _normalized_graph(model: nn.Module, example_input: torch.Tensor):
    """`model` exported once (torch's legacy exporter) and normalised as `convert` does."""
    from converters.graph import OnnxGraph, load_onnx
    from converters.normalize import normalize

    with tempfile.TemporaryDirectory(prefix="bnnexport-discover-") as tmp, torch.no_grad():
        path = Path(tmp) / "probe.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example_input,), str(path), dynamo=False)
        normalized, _ = normalize(load_onnx(path))
    return OnnxGraph.folded(normalized)


def _owner(marks: dict[str, np.ndarray], signs: np.ndarray) -> list[str]:
    """Names of the marked parameters whose sign pattern `signs` carries, each row up to a
    sign (a negative BatchNorm scale folded into the kernel flips its channel)."""
    owners = []
    for name, mark in marks.items():
        if mark.shape != signs.shape or mark.size < MIN_ENTRIES:
            continue
        same = (mark == signs).all(axis=1) | (mark == -signs).all(axis=1)
        if same.all():
            owners.append(name)
    return owners


def find_binary_kernels(
    model: nn.Module, example_input: torch.Tensor, seed: int = 0
) -> list[BinaryKernel]:
    """Every parameter of `model` that is a binary layer's kernel, in graph order (see the
    module docstring). `model` itself is left unchanged.

    Raises:
        ConfigError when a kernel's parameter cannot be told apart from another one.
    """
    from converters.patterns import find_binary_layers_in

    probe, marks = _marked_copy(model, seed)
    found: dict[str, BinaryKernel] = {}
    for match in find_binary_layers_in(_normalized_graph(probe, example_input)):
        kernel = np.moveaxis(np.asarray(match.kernel, np.float64), match.out_axis, 0)
        signs = np.sign(kernel.reshape(kernel.shape[0], -1))
        owners = _owner(marks, signs)
        if len(owners) > 1:
            raise ConfigError(
                f"the kernel of {match.node_name} could be any of {', '.join(owners)}: "
                "name the binary kernels yourself (binary=[...])"
            )
        if owners and owners[0] not in found:
            found[owners[0]] = BinaryKernel(owners[0], match.node_name, binarized=match.binary)
    return list(found.values())


def select_binary(model: nn.Module, binary: BinarySpec) -> list[str]:
    """The parameter names `binary` selects: a list of names, or a predicate(name, param).

    Raises:
        ConfigError naming a parameter the model does not have.
    """
    params = dict(model.named_parameters())
    if callable(binary):
        return [name for name, param in params.items() if binary(name, param)]
    names = [binary] if isinstance(binary, str) else list(binary)
    unknown = [name for name in names if name not in params]
    if unknown:
        raise ConfigError(
            f"{type(model).__name__} has no parameter {', '.join(map(repr, unknown))}; "
            f"it has {', '.join(params) or 'none'}"
        )
    return names
