"""bnnexport.converters.translate.padding in NumPy: which of the four forms a binary conv's padding
takes, and that each form's arithmetic is torch's (binarize, pad with the ONNX value, convolve).

The emitters in converters.translate.tf_layers write each strategy as TensorFlow ops; here the same
arithmetic is written with NumPy (pad, VALID cross-correlation, correction map) and compared
with a plain torch-style reference on random inputs, over a grid of sizes, kernels, strides,
dilations and paddings. No TensorFlow, no LCE.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bnnexport.converters.translate.padding import PaddingPlan, correction_map, plan_binary_padding
from support.converter_nets import torch_sign

ROOT = Path(__file__).resolve().parents[3]
NONE = (0, 0, 0, 0)
ONES = (1, 1, 1, 1)


def pad(x: np.ndarray, pads, value: float) -> np.ndarray:
    """Pad an [H, W, C] array with ONNX-ordered (top, left, bottom, right) pads."""
    top, left, bottom, right = pads
    return np.pad(x, [(top, bottom), (left, right), (0, 0)], constant_values=value)


def conv_valid(x: np.ndarray, k: np.ndarray, strides, dilations) -> np.ndarray:
    """VALID cross-correlation of [H, W, C] with an HWIO kernel, one output position at a time."""
    kh, kw = k.shape[:2]
    (sh, sw), (dh, dw) = strides, dilations
    out_h = (x.shape[0] - (kh - 1) * dh - 1) // sh + 1
    out_w = (x.shape[1] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((out_h, out_w, k.shape[3]))
    for r in range(out_h):
        for c in range(out_w):
            window = x[
                r * sh : r * sh + (kh - 1) * dh + 1 : dh, c * sw : c * sw + (kw - 1) * dw + 1 : dw
            ]
            out[r, c] = np.tensordot(window, k, axes=3)
    return out


def tf_same_pads(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME rule for one axis: the smaller half before."""
    total = max((-(-size // stride) - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def torch_reference(x, k, strides, dilations, inner, inner_value, outer):
    """What the ONNX graph computes: binarize, the Pad node, the conv's own zero padding."""
    padded = pad(pad(torch_sign(x), inner, inner_value), outer, 0.0)
    return conv_valid(padded, k, strides, dilations)


def emitted(plan: PaddingPlan, x, k, strides, dilations):
    """The arithmetic of the TF ops converters.translate.tf_layers writes for `plan`, LCE's SAME
    taken as TF's SAME zero padding."""
    if plan.strategy == "valid":
        return conv_valid(torch_sign(x), k, strides, dilations)
    if plan.strategy == "one_padded":
        return conv_valid(pad(torch_sign(x), plan.inner, plan.fill), k, strides, dilations)
    if plan.strategy == "same":
        (t, b), (left, r) = (
            tf_same_pads(x.shape[a], k.shape[a], strides[a], dilations[a]) for a in (0, 1)
        )
        return conv_valid(pad(torch_sign(x), (t, left, b, r), 0.0), k, strides, dilations)
    assert plan.strategy == "corrected"
    padded = pad(pad(x, plan.inner, plan.fill), plan.outer, 1.0)
    correction = correction_map(plan.zero_mask(x.shape[:2]), k, strides, dilations)
    return conv_valid(torch_sign(padded), k, strides, dilations) - correction


def random_case(rng, hw, ksize, cin=3, cout=4):
    # exact zeros in the float input: they binarize to +1, as torch's do
    x = rng.choice([-1.5, -0.25, 0.0, 0.5, 2.0], size=(*hw, cin))
    k = rng.choice([-1.0, 1.0], size=(*ksize, cin, cout))
    return x, k


# (input_hw, ksize, strides, dilations, inner, inner_value, outer) -> strategy
CASES = {
    "no padding": (((8, 8), (3, 3), (1, 1), (1, 1), NONE, 0.0, NONE), "valid"),
    "no padding, strided and dilated": (((9, 7), (3, 3), (2, 2), (2, 1), NONE, 1.0, NONE), "valid"),
    "+1 padding equal to SAME": (((8, 8), (3, 3), (1, 1), (1, 1), ONES, 1.0, NONE), "one_padded"),
    "+1 asymmetric, SAME for an even kernel": (
        ((8, 8), (2, 2), (1, 1), (1, 1), (0, 0, 1, 1), 1.0, NONE),
        "one_padded",
    ),
    "+1, stride 2 on an odd size (SAME)": (
        ((9, 9), (3, 3), (2, 2), (1, 1), ONES, 1.0, NONE),
        "one_padded",
    ),
    "+1 dilated, SAME": (((8, 8), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 1.0, NONE), "one_padded"),
    "conv's zero padding, SAME": (((8, 8), (3, 3), (1, 1), (1, 1), NONE, 0.0, ONES), "same"),
    "zero Pad node, SAME": (((8, 8), (3, 3), (1, 1), (1, 1), ONES, 0.0, NONE), "same"),
    "zero Pad node plus the conv's, together SAME": (
        ((8, 8), (3, 3), (1, 1), (1, 1), (0, 1, 0, 1), 0.0, (1, 0, 1, 0)),
        "same",
    ),
    "zero, stride 2 on an odd size (SAME)": (
        ((11, 9), (3, 3), (2, 2), (1, 1), NONE, 0.0, ONES),
        "same",
    ),
    "zero, input exactly the dilated kernel": (
        ((5, 5), (3, 3), (1, 1), (2, 2), NONE, 0.0, (2, 2, 2, 2)),
        "same",
    ),
    # LCE 0.16's SAME border correction is wrong when the kernel is larger than the input
    "LCE size bug: 1x1 input, 3x3 kernel": (
        ((1, 1), (3, 3), (1, 1), (1, 1), NONE, 0.0, ONES),
        "corrected",
    ),
    "LCE size bug: 2x2 input, 3x3 kernel": (
        ((2, 2), (3, 3), (1, 1), (1, 1), NONE, 0.0, ONES),
        "corrected",
    ),
    "LCE size bug: 2x2 input, 3x3/2": (
        ((2, 2), (3, 3), (2, 2), (1, 1), NONE, 0.0, ONES),
        "corrected",
    ),
    "LCE size bug: one axis, dilated": (
        ((5, 4), (3, 3), (1, 1), (2, 2), NONE, 0.0, (2, 2, 2, 2)),
        "corrected",
    ),
    "zero, stride 2 on an even size (SAME is (0, 1))": (
        ((8, 8), (3, 3), (2, 2), (1, 1), NONE, 0.0, ONES),
        "corrected",
    ),
    "zero, asymmetric, not SAME": (
        ((8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 0, 0), 0.0, (1, 0, 1, 0)),
        "corrected",
    ),
    "+1, stride 2 on an even size": (
        ((8, 8), (3, 3), (2, 2), (1, 1), ONES, 1.0, NONE),
        "corrected",
    ),
    "+1 asymmetric, not SAME": (
        ((8, 8), (2, 2), (1, 1), (1, 1), (1, 1, 0, 0), 1.0, NONE),
        "corrected",
    ),
    "+1 Pad node plus the conv's zeros": (
        ((8, 8), (3, 3), (1, 1), (1, 1), ONES, 1.0, ONES),
        "corrected",
    ),
    "-1 padding shaped like SAME": (
        ((8, 8), (3, 3), (1, 1), (1, 1), ONES, -1.0, NONE),
        "corrected",
    ),
    "-1 padding, stride 2": (((8, 8), (3, 3), (2, 2), (1, 1), ONES, -1.0, NONE), "corrected"),
    "-1 Pad node plus the conv's zeros": (
        ((6, 7), (3, 3), (1, 1), (1, 1), ONES, -1.0, ONES),
        "corrected",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_planner_picks_the_strategy(case):
    args, strategy = CASES[case]
    assert plan_binary_padding(*args).strategy == strategy


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_each_strategys_arithmetic_is_torchs(case, seed):
    (hw, ksize, strides, dilations, inner, value, outer), _ = CASES[case]
    x, k = random_case(np.random.default_rng(seed), hw, ksize)
    plan = plan_binary_padding(hw, ksize, strides, dilations, inner, value, outer)
    expected = torch_reference(x, k, strides, dilations, inner, value, outer)
    np.testing.assert_array_equal(emitted(plan, x, k, strides, dilations), expected)


def test_the_corrected_strategys_fill_and_mask():
    """-1 padding survives the sign, so only the conv's own zeros are corrected; +1 padding needs
    no correction; a zero Pad node is corrected with the conv's zeros."""
    hw, k3 = (4, 5), ((3, 3), (1, 1), (1, 1))
    minus = plan_binary_padding(hw, *k3, ONES, -1.0, (0, 0, 0, 1))
    assert (minus.fill, minus.inner_zero) == (-1.0, False)
    expected = np.zeros((6, 8))
    expected[:, 7] = 1.0  # the conv's zero column on the right, outside the -1 border
    np.testing.assert_array_equal(minus.zero_mask(hw), expected)
    one = plan_binary_padding(hw, (3, 3), (2, 2), (1, 1), ONES, 1.0, NONE)
    assert (one.strategy, one.fill) == ("corrected", 1.0)
    assert not one.zero_mask(hw).any()
    zero = plan_binary_padding(hw, (3, 3), (2, 2), (1, 1), (1, 0, 0, 0), 0.0, (0, 0, 1, 0))
    assert (zero.strategy, zero.fill, zero.inner_zero) == ("corrected", 1.0, True)
    expected = np.zeros((6, 5))
    expected[0], expected[5] = 1.0, 1.0  # the Pad node's top row and the conv's bottom row
    np.testing.assert_array_equal(zero.zero_mask(hw), expected)


def read_pads(size, k, stride, dilation, before, after):
    """ONNX pads without the trailing rows no window reaches (they change nothing)."""
    out = (size + before + after - (k - 1) * dilation - 1) // stride + 1
    reached = (out - 1) * stride + (k - 1) * dilation + 1 - size - before
    return before, max(min(after, reached), 0)


GRID = [
    (hw, (k, k2), (s, s2), (d, 1), inner, value, outer)
    for hw in [(1, 1), (2, 3), (4, 4), (5, 6), (7, 7)]
    for k, k2, s, s2, d in itertools.product((1, 2, 3), (1, 3), (1, 2), (1, 2), (1, 2))
    for inner, value, outer in [
        (NONE, 0.0, NONE),
        (NONE, 0.0, ONES),
        (ONES, 1.0, NONE),
        (ONES, 0.0, NONE),
        (ONES, -1.0, NONE),
        ((0, 1, 0, 1), 1.0, NONE),
        ((0, 0, 1, 1), 0.0, (1, 1, 0, 0)),
        ((1, 0, 1, 0), -1.0, (0, 1, 0, 1)),
        ((2, 2, 2, 2), 1.0, NONE),
        (NONE, 1.0, (0, 0, 2, 1)),
    ]
    if (hw[0] + inner[0] + inner[2] + outer[0] + outer[2]) >= (k - 1) * d + 1
    and (hw[1] + inner[1] + inner[3] + outer[1] + outer[3]) >= k2
]


@pytest.mark.slow
def test_every_plan_on_a_grid_is_torchs_arithmetic():
    """All four strategies over sizes 1-7, kernels 1-3, strides 1-2, dilations 1-2 and ten
    paddings: the emitted arithmetic equals torch's, the SAME forms' pads are TF's SAME rule
    (smaller half on top/left), and LCE's SAME form never sees an input smaller than the
    dilated kernel."""
    rng = np.random.default_rng(0)
    seen = set()
    for hw, ksize, strides, dilations, inner, value, outer in GRID:
        plan = plan_binary_padding(hw, ksize, strides, dilations, inner, value, outer)
        seen.add(plan.strategy)
        x, k = random_case(rng, hw, ksize, cin=2, cout=3)
        expected = torch_reference(x, k, strides, dilations, inner, value, outer)
        got = emitted(plan, x, k, strides, dilations)
        assert got.shape == expected.shape and np.array_equal(got, expected), (hw, ksize, plan)
        if plan.strategy in ("one_padded", "same"):
            total = [a + b for a, b in zip(inner, outer, strict=True)]
            for a in (0, 1):
                claimed = tf_same_pads(hw[a], ksize[a], strides[a], dilations[a])
                onnx = read_pads(hw[a], ksize[a], strides[a], dilations[a], total[a], total[a + 2])
                assert claimed == onnx, (hw, ksize, strides, dilations, inner, outer)
        if plan.strategy == "same":
            assert all(hw[a] >= (ksize[a] - 1) * dilations[a] + 1 for a in (0, 1))
    assert seen == {"valid", "one_padded", "same", "corrected"}


def test_a_pad_after_a_max_pool_is_planned_on_the_pooled_size():
    """The planner sees only the size the conv reads: tf_layers replays a max-pool before the Pad
    (its chain walk), so +1 padding of 1 on a 10x10 input pooled to 5x5 is SAME for a 3x3/2
    conv, where on the 10x10 input it would not be."""
    k3s2 = ((3, 3), (2, 2), (1, 1))
    assert plan_binary_padding((5, 5), *k3s2, ONES, 1.0, NONE).strategy == "one_padded"
    assert plan_binary_padding((10, 10), *k3s2, ONES, 1.0, NONE).strategy == "corrected"


def test_the_planner_needs_no_tensorflow():
    code = (
        "import sys, converters.translate.padding as p;"
        "p.plan_binary_padding((8, 8), (3, 3), (2, 2), (1, 1), (0,) * 4, 0.0, (1,) * 4)"
        ".zero_mask((8, 8));"
        "assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
