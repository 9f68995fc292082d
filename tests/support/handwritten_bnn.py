"""A BNN as a user writes it in plain PyTorch, nothing from bnnexport: a custom STE
(`torch.autograd.Function`), kernels as bare `nn.Parameter`s binarized in the forward pass, a
residual connection and a binary linear layer. Bop's discovery and the CLI's `--model
handwritten_bnn:hand_written_bnn` both take it as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SignSTE(torch.autograd.Function):
    """+1 where x >= 0, else -1; backward: the gradient where |x| <= 1 (the clipped STE)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x >= 0, 1.0, -1.0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


def ste(x: torch.Tensor) -> torch.Tensor:
    return SignSTE.apply(x)


class HandWrittenBNN(nn.Module):
    """Real stem and pool; binary 3x3 conv, pool; a residual binary 3x3 conv; binary linear head."""

    def __init__(self, channels: int = 16, num_classes: int = 10, input_shape=(1, 28, 28)):
        super().__init__()
        in_channels, height, width = input_shape
        self.stem = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(channels)
        self.w1 = nn.Parameter(torch.randn(channels, channels, 3, 3))
        self.bn1 = nn.BatchNorm2d(channels)
        self.w2 = nn.Parameter(torch.randn(channels, channels, 3, 3))
        self.bn2 = nn.BatchNorm2d(channels)
        self.fc = nn.Parameter(torch.randn(num_classes, channels * (height // 4) * (width // 4)))
        self.bn_out = nn.BatchNorm1d(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.bn0(self.stem(x)), 2)
        x = F.max_pool2d(self.bn1(F.conv2d(ste(x), ste(self.w1), padding=1)), 2)
        x = x + self.bn2(F.conv2d(ste(x), ste(self.w2), padding=1))  # the residual
        return self.bn_out(F.linear(ste(x.flatten(1)), ste(self.fc)))


def hand_written_bnn(num_classes: int = 10, input_shape=(1, 28, 28)) -> nn.Module:
    """The factory `--model handwritten_bnn:hand_written_bnn` names."""
    return HandWrittenBNN(num_classes=num_classes, input_shape=tuple(input_shape))


KERNELS = ["w1", "w2", "fc"]  # what discovery must find, in graph order


def failing_factory(num_classes: int = 10) -> nn.Module:
    """A factory that raises, as a user's may (the CLI must answer in one line)."""
    raise ValueError(f"no model for {num_classes} classes here")
