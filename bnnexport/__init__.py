"""bnnexport: binarized neural networks from PyTorch training to Larq Compute Engine on ARM.

Example:
    >>> import bnnexport
    >>> model = bnnexport.create_model("mnist-bnn")
    >>> optimizer = bnnexport.bop_with_adam(model, gamma=1e-3, threshold=1e-6, lr=1e-2)
    >>> len(bnnexport.binary_parameters(model))
    3
"""

from bnnexport.convert import ConvertReport, convert_module
from bnnexport.layers import BinaryConv2d, BinaryLinear, binary_layers, binary_parameters
from bnnexport.models import create_model, list_models, register_model
from bnnexport.optimizers import Bop, CaseOptimizer, bop_with_adam, flip_rate, latent_adam
from bnnexport.pack import load_packed
from bnnexport.quantizers import get_quantizer, list_quantizers
from bnnexport.runs import load_checkpoint, load_model

__version__ = "0.1.0"

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
