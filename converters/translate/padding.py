"""How a binary convolution's padding is written for LCE: the decision, in plain Python.

Torch pads a binary conv's input after the sign, with 0 (the conv's own `pads`, "outer") or with
a Pad node's constant (0, +1 or -1, "inner"), which 1 bit cannot always hold. LCE 0.16 has exact
forms for only some of these (docs/LCE_NOTES.md "Binary ops"), so `plan_binary_padding` picks one of
four strategies, and `converters.translate.tf_layers` emits each as TensorFlow ops:

- ``"valid"``: no padding, binarize -> VALID conv;
- ``"one_padded"``: +1 padding equal to TF's SAME, binarize -> pad with +1 -> VALID conv;
- ``"same"``: zero padding equal to TF's SAME, binarize -> SAME conv (LCE's border correction);
- ``"corrected"``: anything else: the float tensor is padded with `fill` (±1) before binarizing,
  VALID conv, and the conv of `zero_mask` with the kernel is subtracted afterwards.

Example (torch's 3x3/2 conv with padding 1 on an 8x8 input: TF's SAME would pad (0, 1)):
    >>> plan = plan_binary_padding((8, 8), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 0.0, (1, 1, 1, 1))
    >>> plan.strategy, plan.fill, plan.zero_mask((8, 8)).shape
    ('corrected', 1.0, (10, 10))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Strategy = Literal["valid", "one_padded", "same", "corrected"]
# ONNX's order for 2-D pads: top, left, bottom, right
Pads = tuple[int, int, int, int]


def padding_mode(
    input_hw: Sequence[int],
    ksize: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> str | None:
    """ "VALID", "SAME", or None when an explicit pad is needed (pads in ONNX's order).

    >>> padding_mode((8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    'SAME'
    >>> padding_mode((8, 8), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)) is None  # SAME is (0, 1)
    True
    """
    if not any(pads):
        return "VALID"
    h, w = (int(d) for d in input_hw)
    if is_same(h, ksize[0], strides[0], dilations[0], pads[0], pads[2]) and is_same(
        w, ksize[1], strides[1], dilations[1], pads[1], pads[3]
    ):
        return "SAME"
    return None


@dataclass(frozen=True)
class PaddingPlan:
    """One binary conv's padding strategy and what its emitter needs."""

    strategy: Strategy
    inner: Pads = (0, 0, 0, 0)  # the Pad node's pads between the binarization and the conv
    outer: Pads = (0, 0, 0, 0)  # the conv's own (zero) pads
    # "corrected": the value the float tensor's inner border gets before binarizing (the outer
    # border always gets +1); "one_padded": the value the binarized tensor is padded with
    fill: float = 1.0
    inner_zero: bool = False  # torch's inner border holds zeros, so the correction covers it

    def zero_mask(self, input_hw: Sequence[int]) -> np.ndarray:
        """[H', W'] map of the padded input: 1 where the emitted +1 stands for torch's 0.

        The "corrected" strategy subtracts the VALID conv of this map with the kernel
        (`correction_map`); its +1 and -1 fills elsewhere match torch's.
        """
        inner, outer = self.inner, self.outer
        mask = np.zeros((int(input_hw[0]), int(input_hw[1])))
        mask = np.pad(
            mask,
            [(inner[0], inner[2]), (inner[1], inner[3])],
            constant_values=1.0 if self.inner_zero else 0.0,
        )
        return np.pad(mask, [(outer[0], outer[2]), (outer[1], outer[3])], constant_values=1.0)


# input (height, width), kernel, strides, dilations
_Shape = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]


def _as_pads(pads: Sequence[int]) -> Pads:
    return int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3])


def _one_padding_is_same(geometry: _Shape, inner: Pads, inner_value: float, outer: Pads) -> bool:
    """+1 padding alone, exactly TF's SAME: LCE fuses a +1 Pad into its bconv as SAME padding
    whatever the pads were (docs/LCE_NOTES.md "Binary ops"), so no other +1 padding may take this
    form."""
    if inner_value != 1.0 or not any(inner) or any(outer):
        return False
    return padding_mode(*geometry, inner) == "SAME"


