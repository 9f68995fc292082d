"""Binary layers whose weight parameter IS the binary kernel: exactly ±1 at every moment.

There are no latent weights: Bop (`bnnexport.optim.bop.Bop`) flips entries of `weight` in place.
For the latent-weight baseline, `set_latent(model, True)` makes the layers binarize a real-valued
`weight` in the forward pass instead (straight-through estimator).

Padding (`pad_value`):
- ``"one"`` (default): the binarized input is padded with +1. Every value stays in {-1, +1}, so
  LCE runs the conv on packed bits end to end: the fastest choice on ARM.
- ``"zero"``: torch's usual zero padding after the sign; exact through LCE's border correction,
  but slower.

Example:
    >>> import torch
    >>> from bnnexport.nn.layers import BinaryConv2d, binary_parameters
    >>> conv = BinaryConv2d(32, 64, 3, padding=1)
    >>> bool(((conv.weight == 1) | (conv.weight == -1)).all())
    True
    >>> conv(torch.randn(2, 32, 8, 8)).shape
    torch.Size([2, 64, 8, 8])
    >>> len(binary_parameters(torch.nn.Sequential(conv)))
    1
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bnnexport.nn.precision import BinaryProduct, exact_bound
from bnnexport.nn.quantizers import Quantizer, binarize, get_quantizer

PAD_VALUES = ("one", "zero")


def _random_sign(shape: torch.Size) -> torch.Tensor:
    return binarize(torch.randn(shape))


class BinaryLayer(nn.Module):
    """Mixin marking a layer whose `weight` is a binary kernel (what Bop optimizes)."""

    precision = 1
    latent: bool
    input_quantizer: Quantizer | None
    kernel_quantizer: Quantizer
    product: BinaryProduct | None = None  # set_precision: the bf16 map, None for float32
    grad_bf16 = False  # set_precision: the bf16 map's backward in bf16 too

    def _init_binary(self, input_quantizer: str | Quantizer | None) -> None:
        self.input_quantizer = get_quantizer(input_quantizer)
        self.kernel_quantizer = get_quantizer("ste_sign")
        self.latent = False
        with torch.no_grad():
            self.weight.copy_(_random_sign(self.weight.shape))

    def binary_kernel(self) -> torch.Tensor:
        """The ±1 kernel used in the forward pass (the weight itself unless latent)."""
        return self.kernel_quantizer(self.weight) if self.latent else self.weight

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_quantizer(x) if self.input_quantizer is not None else x

    def bf16_product(self, x: torch.Tensor) -> BinaryProduct | None:
        """The bf16 map to use for this call (`set_precision`), or None for plain float32.

        Only where both operands are ±1: a binarized input (never the first layer's image, nor
        a k-bit one), no bias, not while exporting to ONNX, on a CPU or CUDA tensor.
        """
        if (
            self.product is None
            or self.input_quantizer is None
            or self.input_quantizer.precision != 1
            or self.bias is not None
            or x.device.type not in ("cpu", "cuda")
            or torch.onnx.is_in_onnx_export()
        ):
            return None
        return self.product

    def make_product(self) -> BinaryProduct:
        """The layer's map as a `BinaryProduct` (each layer type says how)."""
        raise NotImplementedError


