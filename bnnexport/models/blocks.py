"""Building blocks shared by the zoo models: scale-free BatchNorm, binary conv + BatchNorm pairs,
BinaryNet's binary classifier, the paper's pool-then-BatchNorm order, and output-size
arithmetic.

Example:
    >>> from bnnexport.models.blocks import conv_out, scale_free_bn
    >>> conv_out(224, kernel=11, stride=4, padding=4)
    56
    >>> scale_free_bn(64).weight.requires_grad
    False
    >>> keras_same_pads(224, kernel=3, stride=2)
    (0, 1)
    >>> same_max_pool(112, 112, kernel=3, stride=2)[1]
    (56, 56)
"""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.nn.layers import BinaryConv2d, BinaryLinear


def scale_free_bn(
    channels: int, dims: int = 2, momentum: float = 0.1, eps: float = 1e-5
) -> nn.Module:
    """BatchNorm without a trainable scale (Keras `BatchNormalization(scale=False)`).

    Implemented as an affine BatchNorm whose weight is frozen at 1, so the ONNX graph keeps a
    plain BatchNormalization node. With γ = 1 > 0 the map is increasing per channel, which is
    what lets a max-pool move to either side of it without changing the function.
    """
    kind = nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d
    bn = kind(channels, eps=eps, momentum=momentum)
    bn.weight.requires_grad_(False)
    return bn


def binary_conv_bn(
    cin: int,
    cout: int,
    kernel: int | tuple[int, int],
    padding: int,
    pad_value: str = "one",
    input_quantizer: str = "ste_sign",
    norm: dict[str, float] | None = None,
) -> list[nn.Module]:
    """A binary conv and its scale-free BatchNorm (`norm`: its momentum and eps): the pair LCE
    runs as one `LceBconv2d`."""
    conv = BinaryConv2d(
        cin, cout, kernel, padding=padding, pad_value=pad_value, input_quantizer=input_quantizer
    )
    return [conv, scale_free_bn(cout, **(norm or {}))]


def binary_classifier(
    features: int,
    hidden: int,
    num_classes: int,
    input_quantizer: str = "ste_sign",
    norm: dict[str, float] | None = None,
) -> nn.Sequential:
    """Flatten, then three binary dense layers, each followed by a scale-free BatchNorm
    (`norm`: its momentum and eps)."""
    layers: list[nn.Module] = [nn.Flatten()]
    for fin, fout in ((features, hidden), (hidden, hidden), (hidden, num_classes)):
        layers += [
            BinaryLinear(fin, fout, input_quantizer=input_quantizer),
            scale_free_bn(fout, dims=1, **(norm or {})),
        ]
    return nn.Sequential(*layers)


class PoolThenNorm(nn.Module):
    """Max-pool, then a scale-free BatchNorm, in training: the order of the paper's code, whose
    BatchNorm statistics are the pooled values'. In eval mode (and so in an exported model)
    BatchNorm comes first, the order LCE runs as `LceBconv2d -> LceBMaxPool2d` on packed bits:
    the same function to the bit, since a BatchNorm with a positive scale is increasing per
    channel, its float arithmetic too (every rounding is monotone), and so commutes with a
    max. A BatchNorm whose scale is not positive everywhere keeps the training order (checked
    on entering eval mode and at every eval call; a trace for export takes the last answer,
    so it records no data-dependent branch)."""

    def __init__(self, pool: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.pool, self.norm = pool, norm
        self.lce_order = False

    def train(self, mode: bool = True) -> PoolThenNorm:
        super().train(mode)
        self.lce_order = not mode and self._increasing()
        return self

    def _increasing(self) -> bool:
        with torch.no_grad():
            return bool((self.norm.weight > 0).all())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and not torch.jit.is_tracing():
            self.lce_order = self._increasing()
        if self.training or not self.lce_order:
            return self.norm(self.pool(x))
        return self.pool(self.norm(x))


class FeatureSize:
    """The feature map's (height, width) while a model is built; `max_pool` checks and moves it.

    Example:
        >>> size = FeatureSize("xnornet", 13, 13)
        >>> pool = size.max_pool()
        >>> size.height, size.width
        (6, 6)
    """

    def __init__(self, model: str, height: int, width: int) -> None:
        self.model, self.height, self.width = model, height, width

    def max_pool(self, kernel: int = 3, stride: int = 2) -> nn.MaxPool2d:
        """A max-pool; ValueError naming the model when the map is smaller than its window."""
        require_size(
            self.model, min(self.height, self.width), kernel, f"a {kernel}x{kernel} max-pool"
        )
        self.height = conv_out(self.height, kernel, stride)
        self.width = conv_out(self.width, kernel, stride)
        return nn.MaxPool2d(kernel, stride)


def shortcut(cin: int, cout: int, stride: int, **bn: float) -> nn.Module:
    """Bi-Real Net's shortcut around a binary conv: the identity, or where the conv has stride
    2, a 2x2 average pool, a float 1x1 conv and a BatchNorm (`bn`: its eps and momentum).

    `ceil_mode` keeps odd sizes in step with the stride-2 conv (both give ceil(n / 2)).

    Example:
        >>> import torch
        >>> shortcut(8, 16, 2)(torch.zeros(1, 8, 7, 7)).shape
        torch.Size([1, 16, 4, 4])
    """
    if stride == 1:
        return nn.Identity()
    return nn.Sequential(
        nn.AvgPool2d(2, 2, ceil_mode=True),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout, **bn),
    )


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


