"""Bi-Real Net 18 (Liu et al., "Bi-Real Net", ECCV 2018), as larq-zoo builds it and Helwegen et
al. 2019 train it with Bop.

Layout (native input 3x224x224, sizes in brackets):
    float conv 7x7/2 3->64 [112] + BN + max-pool 3/2 "same" [56]
    16 blocks, each   y = BN(binary conv 3x3(approx_sign(x))) + shortcut(x)
        4 blocks at 64 channels [56]; then 3 stages of 4 blocks at 128 [28], 256 [14], 512 [7];
        the first block of a stage has stride 2 and doubles the channels
    global average pool, float dense 512->K

Shortcuts surround every binary conv (the "bi-real" connections keep the real-valued activations
flowing). A shortcut that changes shape is float: 2x2/2 average pool, 1x1 float conv, BN, as in
the paper. The stem, the downsampling shortcuts and the classifier are float (trained by Adam);
the 16 3x3 convs are binary. Activations use approx_sign (Bi-Real's polynomial estimator);
BatchNorm momentum 0.2 (Keras 0.8), with a trainable scale.

Scaling: Bi-Real scales each kernel by its mean |w| (magnitude-aware sign). Bop keeps kernels
strictly ±1; a positive per-channel factor before BatchNorm is normalised away by it.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): binary convs pad
with +1 (`pad_value="one"`, LCE keeps the bits packed) instead of 0; pass `pad_value="zero"` for
the original. The float 7x7/2 stem pads as Keras' "same" (`same_conv`: (2, 3) at 224), which
keeps it clear of an LCE converter bug with strided padded convs. The stem's max-pool and the
three stride-2 binary convs pad as Keras' "same" too, as larq-zoo's do ((0, 1) on an even size),
so each is one op for LCE (docs/BENCHMARKS.md "Op parity"); `padding_style="torch"` gives
torch's symmetric padding=1, what this module built before (and what a checkpoint that does not
record `padding_style` rebuilds: `models.registry.recorded_kwargs`). Reduced inputs work
(3x32x32 ends at 1x1).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("birealnet18", num_classes=10, input_shape=(3, 32, 32))(
    ...     torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import same_conv, same_max_pool, shortcut, strided_binary_conv
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d

BN_MOMENTUM = 0.2  # torch's momentum is 1 - Keras' (0.8)


class BiRealBlock(nn.Module):
    """approx_sign -> binary conv 3x3 -> BN, plus the (float when reshaping) shortcut; a
    stride-2 conv on a `size` input pads as `padding_style` (`blocks.strided_binary_conv`)."""

    def __init__(
        self, cin: int, cout: int, pad_value: str, input_quantizer: str,
        size: tuple[int, int] = (0, 0), padding_style: str = "keras",
    ) -> None:  # fmt: skip
        super().__init__()
        stride = 1 if cin == cout else 2
        if stride == 2:
            self.conv = strided_binary_conv(
                cin, cout, size, padding_style, pad_value, input_quantizer
            )
        else:
            self.conv = BinaryConv2d(
                cin, cout, 3, padding=1, pad_value=pad_value, input_quantizer=input_quantizer
            )
        self.bn = nn.BatchNorm2d(cout, momentum=BN_MOMENTUM)
        self.shortcut = shortcut(cin, cout, stride, momentum=BN_MOMENTUM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.shortcut(x)


class BiRealNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        filters: int = 64,
        pad_value: str = "one",
        input_quantizer: str = "approx_sign",
        padding_style: str = "keras",
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        stem, size = same_conv(nn.Conv2d(channels, filters, 7, stride=2, bias=False), height, width)
        if padding_style == "keras":
            pool, size = same_max_pool(*size, kernel=3, stride=2)
        else:
            pool, size = nn.MaxPool2d(3, 2, padding=1), (-(-size[0] // 2), -(-size[1] // 2))
        self.stem = nn.Sequential(stem, nn.BatchNorm2d(filters, momentum=BN_MOMENTUM), pool)
        widths = [filters] * 4 + [w for k in (2, 4, 8) for w in [filters * k] * 4]
        blocks = []
        cin = filters
        for cout in widths:
            blocks.append(BiRealBlock(cin, cout, pad_value, input_quantizer, size, padding_style))
            if cout != cin:
                size = (-(-size[0] // 2), -(-size[1] // 2))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_model(
    "birealnet18", num_classes=1000, input_shape=(3, 224, 224),
    top1=(57.47, "larq-zoo BiRealNet"),
    layout={"padding_style": ("keras", "torch")},  # torch's padding until issue 47
)  # fmt: skip
def birealnet18(**kwargs) -> nn.Module:
    """Bi-Real Net 18: float stem, 16 binary 3x3 convs each with a shortcut, float head."""
    return BiRealNet(**kwargs)
