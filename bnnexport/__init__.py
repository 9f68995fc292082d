"""bnnexport: binarized neural networks from PyTorch training to Larq Compute Engine on ARM.

Example:
    >>> import bnnexport
    >>> model = bnnexport.create_model("mnist-bnn")
    >>> optimizer = bnnexport.bop_with_adam(model, gamma=1e-3, threshold=1e-6, lr=1e-2)
    >>> len(bnnexport.binary_parameters(model))
    3
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Imported on first use: `python -m bnnexport` imports this package before its CLI can catch
# a Ctrl-C, and importing torch here would take seconds of that time.
_EXPORTS = {
    "bnnexport.stages.convert": ("ConvertReport",),
    "bnnexport.stages.convert_any": ("convert_module",),
    "bnnexport.nn.layers": ("BinaryConv2d", "BinaryLinear", "binary_layers", "binary_parameters"),
    "bnnexport.models": ("create_model", "list_models", "register_model"),
    "bnnexport.optim.bop": ("Bop",),
    "bnnexport.optim.composite": ("CaseOptimizer", "bop_with_adam", "latent_adam"),
    "bnnexport.training.flips": ("flip_rate",),
    "bnnexport.nn.quantizers": ("get_quantizer", "list_quantizers"),
    "bnnexport.run.checkpoint": ("load_checkpoint", "load_model", "load_packed"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'bnnexport' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


__all__ = [
    "BinaryConv2d",
    "BinaryLinear",
    "Bop",
    "CaseOptimizer",
    "ConvertReport",
    "binary_layers",
    "binary_parameters",
    "bop_with_adam",
    "convert_module",
    "create_model",
    "flip_rate",
    "get_quantizer",
    "latent_adam",
    "list_models",
    "list_quantizers",
    "load_checkpoint",
    "load_model",
    "load_packed",
    "register_model",
]