def _zero_padding_is_same(geometry: _Shape, inner: Pads, inner_value: float, outer: Pads) -> bool:
    """Zero padding only (the inner pad, the conv's or both), exactly TF's SAME, on an input at
    least as large as the dilated kernel."""
    if any(inner) and inner_value != 0.0:
        return False
    total = [a + b for a, b in zip(inner, outer, strict=True)]
    if padding_mode(*geometry, total) != "SAME":
        return False
    # LCE 0.16's border correction for zero-padded SAME bconvs is wrong when the kernel
    # is larger than the input (measured: 1x1 and 2x2 inputs with a 3x3 kernel)
    input_hw, ksize, _, dilations = geometry
    return all(int(input_hw[k]) >= (ksize[k] - 1) * dilations[k] + 1 for k in (0, 1))


def plan_binary_padding(
    input_hw: Sequence[int],
    ksize: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    inner: Sequence[int],
    inner_value: float,
    outer: Sequence[int],
) -> PaddingPlan:
    """The strategy for a binary conv on an `input_hw` input: `inner` is padded with
    `inner_value` (0, +1 or -1) after the binarization, then `outer` with zeros by the conv.

    >>> k3 = ((3, 3), (1, 1), (1, 1))  # kernel, strides, dilations
    >>> plan_binary_padding((8, 8), *k3, (1, 1, 1, 1), 1.0, (0, 0, 0, 0)).strategy
    'one_padded'
    >>> plan_binary_padding((8, 8), *k3, (0, 0, 0, 0), 0.0, (1, 1, 1, 1)).strategy
    'same'
    >>> plan_binary_padding((2, 2), *k3, (0, 0, 0, 0), 0.0, (1, 1, 1, 1)).strategy  # LCE's bug
    'corrected'
    """
    geometry = (input_hw, ksize, strides, dilations)
    inner_pads, outer_pads = _as_pads(inner), _as_pads(outer)
    if not any(inner_pads) and not any(outer_pads):
        return PaddingPlan("valid")
    if _one_padding_is_same(geometry, inner_pads, inner_value, outer_pads):
        return PaddingPlan("one_padded", inner_pads, outer_pads, fill=1.0)
    if _zero_padding_is_same(geometry, inner_pads, inner_value, outer_pads):
        return PaddingPlan("same", inner_pads, outer_pads)
    # -1 padding survives the binarization as is; 0 becomes +1 and is corrected afterwards
    fill = -1.0 if inner_value == -1.0 else 1.0
    return PaddingPlan("corrected", inner_pads, outer_pads, fill, inner_zero=inner_value == 0.0)


def same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's SAME padding (before, after) for one spatial axis."""
    extent = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + extent - size, 0)
    return total // 2, total - total // 2


def effective_pads(
    size: int, kernel: int, stride: int, dilation: int, before: int, after: int
) -> tuple[int, int, int]:
    """(before, after, out) where `after` drops trailing padding torch never reads."""
    extent = (kernel - 1) * dilation + 1
    out = (size + before + after - extent) // stride + 1
    used_after = (out - 1) * stride + extent - size - before
    return before, max(min(after, used_after), 0), out


def is_same(size: int, kernel: int, stride: int, dilation: int, before: int, after: int) -> bool:
    """True when ONNX pads (before, after) give exactly TensorFlow's SAME padding."""
    b, a, out = effective_pads(size, kernel, stride, dilation, before, after)
    return (b, a) == same_pads(size, kernel, stride, dilation) and out == -(-size // stride)


def correction_map(mask: np.ndarray, kernel_hwio: np.ndarray, strides, dilations) -> np.ndarray:
    """VALID conv of a [H, W] 0/1 mask (broadcast over input channels) with a HWIO kernel.

    The difference between convolving a one-padded and a zero-padded binary input: the sum of
    the kernel taps that land on padding, per output position and channel.
    """
    kh, kw, _, cout = kernel_hwio.shape
    taps = kernel_hwio.sum(axis=2)  # [kh, kw, O]: the mask is the same for every input channel
    sh, sw = strides
    dh, dw = dilations
    out_h = (mask.shape[0] - ((kh - 1) * dh + 1)) // sh + 1
    out_w = (mask.shape[1] - ((kw - 1) * dw + 1)) // sw + 1
    out = np.zeros((out_h, out_w, cout), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            window = mask[i * dh : i * dh + sh * (out_h - 1) + 1 : sh]
            window = window[:, j * dw : j * dw + sw * (out_w - 1) + 1 : sw]
            out += window[:, :, None] * taps[i, j][None, None, :]
    return out
