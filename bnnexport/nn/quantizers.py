"""Activation and kernel quantizers, registered by name (larq's semantics).

Every binary quantizer (`precision` 1) maps to {-1, +1} with sign(0) = +1 in the forward pass and
differs only in its pseudo-gradient. The forward is written as `sign(sign(x) + 0.1)`, which the
ONNX exporter writes as `Sign -> Add -> Sign`, a pattern the converter turns into LCE's
`LceQuantize` (docs/LCE_NOTES.md "Binary ops" and "PyTorch to ONNX").

The one quantizer of more than one bit, ``"dorefa"`` (DoReFa-Net's k-bit activations, `precision`
k), maps to {0, 1/n, ..., 1} with n = 2^k - 1: a layer it feeds is no binary layer (its MACs are
not binary, and LCE runs it as a float op; docs/LCE_NOTES.md "k-bit activations").

Example:
    >>> import torch
    >>> from bnnexport.nn.quantizers import get_quantizer
    >>> q = get_quantizer("ste_sign")
    >>> q(torch.tensor([-0.5, 0.0, 2.0]))
    tensor([-1.,  1.,  1.])
    >>> q.precision
    1
    >>> get_quantizer("dorefa")(torch.tensor([-0.5, 0.2, 0.5, 0.9]))
    tensor([0.0000, 0.3333, 0.6667, 1.0000])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

_REGISTRY: dict[str, Callable[..., Quantizer]] = {}


def register_quantizer(name: str) -> Callable[[type[Quantizer]], type[Quantizer]]:
    """Class decorator: make a quantizer available under `name` for `get_quantizer`."""

    def decorate(cls: type[Quantizer]) -> type[Quantizer]:
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return decorate


def list_quantizers() -> list[str]:
    """Names accepted by `get_quantizer`."""
    return sorted(_REGISTRY)


def get_quantizer(spec: str | Quantizer | None) -> Quantizer | None:
    """Return a quantizer module from a name, an instance (returned as is) or None."""
    if spec is None or isinstance(spec, Quantizer):
        return spec
    if spec not in _REGISTRY:
        raise ValueError(f"unknown quantizer {spec!r}; known: {', '.join(list_quantizers())}")
    return _REGISTRY[spec]()


def binarize(x: torch.Tensor) -> torch.Tensor:
    """sign(x) with sign(0) = sign(-0.0) = +1, in the form that exports as Sign -> Add -> Sign."""
    return torch.sign(torch.sign(x) + 0.1)


class _SignWithPseudoGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, grad_fn: Callable[[torch.Tensor], torch.Tensor]):
        ctx.save_for_backward(x)
        ctx.grad_fn = grad_fn
        return binarize(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        return grad_output * ctx.grad_fn(x), None


class Quantizer(nn.Module):
    """A binary quantizer: forward is sign with sign(0) = +1, backward is `pseudo_gradient(x)`."""

    name = "quantizer"
    precision = 1

    def pseudo_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """d output / d x used in the backward pass, elementwise."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export() or not torch.is_grad_enabled():
            return binarize(x)
        return _SignWithPseudoGradient.apply(x, self.pseudo_gradient)

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


@register_quantizer("ste_sign")
class SteSign(Quantizer):
    """Straight-through estimator: backward passes the gradient where |x| <= clip_value.

    Courbariaux et al., "Binarized Neural Networks", 2016. `clip_value=math.inf` gives the identity
    STE (used to check the paper's Theorem 1 on latent weights).
    """

    def __init__(self, clip_value: float = 1.0) -> None:
        super().__init__()
        self.clip_value = clip_value

    def pseudo_gradient(self, x: torch.Tensor) -> torch.Tensor:
        if math.isinf(self.clip_value):
            return torch.ones_like(x)
        return (x.abs() <= self.clip_value).to(x.dtype)


@register_quantizer("approx_sign")
class ApproxSign(Quantizer):
    """Bi-Real Net's piecewise-polynomial estimator: backward (2 - 2|x|) for |x| <= 1, else 0.

    Liu et al., "Bi-Real Net", ECCV 2018.
    """

    def pseudo_gradient(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(2.0 - 2.0 * x.abs(), min=0.0)


@register_quantizer("swish_sign")
class SwishSign(Quantizer):
    """Sign-Swish estimator: backward beta(2 - beta x tanh(beta x / 2)) / (1 + cosh(beta x)).

    Darabi et al., "BNN+", 2018; beta = 5 as in larq.
    """

    def __init__(self, beta: float = 5.0) -> None:
        super().__init__()
        self.beta = beta

    def pseudo_gradient(self, x: torch.Tensor) -> torch.Tensor:
        bx = self.beta * x
        return self.beta * (2.0 - bx * torch.tanh(bx / 2.0)) / (1.0 + torch.cosh(bx))


class _RoundWithStraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, levels: int):
        ctx.save_for_backward(x)
        return torch.round(torch.clamp(x, 0.0, 1.0) * levels) / levels

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        return grad_output * ((x >= 0) & (x <= 1)).to(grad_output.dtype), None


@register_quantizer("dorefa")
class DoReFa(Quantizer):
    """DoReFa-Net's k-bit activation quantizer: forward round(n clip(x, 0, 1)) / n with
    n = 2^k - 1 (rounding half to even, as ONNX's and TFLite's Round); backward 1 for
    0 <= x <= 1, else 0 (the clip's gradient, straight through the rounding).

    Not binary: `precision` is k (2 by default, DoReFa-Net's and larq-zoo's activations).
    Zhou et al., "DoReFa-Net", 2016, Eq. 9 (activations); larq's `DoReFaQuantizer`.
    """

    def __init__(self, k_bit: int = 2) -> None:
        super().__init__()
        if k_bit < 2:
            raise ValueError(f"dorefa: k_bit must be at least 2 (1 bit is a sign), got {k_bit}")
        self.precision = k_bit
        self.levels = 2**k_bit - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export() or not torch.is_grad_enabled():
            return torch.round(torch.clamp(x, 0.0, 1.0) * self.levels) / self.levels
        return _RoundWithStraightThrough.apply(x, self.levels)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, k_bit={self.precision}"
