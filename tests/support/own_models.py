"""BNNs as papers' code writes them, nothing from bnnexport: what "your own model" means.

- `latent_detach_bnn`: latent real weights binarized in forward with the detach trick (ReActNet,
  Bi-Real, IR-Net code: `(sign(w) - w).detach() + w`), Bi-Real's polynomial approx-sign on the
  activations through the same trick, float residual shortcuts and a Bi-Real downsampling
  shortcut (average pool, float 1x1 conv).
- `plus_minus_one_bnn`: ±1 `nn.Parameter` kernels used as they are, a custom
  `torch.autograd.Function` STE, an XNOR-Net++-style learned per-channel scale Γ after each
  binary conv, and a binary head written as `x @ w.t()`.
- `grouped_bnn`: a binary 3x3 conv in two groups of 32 channels (±1 `nn.Parameter` kernels
  through a custom STE) between a float stem and a float head: what the device tests run as
  "a grouped model" (bnnexport writes one LceBconv2d per group).
- `reactnet_bnn`: ReActNet's RSign (`torch.sign(x - β)`, a learned per-channel threshold, the
  plain sign STE'd with the detach trick) and RPReLU, XNOR-Net's per-output-channel α = mean|W|
  times sign(W) computed in forward from latent weights, and a binary `F.linear` head.
- `dw_bnn`: a DWNet-style model: float depthwise 3x3 convs, binary 1x1 convs with an
  `autograd.Function` STE of its own, and a binary `nn.Linear`-shaped head followed by
  BatchNorm1d.
- `unexportable_bnn`: a BNN PyTorch trains fine but the legacy ONNX exporter refuses: an
  `AdaptiveAvgPool2d((3, 3))` on a 7x7 map (3 is no factor of 7).
- `three_channel_bnn`: a 3-channel model, whatever data it is given (MNIST has 1 channel);
  `mislabelled_mnist`, a data set loader that declares the wrong input shape.

`KERNELS[factory]` lists the binary kernels discovery must find. Every factory takes
`num_classes` and `input_shape` as `--model module:factory` passes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from support.handwritten_bnn import SignSTE


def sign(x: torch.Tensor) -> torch.Tensor:
    """+1 where x >= 0, else -1 (torch.sign would map 0 to 0)."""
    return torch.where(x >= 0, 1.0, -1.0)


def detach_sign(w: torch.Tensor) -> torch.Tensor:
    """sign(w) forward, identity backward: the detach trick on a latent weight."""
    return (sign(w) - w).detach() + w


def approx_sign(x: torch.Tensor) -> torch.Tensor:
    """Bi-Real-Net's activation: sign(x) forward, the piecewise polynomial's gradient backward,
    written with the detach trick as the paper's code does."""
    polynomial = torch.where(
        x < -1, -1.0, torch.where(x < 0, 2 * x + x * x, torch.where(x < 1, 2 * x - x * x, 1.0))
    )
    return sign(x).detach() - polynomial.detach() + polynomial


class BiRealBlock(nn.Module):
    """approx_sign -> binary 3x3 conv (latent weight, detach trick) -> BatchNorm, plus the
    float shortcut; with `stride` 2 the shortcut is Bi-Real's average pool + float 1x1 conv."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, 3, 3) * 0.1)
        self.bn = nn.BatchNorm2d(out_channels)
        self.stride = stride
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.AvgPool2d(stride), nn.Conv2d(in_channels, out_channels, 1, bias=False),
                nn.BatchNorm2d(out_channels),
            )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(approx_sign(x), detach_sign(self.weight), stride=self.stride, padding=1)
        return self.bn(y) + self.shortcut(x)


class LatentDetachBNN(nn.Module):
    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        )
        self.blocks = nn.Sequential(BiRealBlock(16, 16), BiRealBlock(16, 32, stride=2))
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def latent_detach_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return LatentDetachBNN(num_classes, tuple(input_shape))


class PlusMinusOneBNN(nn.Module):
    """Real stem; two binary convs whose ±1 kernels are used as they are, each followed by a
    learned per-channel scale Γ (XNOR-Net++) and BatchNorm; a binary head as a matmul."""

    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.stem = nn.Conv2d(channels, 32, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(32)
        self.conv1 = nn.Parameter(sign(torch.randn(32, 32, 3, 3)))
        self.gamma1 = nn.Parameter(torch.ones(1, 32, 1, 1))
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Parameter(sign(torch.randn(32, 32, 3, 3)))
        self.gamma2 = nn.Parameter(torch.ones(1, 32, 1, 1))
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Parameter(sign(torch.randn(num_classes, 32 * (height // 4) * (width // 4))))
        self.bn_out = nn.BatchNorm1d(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn0(self.stem(x))
        x = F.max_pool2d(
            self.bn1(F.conv2d(SignSTE.apply(x), self.conv1, padding=1) * self.gamma1), 2
        )
        x = F.max_pool2d(
            self.bn2(F.conv2d(SignSTE.apply(x), self.conv2, padding=1) * self.gamma2), 2
        )
        return self.bn_out(SignSTE.apply(x.flatten(1)) @ self.fc.t())


def plus_minus_one_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return PlusMinusOneBNN(num_classes, tuple(input_shape))


class GroupedBNN(nn.Module):
    """Float stem (and BatchNorm) -> sign STE -> ±1 3x3 conv in 2 groups of 32 channels ->
    BatchNorm -> max pool -> float head."""

    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.stem = nn.Conv2d(channels, 64, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(64)
        self.grouped = nn.Parameter(sign(torch.randn(64, 32, 3, 3)))
        self.bn1 = nn.BatchNorm2d(64)
        self.head = nn.Linear(64 * (height // 2) * (width // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = SignSTE.apply(self.bn0(self.stem(x)))
        x = F.max_pool2d(self.bn1(F.conv2d(x, self.grouped, padding=1, groups=2)), 2)
        return self.head(x.flatten(1))


def grouped_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return GroupedBNN(num_classes, tuple(input_shape))


class RSign(nn.Module):
    """ReActNet's sign with a learned per-channel threshold β: sign(x - β) forward (plain
    `torch.sign`), the clipped identity backward through the detach trick."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x - self.beta
        clipped = shifted.clamp(-1, 1)
        return torch.sign(shifted).detach() - clipped.detach() + clipped


