"""BinaryDenseNet-28, -37 and -45 (Bethge et al., "Back to Simplicity: How to Train Accurate BNNs
from Scratch?", 2019), as larq-zoo builds them (`literature.BinaryDenseNet28/37/45`).

Layout (native input 3x224x224, sizes in brackets):
    stem (float): conv 7x7/2 3->64 [112] + BN + ReLU + max-pool 3/2 "same" [56]
    4 dense sections; each dense layer is   x = concat(x, binary conv 3x3 (sign(BN(x))))
        with growth 64 (64 new channels per layer)
    between sections a float transition: BN, max-pool 2/2 [28, 14, 7], ReLU, 1x1 conv to
        round(C // reduction / 32) * 32 channels
    BN, ReLU, global average pool, float dense C->K (with bias)

    layers per section   reductions
    28: 6, 6, 6, 5       2.7, 2.7, 2.2   (23 binary convs)
    37: 6, 8, 12, 6      3.3, 3.3, 4     (32 binary convs)
    45: 6, 12, 14, 8     2.7, 3.3, 4     (40 binary convs)

Every 3x3 conv is binary (Bop trains them); the stem, the transitions' 1x1 convs and the
classifier are float (Adam). Activations and kernels: larq-zoo's `SteSign(clip_value=1.3)`
(`clip_value`); BatchNorm momentum 0.9 in Keras' convention (0.1 in torch's), ε = 1e-5, with
a trainable scale. Below 50 pixels larq-zoo replaces the stem by one 3x3 conv (no BN, ReLU or
pool), and so does this module.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): binary convs pad
with +1 (`pad_value="one"`, LCE keeps the bits packed) instead of larq's 0; `pad_value="zero"`
gives the original. The 7x7/2 stem pads as Keras' "same" (`same_conv`) and the max-pools take
Keras' "same" windows (`same_max_pool`). The 37-dilated variant is not here (BinaryConv2d has no
dilation). Reduced inputs work (3x32x32 and 3x64x64 end at 4x4 and 2x2).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("binary-densenet28", num_classes=10, input_shape=(3, 64, 64))(
    ...     torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import same_conv, same_max_pool
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d
from bnnexport.nn.quantizers import SteSign

BN = {"eps": 1e-5, "momentum": 0.1}  # Keras momentum 0.9
SMALL_INPUT = 50  # below this, larq-zoo's stem is a single 3x3 conv


class DenseLayer(nn.Module):
    """x -> concat(x, binary conv 3x3 (sign(BN(x)))): `growth` new channels."""

    def __init__(self, cin: int, growth: int, pad_value: str, clip_value: float) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(cin, **BN)
        self.conv = BinaryConv2d(
            cin, growth, 3, padding=1, pad_value=pad_value, input_quantizer=SteSign(clip_value)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.conv(self.bn(x))], dim=1)


def transition(cin: int, cout: int) -> nn.Sequential:
    """Float downsampling between sections: BN, max-pool 2/2, ReLU, 1x1 conv."""
    return nn.Sequential(
        nn.BatchNorm2d(cin, **BN),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(cin, cout, 1, bias=False),
    )


def reduced_channels(channels: int, reduction: float) -> int:
    """larq-zoo's transition width: C // reduction, rounded to a multiple of 32.

    Example:
        >>> reduced_channels(448, 2.7), reduced_channels(576, 2.2)
        (160, 256)
    """
    return int(round(channels // reduction / 32)) * 32


class BinaryDenseNet(nn.Module):
    def __init__(
        self,
        layers: tuple[int, ...],
        reductions: tuple[float, ...],
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        initial_filters: int = 64,
        growth: int = 64,
        pad_value: str = "one",
        clip_value: float = 1.3,
    ) -> None:
        super().__init__()
        if len(reductions) != len(layers) - 1:
            raise ValueError("one reduction per transition: len(reductions) == len(layers) - 1")
        self.stem = self._stem(input_shape, initial_filters)
        blocks: list[nn.Module] = []
        channels = initial_filters
        for section, count in enumerate(layers):
            for _ in range(count):
                blocks.append(DenseLayer(channels, growth, pad_value, clip_value))
                channels += growth
            if section < len(reductions):
                width = reduced_channels(channels, reductions[section])
                blocks.append(transition(channels, width))
                channels = width
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.BatchNorm2d(channels, **BN), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(channels, num_classes),
        )  # fmt: skip

    @staticmethod
    def _stem(input_shape: tuple[int, int, int], filters: int) -> nn.Module:
        channels, height, width = input_shape
        if height < SMALL_INPUT:
            return nn.Conv2d(channels, filters, 3, padding=1, bias=False)
        conv, size = same_conv(nn.Conv2d(channels, filters, 7, stride=2, bias=False), height, width)
        pool, _ = same_max_pool(*size, kernel=3, stride=2)
        return nn.Sequential(conv, nn.BatchNorm2d(filters, **BN), nn.ReLU(), pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.stem(x)))


@register_model(
    "binary-densenet28", num_classes=1000, input_shape=(3, 224, 224),
    top1=(60.91, "larq-zoo BinaryDenseNet28"),
)  # fmt: skip
def binary_densenet28(**kwargs) -> nn.Module:
    """BinaryDenseNet-28: 23 binary 3x3 convs in dense sections of 6, 6, 6, 5, float transitions."""
    return BinaryDenseNet((6, 6, 6, 5), (2.7, 2.7, 2.2), **kwargs)


@register_model(
    "binary-densenet37", num_classes=1000, input_shape=(3, 224, 224),
    top1=(62.89, "larq-zoo BinaryDenseNet37"),
)  # fmt: skip
def binary_densenet37(**kwargs) -> nn.Module:
    """BinaryDenseNet-37: 32 binary 3x3 convs in dense sections of 6, 8, 12, 6."""
    return BinaryDenseNet((6, 8, 12, 6), (3.3, 3.3, 4.0), **kwargs)


@register_model(
    "binary-densenet45", num_classes=1000, input_shape=(3, 224, 224),
    top1=(64.59, "larq-zoo BinaryDenseNet45"),
)  # fmt: skip
def binary_densenet45(**kwargs) -> nn.Module:
    """BinaryDenseNet-45: 40 binary 3x3 convs in dense sections of 6, 12, 14, 8."""
    return BinaryDenseNet((6, 12, 14, 8), (2.7, 3.3, 4.0), **kwargs)
