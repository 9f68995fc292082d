"""Model zoo: every module here registers its models on import.

In: a name (or `module:factory`), the number of classes and the input shape. Out: an
`nn.Module` built of `bnnexport.nn`'s layers. It may import `bnnexport.nn` and
`bnnexport.imports`; nothing else of bnnexport.

Example:
    >>> from bnnexport.models import create_model
    >>> model = create_model("mnist-bnn", num_classes=10)
"""

from bnnexport.models import (  # noqa: F401  (each registers its models)
    binary_alexnet,
    binarynet,
    birealnet,
    densenet,
    dorefanet,
    meliusnet,
    mnist,
    quicknet,
    real_to_binary,
    resnet_e,
    xnornet,
)
from bnnexport.models.registry import (
    ModelInfo,
    create_model,
    list_models,
    model_info,
    register_model,
)

__all__ = ["ModelInfo", "create_model", "list_models", "model_info", "register_model"]
