"""Building blocks shared by the zoo models: scale-free BatchNorm and output-size arithmetic.

Example:
    >>> from bnnexport.models.blocks import conv_out, scale_free_bn
    >>> conv_out(224, kernel=11, stride=4, padding=4)
    56
    >>> scale_free_bn(64).weight.requires_grad
    False
    >>> same_pads(224, kernel=3, stride=2)
    (0, 1)
"""

from __future__ import annotations

from torch import nn


def scale_free_bn(channels: int, dims: int = 2, momentum: float = 0.1) -> nn.Module:
    """BatchNorm without a trainable scale (Keras `BatchNormalization(scale=False)`).

    Implemented as an affine BatchNorm whose weight is frozen at 1, so the ONNX graph keeps a
    plain BatchNormalization node. With γ = 1 > 0 the map is increasing per channel, which is
    what lets a max-pool move to either side of it without changing the function.
    """
    bn = (nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d)(channels, momentum=momentum)
    bn.weight.requires_grad_(False)
    return bn


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial output size of a conv or pool (floor mode, symmetric padding)."""
    return (size + 2 * padding - kernel) // stride + 1


def require_size(model: str, size: int, minimum: int, what: str) -> None:
    """ValueError naming the model when a reduced input leaves nothing for a layer."""
    if size < minimum:
        raise ValueError(
            f"{model}: input too small, {what} would see a {size}x{size} feature map "
            f"(needs at least {minimum})"
        )


def same_pads(size: int, kernel: int, stride: int = 1) -> tuple[int, int]:
    """(before, after) zero padding of TensorFlow/Keras ``padding="same"`` on one axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def same_conv(
    conv: nn.Conv2d, height: int, width: int
) -> tuple[nn.Module, tuple[int, int]]:
    """Wrap an unpadded conv in Keras "same" zero padding for a known input size.

    Returns the module and its output (height, width). The padding is explicit and may be
    asymmetric ((0, 1) for a stride-2 3x3 conv on an even size), exactly as the Keras models
    in larq-zoo pad. Symmetric torch padding would do for torch alone, but a stride-2 conv with
    symmetric padding on an even size is what LCE 0.16's converter silently rewrites to "same"
    (DESIGN §2, bug 1): for a float conv the project's converter does not work around it, so the
    converted model would be wrong. With the "same" amounts the rewrite changes nothing.
    """
    (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
    if conv.padding not in ((0, 0), 0, "valid"):
        raise ValueError("same_conv wraps a conv built with padding=0")
    top, bottom = same_pads(height, kh, sh)
    left, right = same_pads(width, kw, sw)
    out = (-(-height // sh), -(-width // sw))
    if not (top or bottom or left or right):
        return conv, out
    return nn.Sequential(nn.ZeroPad2d((left, right, top, bottom)), conv), out