def keras_same_pads(size: int, kernel: int, stride: int = 1) -> tuple[int, int]:
    """(before, after) zero padding of TensorFlow/Keras ``padding="same"`` on one axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def same_conv(conv: nn.Conv2d, height: int, width: int) -> tuple[nn.Module, tuple[int, int]]:
    """Wrap an unpadded conv in Keras "same" zero padding for a known input size.

    Returns the module and its output (height, width). The padding is explicit and may be
    asymmetric ((0, 1) for a stride-2 3x3 conv on an even size), exactly as the Keras models
    in larq-zoo pad. Symmetric torch padding would do for torch alone, but a stride-2 conv with
    symmetric padding on an even size is what LCE 0.16's converter silently rewrites to "same"
    (docs/LCE_NOTES.md "Binary ops", bug 1): for a float conv the project's converter does not work
    around it, so the converted model would be wrong. With the "same" amounts the rewrite changes
    nothing.
    """
    (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
    if conv.padding not in ((0, 0), 0, "valid"):
        raise ValueError("same_conv wraps a conv built with padding=0")
    top, bottom = keras_same_pads(height, kh, sh)
    left, right = keras_same_pads(width, kw, sw)
    out = (-(-height // sh), -(-width // sw))
    if not (top or bottom or left or right):
        return conv, out
    return nn.Sequential(nn.ZeroPad2d((left, right, top, bottom)), conv), out


PADDING_STYLES = ("keras", "torch")


def strided_binary_conv(
    cin: int,
    cout: int,
    size: tuple[int, int],
    padding_style: str,
    pad_value: str,
    input_quantizer: object,
) -> BinaryConv2d:
    """A binary 3x3 conv of stride 2 on a `size` (height, width) input, padded as
    `padding_style` says: "keras", larq-zoo's `padding="same"` ((0, 1) on an even size, (1, 1)
    on an odd one), which LCE runs as one `LceBconv2d` (padding SAME); or "torch", padding=1
    on both sides, whose windows on an even size read (1, 0) and need the padding written out
    before the bconv (two CONCATENATIONs; docs/BENCHMARKS.md "Op parity").

    Example:
        >>> strided_binary_conv(8, 16, (56, 56), "keras", "one", "ste_sign").explicit_pads
        (0, 1, 0, 1)
        >>> strided_binary_conv(8, 16, (7, 7), "keras", "one", "ste_sign").padding
        (1, 1)
    """
    if padding_style not in PADDING_STYLES:
        raise ValueError(f"padding_style must be one of {PADDING_STYLES}, got {padding_style!r}")
    padding: int | tuple[int, int, int, int] = 1
    if padding_style == "keras":
        (top, bottom) = keras_same_pads(size[0], 3, 2)
        (left, right) = keras_same_pads(size[1], 3, 2)
        symmetric = top == bottom == left == right
        padding = top if symmetric else (left, right, top, bottom)
    return BinaryConv2d(
        cin, cout, 3, stride=2, padding=padding, pad_value=pad_value,
        input_quantizer=input_quantizer,  # type: ignore[arg-type]
    )  # fmt: skip


def same_max_pool(
    height: int, width: int, kernel: int = 3, stride: int = 2
) -> tuple[nn.MaxPool2d, tuple[int, int]]:
    """A max-pool with Keras' ``padding="same"`` windows, and its output (height, width).

    Keras pads (before, after) with after = before or before + 1 (`keras_same_pads`); torch's
    `padding=before` with `ceil_mode=True` gives exactly those windows (the extra end row or
    column counts as -inf, as Keras' padding does), whatever the sign of the values.
    """
    pads = (keras_same_pads(height, kernel, stride)[0], keras_same_pads(width, kernel, stride)[0])
    out = (-(-height // stride), -(-width // stride))
    return nn.MaxPool2d(kernel, stride, padding=pads, ceil_mode=True), out
