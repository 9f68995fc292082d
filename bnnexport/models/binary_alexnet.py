"""BinaryAlexNet: AlexNet with binary kernels and activations (Hubara et al., "Binarized Neural
Networks", NIPS 2016), as larq-zoo builds it and Helwegen et al. 2019 train it with Bop.

Layout (native input 3x224x224, sizes in brackets):
    binary-kernel conv 11x11/4, 3->64, real-valued input  [56] + BN + max-pool 3/2 [27]
    binary conv 5x5 64->192 + BN + max-pool 3/2           [13]
    binary conv 3x3 192->384 + BN, 384->384 + BN, 384->256 + BN + max-pool 3/2 [6]
    flatten, binary dense 9216->4096 + BN, 4096->4096 + BN, 4096->K + BN (the logits)

All kernels are binary (Bop trains them all); the first conv's input is the image, so LCE runs it
as a float conv with a ±1 kernel. No float layers, no shortcuts, no biases; BatchNorm without a
trainable scale (larq-zoo's `scale=False`). The 11x11/4 conv pads exactly as Keras' "same"
(`same_conv`: (3, 4) at 224), which also keeps it clear of an LCE converter bug.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): BatchNorm sits
before each max-pool (conv -> BN -> pool -> sign, which LCE runs as a bconv writing packed bits and
a binary max-pool); with γ = 1 the two orders are the same function. "same" binary convs pad with +1
(`pad_value`).

Reduced inputs work down to 3x64x64 (the last pool then sees 3x3); smaller ones raise ValueError.

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("binary-alexnet", num_classes=10, input_shape=(3, 64, 64))(
    ...     torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import (
    FeatureSize,
    binary_classifier,
    binary_conv_bn,
    same_conv,
    scale_free_bn,
)
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d


class BinaryAlexNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        hidden: int = 4096,
        pad_value: str = "one",
        input_quantizer: str = "ste_sign",
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        first, hw = same_conv(
            BinaryConv2d(channels, 64, 11, stride=4, input_quantizer=None), height, width
        )
        size = FeatureSize("binary-alexnet", *hw)

        def block(cin: int, cout: int, kernel: int) -> list[nn.Module]:
            return binary_conv_bn(cin, cout, kernel, kernel // 2, pad_value, input_quantizer)

        self.features = nn.Sequential(
            first,
            scale_free_bn(64),
            size.max_pool(),
            *block(64, 192, 5),
            size.max_pool(),
            *block(192, 384, 3),
            *block(384, 384, 3),
            *block(384, 256, 3),
            size.max_pool(),
        )
        self.classifier = binary_classifier(
            256 * size.height * size.width, hidden, num_classes, input_quantizer
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model(
    "binary-alexnet", num_classes=1000, input_shape=(3, 224, 224),
    top1=(36.30, "larq-zoo BinaryAlexNet"),
)  # fmt: skip
def binary_alexnet(**kwargs) -> nn.Module:
    """BinaryAlexNet (Hubara et al. 2016): 5 binary convs, 3 binary dense layers."""
    return BinaryAlexNet(**kwargs)
