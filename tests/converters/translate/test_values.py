"""bnnexport.converters.translate.values in NumPy: the exact-zero tie-break keeps torch's signs for
every integer accumulator and never leaves a value at exactly zero (where LCE's sign-bit rule
decides)."""

from __future__ import annotations

import numpy as np
import pytest
from bnnexport.converters.translate.values import tie_break_bias
from support.converter_nets import torch_sign


@pytest.mark.parametrize("seed", range(5))
def test_tie_break_bias_keeps_every_integer_accumulators_sign_and_removes_zeros(seed):
    rng = np.random.default_rng(seed)
    channels = 64
    m = (rng.standard_normal(channels) * 2.0 ** rng.integers(-6, 3, channels)).astype(np.float32)
    m[:4] = [-1.0, 1.0, -0.25, 0.5]  # exact ties below: b = -a*m for an integer a
    b = (rng.standard_normal(channels) * 3).astype(np.float32)
    b[:4] = [3.0, -7.0, 0.0, -2.0]
    m[-1], b[-1] = 0.0, -0.0  # a dead channel: 0*a + b is -0.0 in float, +1 in torch
    nudged = tie_break_bias(m, b)
    acc = np.arange(-300, 301, dtype=np.float32)[:, None]  # every integer a bconv can sum to
    before = acc * m + b
    after = acc * m + nudged
    assert np.array_equal(torch_sign(after), torch_sign(before))
    assert np.all(after != 0)  # no exact zero is left for a runtime to decide its own way
    assert np.any(before == 0)  # the exact ties were really there
