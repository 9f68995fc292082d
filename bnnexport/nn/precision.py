"""How a binary layer computes while training: float32, or bfloat16 where that is exact.

In a binary layer both operands are ±1, so every product is ±1 and every partial sum an integer;
oneDNN (CPU) and cuDNN accumulate bf16 products in float32 and round the result to bf16 once.
bf16 has 8 significant bits, so an integer v is stored exactly when |v| < 256; when all n terms
are ±1 (no zero padding) and n is even, every sum is even, and even integers are exact up to
512. Hence `bf16-exact`: compute the forward in bf16, and if the largest |output| reaches that
bound, recompute that call in float32. The result is then the float32 result bit for bit; the
backward (real-valued gradients, which bf16 would round) stays float32. docs/LCE_NOTES.md "bf16"
states the argument; benchmarks/train_throughput.py measures what each mode buys.

Modes (`TrainConfig.precision`, `bnnexport train --precision`):
- ``float32``: plain PyTorch.
- ``bf16-exact``: binary layers' forward in bf16 where exact (above); training is identical to
  float32 bit for bit.
- ``bf16``: as ``bf16-exact``, and the binary layers' backward in bf16 too: the gradients that
  reach Bop and the layer below are rounded to bf16 (8 significant bits). Faster, not exact.
- ``amp``: ``torch.autocast`` in bf16 over the whole forward, float first layer and BatchNorm
  included. Fastest, not exact.
- ``auto`` (default): ``bf16-exact`` where the hardware has bf16 arithmetic (a CPU with
  AVX512_BF16 or AMX, a CUDA GPU that supports bf16), else ``float32``.

Example:
    >>> import torch
    >>> from bnnexport.nn.precision import BinaryProduct, exact_bound
    >>> x = torch.ones(1, 300)                    # 300 terms of +1: 300 is not exact in bf16...
    >>> w = torch.ones(1, 300)
    >>> product = BinaryProduct(exact_bound(300, all_terms_binary=True))
    >>> float(product.forward(x, w, grad_bf16=False)), product.fallbacks  # ...300 is even, < 512
    (300.0, 0)
    >>> product = BinaryProduct(exact_bound(301, all_terms_binary=True))
    >>> float(product.forward(torch.ones(1, 301), torch.ones(1, 301), grad_bf16=False))
    301.0
    >>> product.fallbacks                          # 301 is odd: recomputed in float32
    1
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

PRECISIONS = ("auto", "float32", "bf16-exact", "bf16", "amp")
# BinaryProduct.exact_forward: after GIVE_UP fallbacks in a row, try bf16 every RETRY-th call
GIVE_UP, RETRY = 2, 16


def exact_bound(fan_in: int, all_terms_binary: bool) -> float:
    """The |output| below which a bf16 result of `fan_in` ±1 products is the exact integer.

    256 always (every integer below it has at most 8 significant bits); 512 when every term is
    ±1 and `fan_in` is even, since every sum is then even and even integers below 512 fit.

    >>> exact_bound(1152, all_terms_binary=True), exact_bound(1152, all_terms_binary=False)
    (512.0, 256.0)
    """
    return 512.0 if all_terms_binary and fan_in % 2 == 0 else 256.0


@functools.cache
def cpu_has_bf16() -> bool:
    """True when the CPU advertises bf16 arithmetic (x86 AVX512_BF16 / AMX, ARM BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16", "bf16"))


def resolve_precision(precision: str, device: str) -> str:
    """The mode `precision` means on `device` (``auto`` decided; the others returned as is).

    >>> resolve_precision("bf16", "cpu")
    'bf16'
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16-exact" if torch.cuda.is_bf16_supported() else "float32"
    return "bf16-exact" if kind == "cpu" and cpu_has_bf16() else "float32"


class BinaryProduct:
    """A binary layer's linear map (conv2d or linear on ±1 operands), computed in bf16 when the
    result is exact, with a float32 or bf16 backward.

    `fallbacks` counts the forward calls computed in float32 (the bf16 result reached `bound`,
    or the layer had stopped trying, see `exact_forward`); `calls` counts them all.
    """

    def __init__(
        self,
        bound: float,
        stride: tuple[int, int] | None = None,
        padding: tuple[int, int] = (0, 0),
    ) -> None:
        self.bound = bound
        self.stride = stride  # None: a linear layer
        self.padding = padding
        self.calls = self.fallbacks = self.streak = 0

    def apply(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The plain float32 map (what the other modes must reproduce)."""
        if self.stride is None:
            return F.linear(x, weight)
        return F.conv2d(x, weight, None, self.stride, self.padding)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, grad_bf16: bool) -> torch.Tensor:
        """x @ weight with autograd: bf16 where exact, float32 otherwise."""
        return _ExactBf16.apply(x, weight, self, grad_bf16)

    def exact_forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The float32 result, from bf16 when every |value| is below `bound`.

        A layer whose sums keep reaching the bound would pay for both convolutions: after
        `GIVE_UP` fallbacks in a row it goes straight to float32 and retries bf16 only every
        `RETRY`-th call.
        """
        self.calls += 1
        if self.streak >= GIVE_UP and self.calls % RETRY:
            self.fallbacks += 1
            return self.apply(x, weight)
        y = self.apply(x.bfloat16(), weight.bfloat16())
        low, high = torch.aminmax(y)
        if max(-float(low), float(high)) < self.bound:
            self.streak = 0
            return y.float()
        self.fallbacks += 1
        self.streak += 1
        return self.apply(x, weight)

    def gradients(
        self, x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(d loss / d x, d loss / d weight) in the dtype of the arguments."""
        if self.stride is None:
            rows = grad.reshape(-1, grad.shape[-1])
            return grad @ weight, rows.t() @ x.reshape(-1, x.shape[-1])
        conv: dict[str, tuple[int, int]] = {"stride": self.stride, "padding": self.padding}
        return (
            torch.nn.grad.conv2d_input(x.shape, weight, grad, **conv),
            torch.nn.grad.conv2d_weight(x, weight.shape, grad, **conv),
        )


class _ExactBf16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, product: BinaryProduct, grad_bf16: bool):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.product, ctx.grad_bf16 = product, grad_bf16
        return product.exact_forward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        cast: Callable[[torch.Tensor], torch.Tensor] = (
            torch.Tensor.bfloat16 if ctx.grad_bf16 else torch.Tensor.float
        )
        grad_x, grad_w = ctx.product.gradients(cast(x), cast(weight), cast(grad))
        return grad_x.float(), grad_w.float(), None, None
