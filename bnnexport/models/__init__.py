"""Model zoo: every module here registers its models on import.

Example:
    >>> from bnnexport.models import create_model
    >>> model = create_model("mnist-bnn", num_classes=10)
"""

from bnnexport.models import mnist  # noqa: F401  (registers its models)
from bnnexport.models.registry import (
    ModelInfo,
    create_model,
    list_models,
    model_info,
    register_model,
)

__all__ = ["ModelInfo", "create_model", "list_models", "model_info", "register_model"]
