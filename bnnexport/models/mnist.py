"""The default model for the shipped MNIST subset: small, and fully convertible to LCE.

Layout (input 1x28x28):
    float conv 3x3 1->32 (zero pad) + BatchNorm
    binary conv 3x3 32->64 (one-padding) + BatchNorm + max-pool 2   -> 14x14
    binary conv 3x3 64->64 (one-padding) + BatchNorm + max-pool 2   -> 7x7
    binary dense 3136->128 + BatchNorm
    float dense 128->10

Binary layers take input channels in multiples of 32 and output channels in multiples of 8 (LCE's
sizing advice, docs/LCE_NOTES.md "Binary ops"); the max-pools follow their binary convs so LCE runs
them on packed bits.

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("mnist-bnn").eval()(torch.zeros(1, 1, 28, 28)).shape
    torch.Size([1, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d, BinaryLinear


class MnistBnn(nn.Module):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (1, 28, 28),
        width: int = 64,
        hidden: int = 128,
        pad_value: str = "one",
        input_quantizer: str = "ste_sign",
    ) -> None:
        super().__init__()
        channels, height, width_px = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            BinaryConv2d(
                32, width, 3, padding=1, pad_value=pad_value, input_quantizer=input_quantizer
            ),
            nn.BatchNorm2d(width),
            nn.MaxPool2d(2),
            BinaryConv2d(
                width, width, 3, padding=1, pad_value=pad_value, input_quantizer=input_quantizer
            ),
            nn.BatchNorm2d(width),
            nn.MaxPool2d(2),
        )
        flat = width * (height // 4) * (width_px // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            BinaryLinear(flat, hidden, input_quantizer=input_quantizer),
            nn.BatchNorm1d(hidden),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model("mnist-bnn", num_classes=10, input_shape=(1, 28, 28))
def mnist_bnn(**kwargs) -> nn.Module:
    """Small binary conv net for mnist5k: float first conv, 2 binary convs, 1 binary dense."""
    return MnistBnn(**kwargs)
