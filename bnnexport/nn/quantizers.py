"""Activation and kernel quantizers, registered by name (larq's semantics).

Every quantizer maps to {-1, +1} with sign(0) = +1 in the forward pass and differs only in its
pseudo-gradient. The forward is written as `sign(sign(x) + 0.1)`, which the ONNX exporter writes as
`Sign -> Add -> Sign`, a pattern the converter turns into LCE's `LceQuantize` (docs/LCE_NOTES.md
"Binary ops" and "PyTorch to ONNX").

Example:
    >>> import torch
    >>> from bnnexport.nn.quantizers import get_quantizer
    >>> q = get_quantizer("ste_sign")
    >>> q(torch.tensor([-0.5, 0.0, 2.0]))
    tensor([-1.,  1.,  1.])
    >>> q.precision
    1
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
