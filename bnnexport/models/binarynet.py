"""BinaryNet, the CIFAR-10 VGG of Helwegen et al. 2019 (docs/LCE_NOTES.md "Paper recipes") and
Courbariaux et al. 2016.

Layout (native input 3x32x32, sizes in brackets):
    binary-kernel conv 3x3 3->128, VALID, real-valued input   [30]  + BN
    binary conv 3x3 128->128 + BN + max-pool 2                [15]
    binary conv 3x3 128->256 + BN, 256->256 + BN + max-pool 2 [7]
    binary conv 3x3 256->512 + BN, 512->512 + BN + max-pool 2 [3]
    flatten, binary dense 4608->1024 + BN, 1024->1024 + BN, 1024->K + BN (the logits)

Every kernel is binary and trained by Bop, the first conv's too (its input is the image, not
binarized, so LCE runs it as a float conv with a ±1 kernel); there are no float layers, no
shortcuts and no biases. BatchNorm has no trainable scale (the paper's `scale=False`, see
`scale_free_bn`).

Where LCE's guidance changed the paper's code (docs/LCE_NOTES.md "Binary ops"):
- the paper pools before BatchNorm; here BatchNorm comes first (conv -> BN -> max-pool -> sign),
  the order LCE turns into `LceBconv2d -> LceBMaxPool2d` on packed bits. With γ = 1 BatchNorm is
  increasing per channel, so both orders compute the same function in eval mode; in training
  they do not (the statistics are of other values). `pool_first=True` trains in the paper's
  order and evaluates (and exports) in LCE's, the same function to the bit
  (`blocks.PoolThenNorm`); the paper recipes ask for it.
- "same" convs pad the binarized input with +1 (`pad_value="one"`) instead of 0: every value
  stays ±1 and LCE keeps the tensors bit-packed. Pass `pad_value="zero"` for the paper's padding.
- BatchNorm: torch's ε 1e-5 and momentum 0.1 unless `bn_eps` and `bn_momentum` say otherwise
  (Keras' defaults, the paper's: 1e-3 and 0.99, which is torch's 0.01; the paper recipes ask
  for them).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("binarynet")(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import (
    PoolThenNorm,
    binary_classifier,
    binary_conv_bn,
    conv_out,
    require_size,
    scale_free_bn,
)
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d


class BinaryNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (3, 32, 32),
        widths: tuple[int, ...] = (128, 128, 256, 256, 512, 512),
        hidden: int = 1024,
        pad_value: str = "one",
        input_quantizer: str = "ste_sign",
        pool_first: bool = False,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        norm = {"eps": bn_eps, "momentum": bn_momentum}
        layers: list[nn.Module] = [
            BinaryConv2d(channels, widths[0], 3, input_quantizer=None),
            scale_free_bn(widths[0], **norm),
        ]
        h, w = conv_out(height, 3), conv_out(width, 3)
        for index, (cin, cout) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers += binary_conv_bn(cin, cout, 3, 1, pad_value, input_quantizer, norm)
            if index % 2 == 0:  # after the 2nd, 4th and 6th conv
                if pool_first:  # the paper's order in training, LCE's in eval mode
                    layers[-1] = PoolThenNorm(nn.MaxPool2d(2), layers[-1])
                else:
                    layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
        require_size("binarynet", min(h, w), 1, "the classifier")
        self.features = nn.Sequential(*layers)
        features = widths[-1] * h * w
        self.classifier = binary_classifier(features, hidden, num_classes, input_quantizer, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model(
    "binarynet", num_classes=10, input_shape=(3, 32, 32),
    top1=(91.3, "Helwegen et al. 2019, Section 5.2 (CIFAR-10, Bop)"),
)  # fmt: skip
def binarynet(**kwargs) -> nn.Module:
    """The paper's CIFAR-10 BinaryNet: 6 binary convs, 3 binary dense layers, no float layer."""
    return BinaryNet(**kwargs)