class BinaryConv2d(nn.Conv2d, BinaryLayer):
    """2-D convolution with a ±1 kernel and (optionally) a binarized input.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, bias: as `nn.Conv2d`
            (padding an int, a pair, or (left, right, top, bottom) as `F.pad` takes it, e.g.
            Keras' "same" (0, 1, 0, 1) for a 3x3/2 conv on an even size,
            `bnnexport.models.blocks.same_binary_conv`; groups and dilation are not supported
            by LCE's bconv).
        pad_value: ``"one"`` or ``"zero"``, see the module docstring.
        input_quantizer: a quantizer name (``"ste_sign"``, ``"approx_sign"``, ``"swish_sign"``),
            a `Quantizer`, or None for a layer whose input is real-valued (a first layer).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | tuple[int, int, int, int] = 0,
        bias: bool = False,
        pad_value: str = "one",
        input_quantizer: str | Quantizer | None = "ste_sign",
    ) -> None:
        if pad_value not in PAD_VALUES:
            raise ValueError(f"pad_value must be one of {PAD_VALUES}, got {pad_value!r}")
        # (left, right, top, bottom), applied by `forward` itself: nn.Conv2d pads symmetrically
        explicit = isinstance(padding, tuple | list) and len(padding) == 4
        symmetric = 0 if explicit else padding
        super().__init__(in_channels, out_channels, kernel_size, stride, symmetric, bias=bias)
        self.explicit_pads = tuple(int(p) for p in padding) if explicit else None  # type: ignore[union-attr]
        self.pad_value = pad_value
        self._init_binary(input_quantizer)

    def _pads(self) -> tuple[int, int, int, int]:
        """(left, right, top, bottom): the padding `forward` applies."""
        if self.explicit_pads is not None:
            return self.explicit_pads  # type: ignore[return-value]
        pad_h, pad_w = self.padding  # type: ignore[misc]
        return (pad_w, pad_w, pad_h, pad_h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.quantize_input(x)
        padding = self.padding
        if any(self._pads()) and (self.pad_value == "one" or self.explicit_pads is not None):
            x = F.pad(x, self._pads(), value=1.0 if self.pad_value == "one" else 0.0)
            padding = (0, 0)
        product = self.bf16_product(x)
        if product is not None:
            return product.forward(x, self.binary_kernel(), self.grad_bf16)
        return F.conv2d(x, self.binary_kernel(), self.bias, self.stride, padding)

    def make_product(self) -> BinaryProduct:
        """The bf16 map of this conv (its padding as `forward` applies it)."""
        one_padded = self.pad_value == "one" or not any(self._pads())
        explicit = self.pad_value == "one" or self.explicit_pads is not None
        padding = (0, 0) if explicit else tuple(self.padding)
        return BinaryProduct(
            exact_bound(self.weight[0].numel(), all_terms_binary=one_padded),
            stride=tuple(self.stride),  # type: ignore[arg-type]
            padding=padding,  # type: ignore[arg-type]
        )

    def extra_repr(self) -> str:
        pads = "" if self.explicit_pads is None else f", pads={self.explicit_pads}"
        return super().extra_repr() + f"{pads}, pad_value={self.pad_value!r}"


class BinaryLinear(nn.Linear, BinaryLayer):
    """Fully connected layer with a ±1 kernel and (optionally) a binarized input.

    LCE has no binary dense op; the converter writes it as a 1x1 binary convolution.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        input_quantizer: str | Quantizer | None = "ste_sign",
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._init_binary(input_quantizer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.quantize_input(x)
        product = self.bf16_product(x)
        if product is not None:
            return product.forward(x, self.binary_kernel(), self.grad_bf16)
        return F.linear(x, self.binary_kernel(), self.bias)

    def make_product(self) -> BinaryProduct:
        """The bf16 map of this layer."""
        return BinaryProduct(exact_bound(self.in_features, all_terms_binary=True))


# torch's public BatchNorm classes (a lazy one becomes its plain class once materialised)
BATCH_NORMS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
)  # fmt: skip


def batch_norms(model: nn.Module) -> list[nn.Module]:
    """Every BatchNorm module of `model`, in `modules()` order."""
    return [m for m in model.modules() if isinstance(m, BATCH_NORMS)]


def binary_layers(model: nn.Module) -> list[tuple[str, BinaryLayer]]:
    """(qualified name, layer) for every binary layer of `model`, in definition order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, BinaryLayer)]


def binary_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The binary kernels of `model` (what Bop optimizes), found by layer type, never by name."""
    return [layer.weight for _, layer in binary_layers(model)]


def set_latent(
    model: nn.Module, enabled: bool, kernel_quantizer: str | Quantizer = "ste_sign"
) -> None:
    """Switch every binary layer to (or from) latent-weight mode.

    In latent mode the weight is real-valued and binarized in the forward pass by
    `kernel_quantizer`; leaving latent mode binarizes the weights in place (sign(0) = +1).
    """
    for _, layer in binary_layers(model):
        layer.latent = enabled
        layer.kernel_quantizer = get_quantizer(kernel_quantizer)
        if not enabled:
            with torch.no_grad():
                layer.weight.copy_(binarize(layer.weight))


def set_precision(model: nn.Module, precision: str) -> None:
    """How every binary layer of `model` computes (`bnnexport.nn.precision`; already resolved, so
    not ``auto``): ``bf16-exact`` and ``bf16`` give each layer a `BinaryProduct`, ``float32``
    and ``amp`` take it away (autocast then decides)."""
    for _, layer in binary_layers(model):
        bf16 = precision in ("bf16-exact", "bf16")
        layer.product = layer.make_product() if bf16 else None
        layer.grad_bf16 = precision == "bf16"


def bf16_counts(model: nn.Module) -> dict[str, int]:
    """{"bf16_calls", "bf16_fallbacks"} summed over the binary layers (`BinaryProduct`)."""
    products = [layer.product for _, layer in binary_layers(model) if layer.product is not None]
    return {
        "bf16_calls": sum(p.calls for p in products),
        "bf16_fallbacks": sum(p.fallbacks for p in products),
    }


@torch.no_grad()
def init_latent_weights(
    model: nn.Module,
    generator: torch.Generator | None = None,
    kernels: dict[str, torch.Tensor] | None = None,
) -> None:
    """Glorot-uniform latent weights (larq's default kernel initializer) for the kernels in
    `kernels` (the optimizer's `binary_kernels`: the run's record), or, without it, for every
    binary layer of bnnexport's.

    Latent weights that start at exactly ±1 sit at the clipping bound, as far from a sign
    change as they can be: with Adam's ~lr-sized steps none flips for the first 1/lr steps.
    """
    if kernels is not None:
        weights = list(kernels.values())
    else:
        weights = [layer.weight for _, layer in binary_layers(model)]
    for weight in weights:
        fan_out, fan_in = weight.shape[0], weight[0].numel()
        receptive = weight[0, 0].numel() if weight.dim() > 2 else 1
        bound = (6.0 / (fan_in + fan_out * receptive)) ** 0.5
        weight.copy_(torch.empty_like(weight).uniform_(-bound, bound, generator=generator))
