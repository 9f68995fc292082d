"""MeliusNet-22 (Bethge et al., "MeliusNet: Can Binary Neural Networks Achieve MobileNet-level
Accuracy?", 2020), as larq-zoo builds it (`literature.MeliusNet22`).

Layout (native input 3x224x224, sizes in brackets):
    grouped stem (float): conv 3x3/2 3->32 [112] + BN + ReLU; grouped conv 3x3 32->32 in 4
        groups + BN + ReLU; grouped conv 3x3 32->64 in 8 groups + BN + ReLU; max-pool 2/2 [56]
    4 sections of 4, 5, 4, 4 blocks; each block is a dense block then an improvement block:
        dense:        x = concat(x, binary conv 3x3 (sign(BN(x))))        (64 new channels)
        improvement:  x[:, -64:] += binary conv 3x3 (sign(BN(x)))        (64 channels improved)
    after sections 1-3 a float transition: BN, max-pool 2/2 [28, 14, 7], ReLU, 1x1 conv to
        160, 224, 256 channels
    BN, ReLU, global average pool, float dense 512->K (with bias)

The improvement block is the paper's: it adds its binary conv's 64 output channels to the last
64 channels of its input and leaves the others as they are (`x[:, :-64]` and `x[:, -64:]` in
torch, ONNX `Slice` nodes and a `Concat`; larq-zoo pads the conv's output with zeros and adds).
The 34 3x3 convs are binary (Bop); the stem's grouped convs (the paper's replacement of the
first 7x7 conv), the transitions' 1x1 convs and the classifier are float (Adam). Activations:
larq-zoo's `SteSign(clip_value=1.3)` (`clip_value`); BatchNorm momentum 0.9 in Keras'
convention (0.1 in torch's), ε = 1e-5.

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): binary convs pad
with +1 (`pad_value="one"`) instead of larq's 0; `pad_value="zero"` gives the original. The
stride-2 stem conv pads as Keras' "same" (`same_conv`); the 2x2 max-pools run in ceil mode,
Keras' "same" windows. Reduced inputs work (3x64x64 ends at 2x2).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("meliusnet22", num_classes=10, input_shape=(3, 64, 64))(
    ...     torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import same_conv
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d
from bnnexport.nn.quantizers import SteSign

BN = {"eps": 1e-5, "momentum": 0.1}  # Keras momentum 0.9
GROWTH = 64  # channels a dense block adds and an improvement block improves


def _normalized_binary_conv(cin: int, pad_value: str, clip_value: float) -> nn.Sequential:
    """BN, then a binary 3x3 conv of its signs to 64 channels."""
    return nn.Sequential(
        nn.BatchNorm2d(cin, **BN),
        BinaryConv2d(
            cin, GROWTH, 3, padding=1, pad_value=pad_value, input_quantizer=SteSign(clip_value)
        ),
    )


class DenseBlock(nn.Module):
    """x -> concat(x, binary conv(sign(BN(x)))): 64 new channels."""

    def __init__(self, cin: int, pad_value: str, clip_value: float) -> None:
        super().__init__()
        self.body = _normalized_binary_conv(cin, pad_value, clip_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


class ImprovementBlock(nn.Module):
    """x[:, -64:] += binary conv(sign(BN(x))): the newest 64 channels improved, the rest kept."""

    def __init__(self, cin: int, pad_value: str, clip_value: float) -> None:
        super().__init__()
        self.body = _normalized_binary_conv(cin, pad_value, clip_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :-GROWTH], x[:, -GROWTH:] + self.body(x)], dim=1)


def _conv_bn_relu(cin: int, cout: int, groups: int) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=False),
        nn.BatchNorm2d(cout, **BN),
        nn.ReLU(),
    ]


def transition(cin: int, cout: int) -> nn.Sequential:
    """Float downsampling between sections: BN, max-pool 2/2, ReLU, 1x1 conv."""
    return nn.Sequential(
        nn.BatchNorm2d(cin, **BN),
        nn.MaxPool2d(2, 2, ceil_mode=True),
        nn.ReLU(),
        nn.Conv2d(cin, cout, 1, bias=False),
    )


class MeliusNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        section_blocks: tuple[int, ...] = (4, 5, 4, 4),
        transitions: tuple[int, ...] = (160, 224, 256),
        pad_value: str = "one",
        clip_value: float = 1.3,
    ) -> None:
        super().__init__()
        if len(transitions) != len(section_blocks) - 1:
            raise ValueError("one transition width per section but the last")
        channels, height, width = input_shape
        conv, _ = same_conv(nn.Conv2d(channels, 32, 3, stride=2, bias=False), height, width)
        self.stem = nn.Sequential(
            conv, nn.BatchNorm2d(32, **BN), nn.ReLU(),
            *_conv_bn_relu(32, 32, groups=4), *_conv_bn_relu(32, 64, groups=8),
            nn.MaxPool2d(2, 2, ceil_mode=True),
        )  # fmt: skip
        blocks: list[nn.Module] = []
        channels = 64
        for section, count in enumerate(section_blocks):
            for _ in range(count):
                blocks.append(DenseBlock(channels, pad_value, clip_value))
                channels += GROWTH
                blocks.append(ImprovementBlock(channels, pad_value, clip_value))
            if section < len(transitions):
                blocks.append(transition(channels, transitions[section]))
                channels = transitions[section]
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.BatchNorm2d(channels, **BN), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(channels, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.stem(x)))


@register_model(
    "meliusnet22", num_classes=1000, input_shape=(3, 224, 224),
    top1=(62.4, "larq-zoo MeliusNet22"),
)  # fmt: skip
def meliusnet22(**kwargs) -> nn.Module:
    """MeliusNet-22: 34 binary 3x3 convs in dense and improvement blocks, grouped float stem."""
    return MeliusNet(**kwargs)