class RPReLU(nn.Module):
    """ReActNet's RPReLU: PReLU(x - γ) + ζ, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.zeta = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.prelu = nn.PReLU(channels, init=0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prelu(x - self.gamma) + self.zeta


def xnor_kernel(w: torch.Tensor) -> torch.Tensor:
    """XNOR-Net: α sign(w), α = mean |w| per output channel, through the detach trick."""
    alpha = w.abs().mean(dim=tuple(range(1, w.dim())), keepdim=True)
    return (alpha * torch.sign(w) - w).detach() + w


class ReActBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.sign = RSign(channels)
        self.weight = nn.Parameter(torch.randn(channels, channels, 3, 3) * 0.1)
        self.bn = nn.BatchNorm2d(channels)
        self.act = RPReLU(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(self.sign(x), xnor_kernel(self.weight), padding=1)
        return self.act(self.bn(y) + x)


class ReActNetBNN(nn.Module):
    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32)
        )
        self.blocks = nn.Sequential(ReActBlock(32), ReActBlock(32))
        self.head = nn.Parameter(torch.randn(num_classes, 32) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.linear(torch.sign(x).detach() - x.detach() + x, detach_sign(self.head))


def reactnet_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return ReActNetBNN(num_classes, tuple(input_shape))


class DepthwiseBlock(nn.Module):
    """float depthwise 3x3 -> BatchNorm -> own STE -> binary 1x1 -> BatchNorm."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn0 = nn.BatchNorm2d(channels)
        self.weight = nn.Parameter(torch.randn(channels, channels, 1, 1))
        self.bn1 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn0(self.depthwise(x))
        return self.bn1(F.conv2d(SignSTE.apply(y), SignSTE.apply(self.weight)))


class DWBNN(nn.Module):
    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.MaxPool2d(2)
        )
        self.blocks = nn.Sequential(DepthwiseBlock(32), nn.MaxPool2d(2), DepthwiseBlock(32))
        self.fc = nn.Parameter(torch.randn(num_classes, 32 * (height // 4) * (width // 4)))
        self.bn_out = nn.BatchNorm1d(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x)).flatten(1)
        return self.bn_out(F.linear(SignSTE.apply(x), SignSTE.apply(self.fc)))


def dw_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return DWBNN(num_classes, tuple(input_shape))


class UnexportableBNN(nn.Module):
    """A binary conv on a 7x7 map, then AdaptiveAvgPool2d((3, 3)): trains, does not export."""

    def __init__(self, num_classes: int = 10, input_shape=(1, 28, 28)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
            nn.MaxPool2d(4),
        )  # fmt: skip
        self.weight = nn.Parameter(torch.randn(16, 16, 3, 3))
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d((3, 3))
        self.head = nn.Linear(16 * 9, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.bn(F.conv2d(SignSTE.apply(x), SignSTE.apply(self.weight), padding=1))
        return self.head(self.pool(x).flatten(1))


def unexportable_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    return UnexportableBNN(num_classes, tuple(input_shape))


def three_channel_bnn(num_classes: int = 10) -> nn.Module:
    """A model for RGB images, given whatever the data is (its factory ignores input_shape)."""
    return UnexportableBNN(num_classes, (3, 28, 28))


# where tests/support/ties.py can plant a tie: a bias before a binarization whose one flipped
# sign moves the logits (ReActNet's binary head sees only 32 signs: its last binarization)
# (the bias's name, the binarization's index), as `support.ties.TieSite` takes them
TIE_SITES = {
    "latent_detach_bnn": ("stem.1.bias", 0),
    "plus_minus_one_bnn": ("bn0.bias", 0),
    "reactnet_bnn": ("blocks.1.act.zeta", 2),
    "dw_bnn": ("blocks.0.bn0.bias", 0),
}

KERNELS = {
    "latent_detach_bnn": ["blocks.0.weight", "blocks.1.weight"],
    "plus_minus_one_bnn": ["conv1", "conv2", "fc"],
    "reactnet_bnn": ["blocks.0.weight", "blocks.1.weight", "head"],
    "dw_bnn": ["blocks.0.weight", "blocks.2.weight", "fc"],
    "unexportable_bnn": ["weight"],
    "grouped_bnn": ["grouped"],
}


def mislabelled_mnist(data_dir=None, augment: bool = True):
    """A loader of your own whose DatasetSplits declares CIFAR's shape for MNIST's images."""
    import dataclasses

    from bnnexport.datasets import load_dataset

    data = load_dataset("mnist5k", data_dir, augment=augment)
    return dataclasses.replace(data, input_shape=(3, 32, 32))


def mnist_101(data_dir=None, augment: bool = True):
    """mnist5k cut to 101 training images: batches of 50 leave a last batch of one."""
    import dataclasses

    from torch.utils.data import Subset

    from bnnexport.datasets import load_dataset

    data = load_dataset("mnist5k", data_dir, augment=augment)
    return dataclasses.replace(data, train=Subset(data.train, range(101)))
