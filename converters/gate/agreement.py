"""The plain comparison of a candidate's outputs with a reference's (before any tie replay).

Example:
    >>> import numpy as np
    >>> from bnnexport.converters.gate.agreement import compare_outputs
    >>> ref = np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> result = compare_outputs(ref, ref + 1e-5)
    >>> result.argmax_agreement, result.passed
    (1.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from bnnexport.converters.errors import ConversionMismatchError

# The one tolerance: max |diff| as a fraction of the reference's logit range (at least 1), for
# every comparison of a converted model with its reference.
RTOL = 1e-4


@dataclass
class Agreement:
    """How closely a candidate's outputs follow the reference's."""

    max_abs_diff: float
    argmax_agreement: float
    logit_range: float
    tolerance: float
    samples: int

    @property
    def passed(self) -> bool:
        """Every top class agrees and no output is further than the tolerance (NaN fails)."""
        return self.argmax_agreement >= 1.0 and self.max_abs_diff <= self.tolerance


def compare_outputs(reference: np.ndarray, candidate: np.ndarray, rtol: float = RTOL) -> Agreement:
    """Max |diff| and argmax agreement; tolerance = rtol x the reference's value range."""
    ref, out = (np.asarray(a, np.float64) for a in (reference, candidate))
    ref, out = (a.reshape(len(a), -1 if len(a) else 0) for a in (ref, out))  # 0 samples: 0 x 0
    if ref.shape != out.shape:
        raise ConversionMismatchError(f"output shapes differ: {ref.shape} vs {out.shape}")
    diff = np.abs(ref - out)
    worst = float(diff.max()) if diff.size else 0.0
    if not np.isfinite(out).all():
        worst = float("inf")
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    tolerance = rtol * max(span, 1.0)
    agreement = 1.0
    if ref.size:
        # the candidate's top class agrees when the reference scores it within the tolerance of
        # its own top class: a (near-)tie in the reference makes either choice right
        picked = ref[np.arange(len(ref)), out.argmax(axis=1)]
        agreement = float(np.mean(picked >= ref.max(axis=1) - tolerance))
    return Agreement(worst, agreement, span, tolerance, len(ref))
