"""QuickNet, QuickNet-Small and QuickNet-Large: Plumerai's networks designed for fast inference
with Larq Compute Engine (larq-zoo `sota.QuickNet`, `sota.QuickNetSmall`, `sota.QuickNetLarge`,
v1.0 layout).

Layout (native input 3x224x224, sizes in brackets; F = section filters):
    stem (float): conv 3x3/2 3->F0/4 + BN + ReLU [112]; depthwise 3x3/2 [56] + BN (no affine);
                  conv 1x1 F0/4->F0 + BN
    4 sections of 4 residual blocks, each   y = x + BN(ReLU(binary conv 3x3(sign(x))))
    before sections 2-4 a float transition block: ReLU, max-pool 2/1, fixed 3x3/2 depthwise
    blur (anti-aliased downsampling, Zhang 2019) [28, 14, 7], 1x1 float conv F(i-1)->F(i) + BN
    ReLU, global average pool, float dense F3->K
    QuickNet: F = 64, 128, 256, 512; QuickNet-Small: F = 32, 64, 256, 512.
    QuickNet-Large: QuickNet's widths with sections of 6, 8, 12, 6 blocks (32 binary convs).

Every 3x3 conv inside a section is binary (16 in all, 32 in QuickNet-Large; Bop trains them) and
has a shortcut around it; the stem, the transitions and the classifier are float (Adam). The
blur kernel is a fixed buffer, not a parameter.

LCE guidance is already QuickNet's design: binary convs pad with +1 (larq's `pad_values=1`),
binary layers have 32 to 512 input channels, all multiples of 32, and the ReLU after each binary
conv fuses into LCE's bconv. Strided float convs (stem, blur) pad as Keras' "same"
(`same_conv`), as larq-zoo does, which also keeps them clear of an LCE converter bug with
symmetric padding. Kernels are strictly ±1 (larq-zoo clips latent weights at 1.25 and binarizes
them with ste_sign; with Bop there are no latent weights). Reduced inputs work (3x32x32 ends at
1x1).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("quicknet-small", num_classes=10, input_shape=(3, 32, 32))(
    ...     torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bnnexport.models.blocks import keras_same_pads, same_conv
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d


class ResidualBlock(nn.Module):
    """x + BN(ReLU(binary conv 3x3 with one-padding(sign(x))))."""

    def __init__(self, channels: int, pad_value: str, input_quantizer: str) -> None:
        super().__init__()
        self.conv = BinaryConv2d(
            channels, channels, 3, padding=1, pad_value=pad_value,
            input_quantizer=input_quantizer,
        )  # fmt: skip
        self.bn = nn.BatchNorm2d(channels, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn(F.relu(self.conv(x)))


class BlurPool(nn.Module):
    """Fixed depthwise [1 2 1]x[1 2 1]/16 blur with stride 2, Keras "same" padding."""

    def __init__(self, channels: int, pads: tuple[int, int, int, int]) -> None:
        super().__init__()
        k = torch.tensor([1.0, 2.0, 1.0])
        kernel = torch.outer(k, k) / 16.0
        self.register_buffer("kernel", kernel.expand(channels, 1, 3, 3).clone())
        self.pads = pads  # (left, right, top, bottom), as F.pad takes them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, self.pads), self.kernel, stride=2, groups=x.shape[1])


class Transition(nn.Module):
    """Float downsampling between sections: ReLU, max-pool 2/1, blur/2, 1x1 conv, BN."""

    def __init__(self, cin: int, cout: int, size: tuple[int, int]) -> None:
        super().__init__()
        height, width = size[0] - 1, size[1] - 1  # after the 2x2 stride-1 max-pool
        if min(height, width) < 1:
            raise ValueError("quicknet: input too small for the transition blocks")
        self.pool = nn.MaxPool2d(2, 1)
        self.blur = BlurPool(cin, (*keras_same_pads(width, 3, 2), *keras_same_pads(height, 3, 2)))
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.out_size = (-(-height // 2), -(-width // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.blur(self.pool(F.relu(x)))))


class QuickNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        section_filters: tuple[int, ...] = (64, 128, 256, 512),
        section_blocks: tuple[int, ...] = (4, 4, 4, 4),
        pad_value: str = "one",
        input_quantizer: str = "ste_sign",
    ) -> None:
        super().__init__()
        if len(section_filters) != len(section_blocks):
            raise ValueError("section_filters and section_blocks must have the same length")
        first = section_filters[0]
        if first % 4:
            raise ValueError(f"the first section's filters must be a multiple of 4, got {first}")
        channels, height, width = input_shape
        conv, size = same_conv(
            nn.Conv2d(channels, first // 4, 3, stride=2, bias=False), height, width
        )
        depthwise, size = same_conv(
            nn.Conv2d(first // 4, first // 4, 3, stride=2, groups=first // 4, bias=False), *size
        )
        self.stem = nn.Sequential(
            conv,
            nn.BatchNorm2d(first // 4),
            nn.ReLU(),
            depthwise,
            nn.BatchNorm2d(first // 4, affine=False),
            nn.Conv2d(first // 4, first, 1, bias=False),
            nn.BatchNorm2d(first),
        )  # fmt: skip
        layers: list[nn.Module] = []
        channels = first
        for filters, blocks in zip(section_filters, section_blocks, strict=True):
            if filters != channels:
                layers.append(Transition(channels, filters, size))
                channels, size = filters, layers[-1].out_size
            layers += [ResidualBlock(channels, pad_value, input_quantizer) for _ in range(blocks)]
        self.sections = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.sections(self.stem(x)))


@register_model(
    "quicknet", num_classes=1000, input_shape=(3, 224, 224),
    top1=(63.3, "larq-zoo QuickNet v1.0"),
)  # fmt: skip
def quicknet(**kwargs) -> nn.Module:
    """QuickNet (larq-zoo v1.0): 16 binary 3x3 convs with shortcuts, float stem/transitions."""
    return QuickNet(**kwargs)


@register_model(
    "quicknet-small", num_classes=1000, input_shape=(3, 224, 224),
    top1=(59.4, "larq-zoo QuickNetSmall v1.0"),
)  # fmt: skip
def quicknet_small(**kwargs) -> nn.Module:
    """QuickNet-Small (larq-zoo v1.0): QuickNet with sections of 32, 64, 256, 512 filters."""
    kwargs.setdefault("section_filters", (32, 64, 256, 512))
    return QuickNet(**kwargs)


@register_model(
    "quicknet-large", num_classes=1000, input_shape=(3, 224, 224),
    top1=(66.9, "larq-zoo QuickNetLarge v1.0"),
)  # fmt: skip
def quicknet_large(**kwargs) -> nn.Module:
    """QuickNet-Large (larq-zoo v1.0): QuickNet with sections of 6, 8, 12, 6 blocks (32 binary)."""
    kwargs.setdefault("section_blocks", (6, 8, 12, 6))
    return QuickNet(**kwargs)
