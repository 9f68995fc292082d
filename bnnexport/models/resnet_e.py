"""BinaryResNetE-18 (Bethge et al., "Back to Simplicity: How to Train Accurate BNNs from
Scratch?", 2019), as larq-zoo builds it (`literature.BinaryResNetE18`).

Layout (native input 3x224x224, sizes in brackets):
    stem (float): conv 7x7/2 3->64 [112] + BN + ReLU + max-pool 3/2 "same" [56] + BN
    16 residual blocks, each   y = BN(binary conv 3x3(sign(x))) + shortcut(x)
        4 blocks at 64 channels [56]; then 3 stages of 4 blocks at 128 [28], 256 [14], 512 [7];
        the first block of a stage has stride 2 and doubles the channels
    ReLU, global average pool, float dense 512->K (with bias)

ResNet-18 "E" keeps ResNet-18's widths but puts a shortcut around every single binary conv
(twice the blocks, one conv each), as the paper proposes. A shortcut that changes shape is float:
2x2/2 average pool, 1x1 conv, BN. The stem, those shortcuts and the classifier are float (Adam);
the 16 3x3 convs are binary (Bop). Activations and kernels: larq-zoo's `SteSign(clip_value=1.25)`
(`clip_value`); BatchNorm momentum 0.9 in Keras' convention (0.1 in torch's), ε = 1e-5. Below 50
pixels larq-zoo replaces the stem by one 3x3 conv (no BN, ReLU or pool), and so does this module.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): binary convs pad
with +1 (`pad_value="one"`) instead of larq's 0; `pad_value="zero"` gives the original. The
shortcut's average pool runs in ceil mode, which is larq-zoo's pool at even sizes and keeps odd
sizes in step with the stride-2 conv. The three stride-2 binary convs pad as Keras' "same", as
larq-zoo's do ((0, 1) on an even size), so each is one `LceBconv2d` (docs/BENCHMARKS.md "Op
parity"); `padding_style="torch"` gives torch's symmetric padding=1, what this module built
before (and what a checkpoint that does not record `padding_style` rebuilds). Reduced inputs
work (3x32x32 ends at 4x4).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("binary-resnet-e18", num_classes=10, input_shape=(3, 32, 32))(
    ...     torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import same_conv, same_max_pool, shortcut, strided_binary_conv
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d
from bnnexport.nn.quantizers import SteSign

BN = {"eps": 1e-5, "momentum": 0.1}  # Keras momentum 0.9
SMALL_INPUT = 50  # below this, larq-zoo's stem is a single 3x3 conv


class ResidualBlock(nn.Module):
    """BN(binary conv 3x3(sign(x))) + shortcut(x); the shortcut is float where the shape changes."""

    def __init__(
        self, cin: int, cout: int, pad_value: str, clip_value: float,
        size: tuple[int, int] = (0, 0), padding_style: str = "keras",
    ) -> None:  # fmt: skip
        super().__init__()
        stride = 1 if cin == cout else 2
        if stride == 2:  # padded as `padding_style` says (`blocks.strided_binary_conv`)
            self.conv = strided_binary_conv(
                cin, cout, size, padding_style, pad_value, SteSign(clip_value)
            )
        else:
            self.conv = BinaryConv2d(
                cin, cout, 3, padding=1, pad_value=pad_value, input_quantizer=SteSign(clip_value)
            )
        self.bn = nn.BatchNorm2d(cout, **BN)
        self.shortcut = shortcut(cin, cout, stride, **BN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.shortcut(x)


class BinaryResNetE(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        stage_blocks: tuple[int, ...] = (2, 2, 2, 2),
        stage_filters: tuple[int, ...] = (64, 128, 256, 512),
        pad_value: str = "one",
        clip_value: float = 1.25,
        padding_style: str = "keras",
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        first = stage_filters[0]
        size = (height, width)
        if height < SMALL_INPUT:
            self.stem: nn.Module = nn.Conv2d(channels, first, 3, padding=1, bias=False)
        else:
            conv, size = same_conv(
                nn.Conv2d(channels, first, 7, stride=2, bias=False), height, width
            )
            pool, size = same_max_pool(*size, kernel=3, stride=2)
            self.stem = nn.Sequential(
                conv, nn.BatchNorm2d(first, **BN), nn.ReLU(), pool, nn.BatchNorm2d(first, **BN)
            )
        blocks = []
        cin = first
        for count, filters in zip(stage_blocks, stage_filters, strict=True):
            for _ in range(2 * count):  # ResNet's two-conv blocks, one shortcut per conv
                blocks.append(
                    ResidualBlock(cin, filters, pad_value, clip_value, size, padding_style)
                )
                if filters != cin:
                    size = (-(-size[0] // 2), -(-size[1] // 2))
                cin = filters
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_model(
    "binary-resnet-e18", num_classes=1000, input_shape=(3, 224, 224),
    top1=(58.32, "larq-zoo BinaryResNetE18"),
    layout={"padding_style": ("keras", "torch")},  # torch's padding until issue 47
)  # fmt: skip
def binary_resnet_e18(**kwargs) -> nn.Module:
    """BinaryResNetE-18: float stem, 16 binary 3x3 convs each with a shortcut, float head."""
    return BinaryResNetE(**kwargs)
