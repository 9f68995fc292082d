"""XNOR-Net (Rastegari et al., ECCV 2016), as larq-zoo builds it and Helwegen et al. 2019 train it
with Bop.

Layout (native input 3x224x224, sizes in brackets):
    float conv 11x11/4, 3->96 [56] + BN + ReLU + max-pool 3/2 [27] + BN
    binary conv 5x5 96->256 + BN + max-pool 3/2                      [13]
    binary conv 3x3 256->384 + BN, 384->384 + BN, 384->256 + BN + max-pool 3/2 [6]
    binary conv 6x6 VALID 256->4096 + BN   (covers the whole 6x6 map: a dense layer)   [1]
    binary conv 1x1 4096->4096 + BN + ReLU
    flatten, float dense 4096->K (no bias)

The first conv and the last dense layer are float (trained by Adam), everything in between is
binary. No shortcuts; BatchNorm without a trainable scale (`scale=False`).

Scaling: XNOR-Net multiplies each binary kernel by the mean |w| of its output channel. Bop keeps
kernels strictly ±1, and a positive per-channel factor right before BatchNorm is normalised away
by it, so the factor is left out: the trained function is the same. The paper's L2 (5e-7) on the
first and last layers is a training setting, not part of the model.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): BatchNorm comes
before each max-pool that follows a binary conv (same function with γ = 1, and LCE keeps those
tensors bit-packed); "same" binary convs pad with +1 (`pad_value`). The float 11x11/4 conv pads as
Keras' "same" (`same_conv`), which keeps it clear of an LCE converter bug with strided padded convs.
The 6x6 conv takes the size of the feature map it sees, so reduced inputs work down to 3x64x64
(where it is 1x1).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("xnornet", num_classes=10, input_shape=(3, 64, 64))(
    ...     torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import FeatureSize, binary_conv_bn, same_conv, scale_free_bn
from bnnexport.models.registry import register_model


class XnorNet(nn.Module):
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
        first, hw = same_conv(nn.Conv2d(channels, 96, 11, stride=4, bias=False), height, width)
        size = FeatureSize("xnornet", *hw)

        def block(cin: int, cout: int, kernel: int | tuple[int, int], padding: int) -> list:
            return binary_conv_bn(cin, cout, kernel, padding, pad_value, input_quantizer)

        self.features = nn.Sequential(
            first,
            scale_free_bn(96),
            nn.ReLU(),
            size.max_pool(),
            scale_free_bn(96),
            *block(96, 256, 5, 2),
            size.max_pool(),
            *block(256, 384, 3, 1),
            *block(384, 384, 3, 1),
            *block(384, 256, 3, 1),
            size.max_pool(),
            *block(256, hidden, (size.height, size.width), 0),
            *block(hidden, hidden, 1, 0),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(hidden, num_classes, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model(
    "xnornet", num_classes=1000, input_shape=(3, 224, 224),
    top1=(44.96, "larq-zoo XNORNet"),
)  # fmt: skip
def xnornet(**kwargs) -> nn.Module:
    """XNOR-Net (Rastegari et al. 2016): float first conv and last dense, 6 binary convs."""
    return XnorNet(**kwargs)
