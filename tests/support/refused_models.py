"""Hand-written BNNs the converter cannot take as written, and the spelling its refusal
suggests instead: what "a refusal that helps" is tested on.

- `Upsampling`: a binary `ConvTranspose2d` (its own module, sign on input and kernel), or with
  `subpixel` the binary conv to C x 4 channels + pixel shuffle (reshape -> permute -> reshape)
  the refusal suggests;
- `Padded`: a binary conv with `padding_mode="reflect"` / `"replicate"`, or with `pad_first`
  the padding done before the sign, as the refusal suggests;
- `Permuting`: a channel permutation between two binary convs, by `index_select` (a Gather)
  or by the spelling the refusal gives (`spelled`);
- `Rounded`: a binary conv whose input is binarized as round(tanh(x * 1e6)), ±1 to the trace
  but no binarization the normaliser knows.

Every layer is its own module, so ONNX node names carry the module paths; BatchNorms have
trained-looking statistics (`trained_bn`), so no sample sits on a sign tie.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from support.converter_nets import trained_bn
from support.handwritten_bnn import ste


class SignedConv2d(nn.Conv2d):
    """A conv binarizing its input and its kernel in forward (papers' code)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(ste(x), ste(self.weight), self.bias)


class SignedConvTranspose2d(nn.ConvTranspose2d):
    """A transposed conv binarizing its input and its kernel in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose2d(ste(x), ste(self.weight), None, self.stride, self.padding)


class RoundedConv2d(nn.Conv2d):
    """A conv whose input is binarized in an odd way: round(tanh(x * 1e6))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(torch.tanh(x * 1e6).round(), ste(self.weight), self.bias)


class Stem(nn.Sequential):
    def __init__(self, channels: int) -> None:
        super().__init__(
            nn.Conv2d(1, channels, 3, padding=1, stride=2, bias=False),
            trained_bn(nn.BatchNorm2d(channels), seed=1),
        )


class Upsampling(nn.Module):
    """stem -> binary 3x3 conv -> binary 2x2/2 transposed conv (or, `subpixel`, a binary 1x1
    conv to 4 x 16 channels and a pixel shuffle) -> BatchNorm -> pooled head. Takes
    (N, 1, 8, 8)."""

    def __init__(self, subpixel: bool = False) -> None:
        super().__init__()
        self.subpixel = subpixel
        self.stem = Stem(16)
        self.b0 = SignedConv2d(16, 16, 3, padding=1, bias=False)
        self.bn0 = trained_bn(nn.BatchNorm2d(16), seed=2)
        if subpixel:
            self.up = SignedConv2d(16, 16 * 4, 1, bias=False)
        else:
            self.up = SignedConvTranspose2d(16, 16, 2, stride=2, bias=False)
        self.bn1 = trained_bn(nn.BatchNorm2d(16), seed=3)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.up(self.bn0(self.b0(self.stem(x))))
        if self.subpixel:  # depth to space, as the refusal spells it
            n, c, h, w = x.shape
            x = x.reshape(n, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
            x = x.reshape(n, c // 4, h * 2, w * 2)
        return self.head(F.adaptive_avg_pool2d(self.bn1(x), 1).flatten(1))


class Padded(nn.Module):
    """stem -> binary 3x3 conv -> binary 3x3 conv padded by `mode` ("reflect", "replicate")
    -> pooled head; with `pad_first` the second conv's padding is done before its sign, the
    way the refusal suggests. Takes (N, 1, 8, 8)."""

    def __init__(self, mode: str, pad_first: bool = False) -> None:
        super().__init__()
        self.mode, self.pad_first = mode, pad_first
        self.stem = Stem(16)
        self.b1 = SignedConv2d(16, 16, 3, padding=1, bias=False)
        self.bn1 = trained_bn(nn.BatchNorm2d(16), seed=2)
        padding, mode = (0, "zeros") if pad_first else (1, mode)
        self.b2 = SignedConv2d(16, 16, 3, padding=padding, bias=False, padding_mode=mode)
        self.bn2 = trained_bn(nn.BatchNorm2d(16), seed=3)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.b1(self.stem(x)))
        if self.pad_first and self.mode == "reflect":
            x = F.pad(x, (1, 1, 1, 1), mode="reflect")
        elif self.pad_first:  # replicate, with slices
            x = torch.cat([x[..., :1], x, x[..., -1:]], -1)
            x = torch.cat([x[..., :1, :], x, x[..., -1:, :]], -2)
        return self.head(F.adaptive_avg_pool2d(self.bn2(self.b2(x)), 1).flatten(1))


class Rounded(Padded):
    """`Padded`'s layers with a zero-padded second conv that binarizes by rounding."""

    def __init__(self) -> None:
        super().__init__("zeros")
        self.b2 = RoundedConv2d(16, 16, 3, padding=1, bias=False)


class Permute(nn.Module):
    """x[:, perm] by index_select (a Gather in ONNX), or by `spelled`, PyTorch code in `x`
    (`n, c, h, w` are x's sizes) the way the refusal writes it."""

    def __init__(self, perm: torch.Tensor, spelled: str | None = None) -> None:
        super().__init__()
        self.register_buffer("perm", perm)
        self.spelled = spelled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spelled is None:
            return x.index_select(1, self.perm)
        n, c, h, w = x.shape
        return eval(self.spelled, {"torch": torch}, {"x": x, "n": n, "c": c, "h": h, "w": w})


class Permuting(nn.Module):
    """stem -> binary conv -> BatchNorm -> channel permutation -> binary conv -> pooled head.
    Takes (N, 1, 8, 8)."""

    def __init__(self, perm: torch.Tensor, spelled: str | None = None) -> None:
        super().__init__()
        self.stem = Stem(16)
        self.b1 = SignedConv2d(16, 16, 3, padding=1, bias=False)
        self.bn1 = trained_bn(nn.BatchNorm2d(16), seed=2)
        self.shuffle = Permute(perm, spelled)
        self.b2 = SignedConv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = trained_bn(nn.BatchNorm2d(16), seed=3)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shuffle(self.bn1(self.b1(self.stem(x))))
        return self.head(F.adaptive_avg_pool2d(self.bn2(self.b2(x)), 1).flatten(1))


SHUFFLE = torch.arange(16).reshape(2, 8).t().reshape(-1)  # ShuffleNet's, two groups
SWAP = torch.cat([torch.arange(8, 16), torch.arange(0, 8)])  # the two halves swapped
