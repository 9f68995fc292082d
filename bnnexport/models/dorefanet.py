"""DoReFa-Net (Zhou et al., "DoReFa-Net: Training Low Bitwidth Convolutional Neural Networks with
Low Bitwidth Gradients", 2016), with 1-bit weights and 2-bit activations, as larq-zoo builds it
(`literature.DoReFaNet`).

Layout (native input 3x224x224, sizes in brackets; q = 2-bit DoReFa activations):
    float conv 12x12/4 VALID 3->96, with bias [54]
    conv 5x5 256 (1-bit kernel, q input) + BN + max-pool 3/2 "same"   [27]
    conv 3x3 384 (1-bit kernel, q input) + BN + max-pool 3/2 "same"   [14]
    conv 3x3 384 (1-bit kernel, q input) + BN
    conv 3x3 256 (1-bit kernel, q input) + BN + max-pool 3/2 VALID    [6]
    flatten, dense 9216->4096 (1-bit kernel, q input) + BN, dense 4096->4096 (idem) + BN
    clip to [0, 1], float dense 4096->K (with bias)

**Not a binary network in LCE's sense.** Its six 1-bit kernels are binary kernels (Bop trains
them, they are in the model's record and pack at 1 bit), but their inputs are 2-bit:
DoReFa's quantizer (`bnnexport.nn.quantizers.DoReFa`, ``"dorefa"``) maps the activations to
{0, 1/3, 2/3, 1}. LCE's binary ops need 1-bit (±1) inputs on both sides, so these layers
convert to float `CONV_2D` / `FULLY_CONNECTED` ops holding ±1 kernels, and the activations to
float ops (`MINIMUM`, `MUL`, `ROUND`): the flatbuffer has no `LceBconv2d`, and
the summary counts no binary MAC (larq counts them as 2-bit MACs). docs/LCE_NOTES.md
"k-bit activations" says why and what it costs. `activation_bits=1` swaps the 2-bit quantizer
for ste_sign, which gives a true BNN of the same layout (six `LceBconv2d`).

Scaling: DoReFa scales each binary kernel by its layer's mean |w|; a positive factor right before
BatchNorm is normalised away by it, so Bop's ±1 kernels give the same function. BatchNorm has no
trainable scale (larq-zoo's `scale=False`), momentum 0.9 in Keras' convention (0.1 in torch's),
ε = 1e-4. The 2-bit activations' zero padding stays zero padding (0 is one of their levels).

Reduced inputs work down to 3x64x64 (where the last pool leaves 1x1 and the first dense layer
takes 256 features).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("dorefanet", num_classes=10, input_shape=(3, 64, 64))(
    ...     torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import (
    FeatureSize,
    conv_out,
    require_size,
    same_max_pool,
    scale_free_bn,
)
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d, BinaryLinear
from bnnexport.nn.quantizers import DoReFa, SteSign

EPS = 1e-4
# (filters, kernel, max-pool after it: "same", "valid" or None)
CONVS = ((256, 5, "same"), (384, 3, "same"), (384, 3, None), (256, 3, "valid"))


def _bn(channels: int, dims: int = 2) -> nn.Module:
    bn = scale_free_bn(channels, dims=dims)
    bn.eps = EPS
    return bn


class DoReFaNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        activation_bits: int = 2,
        hidden: int = 4096,
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        require_size("dorefanet", min(height, width), 64, "the VALID 3x3 max-pool")
        quantizer = self._quantizer(activation_bits)
        layers: list[nn.Module] = [nn.Conv2d(channels, 96, 12, stride=4)]
        size = FeatureSize("dorefanet", conv_out(height, 12, 4), conv_out(width, 12, 4))
        cin = 96
        for filters, kernel, pool in CONVS:
            layers += [
                BinaryConv2d(cin, filters, kernel, padding=kernel // 2, pad_value="zero",
                             input_quantizer=quantizer()),
                _bn(filters),
            ]  # fmt: skip
            if pool == "same":
                module, (size.height, size.width) = same_max_pool(size.height, size.width)
                layers.append(module)
            elif pool == "valid":
                layers.append(size.max_pool())
            cin = filters
        self.features = nn.Sequential(*layers)
        features = cin * size.height * size.width
        self.classifier = nn.Sequential(
            nn.Flatten(),
            BinaryLinear(features, hidden, input_quantizer=quantizer()), _bn(hidden, dims=1),
            BinaryLinear(hidden, hidden, input_quantizer=quantizer()), _bn(hidden, dims=1),
            nn.Hardtanh(0.0, 1.0),
            nn.Linear(hidden, num_classes),
        )  # fmt: skip

    @staticmethod
    def _quantizer(bits: int):  # noqa: ANN205 - a factory of fresh quantizer modules
        if bits == 1:
            return SteSign
        return lambda: DoReFa(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model(
    "dorefanet", num_classes=1000, input_shape=(3, 224, 224),
    top1=(53.39, "larq-zoo DoReFaNet"),
)  # fmt: skip
def dorefanet(**kwargs) -> nn.Module:
    """DoReFa-Net: 1-bit weights, 2-bit activations (float ops in LCE, no binary MAC)."""
    return DoReFaNet(**kwargs)
