"""Real-to-Binary Net (Martinez et al., "Training Binary Neural Networks with Real-to-Binary
Convolutions", ICLR 2020), the BNN larq-zoo builds as `literature.RealToBinaryNet`.

Layout (native input 3x224x224, sizes in brackets):
    stem (float): conv 7x7/2 3->64 [112] + BN + PReLU + max-pool 3/2 "same" [56]
    8 blocks of two halves (16 binary convs); each half is
        z = BN(x)
        y = PReLU(binary conv 3x3(sign(z)) * gate(z)) + shortcut(x)
        gate(z) = sigmoid(W2 ReLU(W1 mean_hw(z))), W1: C_in -> C_in/8, W2: C_in/8 -> C_out
    widths 64 [56], 128 [28], 256 [14], 512 [7]: the first half of blocks 3, 5 and 7 has
        stride 2 and doubles the channels
    global average pool, float dense 512->K (with bias)

The gate is the paper's data-driven channel rescaling (Section 4.3): a squeeze-and-excitation of
the binary conv's own real-valued input, computed in float (two dense layers without bias). A
shortcut that changes shape is float: 2x2/2 average pool, 1x1 conv, BN. The stem (with a
PReLU, as larq-zoo's RealToBinaryNet builds it), gates, shortcuts, PReLUs (one slope per
channel, starting at 0 as Keras' do) and the classifier are
float (Adam); the 16 3x3 convs are binary (Bop). Activations: ste_sign. BatchNorm momentum 0.99
in Keras' convention (0.01 in torch's) and Keras' default ε = 1e-3, as larq-zoo builds it.
The paper's multi-stage training with attention matching and distillation is a training
setting, not part of the model (the recipe `larq-zoo-real-to-binary-net` says what it keeps).

Where LCE's guidance changed larq-zoo's layout (docs/LCE_NOTES.md "Binary ops"): binary convs pad
with +1 (`pad_value="one"`) instead of larq's 0; `pad_value="zero"` gives the original. The
shortcut's average pool runs in ceil mode (Keras' "same" pool). The three stride-2 binary convs
pad as Keras' "same", as larq-zoo's do ((0, 1) on an even size), so each is one `LceBconv2d`
(docs/BENCHMARKS.md "Op parity"); `padding_style="torch"` gives torch's symmetric padding=1, what
this module built before (and what a checkpoint that does not record `padding_style` rebuilds).
Reduced inputs work (3x32x32 ends at 1x1).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> create_model("real-to-binary-net", num_classes=10, input_shape=(3, 32, 32))(
    ...     torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models.blocks import same_conv, same_max_pool, shortcut, strided_binary_conv
from bnnexport.models.registry import register_model
from bnnexport.nn.layers import BinaryConv2d

BN = {"eps": 1e-3, "momentum": 0.01}  # Keras' defaults at momentum 0.99
GATE_REDUCTION = 8  # the paper's r


class Gate(nn.Module):
    """sigmoid(W2 ReLU(W1 mean_hw(z))): one scale in (0, 1) per output channel and sample."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.reduce = nn.Linear(cin, cin // GATE_REDUCTION, bias=False)
        self.expand = nn.Linear(cin // GATE_REDUCTION, cout, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        scales = torch.sigmoid(self.expand(torch.relu(self.reduce(z.mean(dim=(2, 3))))))
        return scales[:, :, None, None]


class HalfBlock(nn.Module):
    """PReLU(binary conv 3x3(sign(BN(x))) * gate(BN(x))) + shortcut(x)."""

    def __init__(
        self, cin: int, cout: int, pad_value: str, size: tuple[int, int] = (0, 0),
        padding_style: str = "keras",
    ) -> None:  # fmt: skip
        super().__init__()
        stride = 1 if cin == cout else 2
        self.bn = nn.BatchNorm2d(cin, **BN)
        if stride == 2:  # padded as `padding_style` says (`blocks.strided_binary_conv`)
            self.conv = strided_binary_conv(cin, cout, size, padding_style, pad_value, "ste_sign")
        else:
            self.conv = BinaryConv2d(
                cin, cout, 3, padding=1, pad_value=pad_value, input_quantizer="ste_sign"
            )
        self.gate = Gate(cin, cout)
        self.prelu = nn.PReLU(cout, init=0.0)
        self.shortcut = shortcut(cin, cout, stride, **BN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.bn(x)
        return self.prelu(self.conv(z) * self.gate(z)) + self.shortcut(x)


class RealToBinaryNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        filters: int = 64,
        pad_value: str = "one",
        padding_style: str = "keras",
    ) -> None:
        super().__init__()
        channels, height, width = input_shape
        conv, size = same_conv(nn.Conv2d(channels, filters, 7, stride=2, bias=False), height, width)
        pool, size = same_max_pool(*size, kernel=3, stride=2)
        prelu = nn.PReLU(filters, init=0.0)
        self.stem = nn.Sequential(conv, nn.BatchNorm2d(filters, **BN), prelu, pool)
        halves = []
        cin = filters
        for block in range(8):  # larq-zoo's blocks 2-9; 4, 6 and 8 downsample
            cout = cin * 2 if block in (2, 4, 6) else cin
            halves.append(HalfBlock(cin, cout, pad_value, size, padding_style))
            if cout != cin:
                size = (-(-size[0] // 2), -(-size[1] // 2))
            halves.append(HalfBlock(cout, cout, pad_value))
            cin = cout
        self.blocks = nn.Sequential(*halves)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


@register_model(
    "real-to-binary-net", num_classes=1000, input_shape=(3, 224, 224),
    top1=(65.01, "larq-zoo RealToBinaryNet"),
    layout={"padding_style": ("keras", "torch")},  # torch's padding until issue 47
)  # fmt: skip
def real_to_binary_net(**kwargs) -> nn.Module:
    """Real-to-Binary Net: 16 binary 3x3 convs, each scaled by a float gate, with shortcuts."""
    return RealToBinaryNet(**kwargs)
