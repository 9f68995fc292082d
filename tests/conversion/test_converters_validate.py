"""The one fidelity predicate (`Agreement.passed`) and the one tolerance (`RTOL`)."""

from __future__ import annotations

import numpy as np
import pytest

from converters.errors import ConversionMismatchError
from converters.validate import RTOL, compare, validate_outputs

REFERENCE = np.array([[0.0, 10.0, 2.0], [5.0, 1.0, 0.0]])  # logit range 10: tolerance 1e-3


def test_tolerance_is_rtol_times_the_logit_range():
    assert compare(REFERENCE, REFERENCE).tolerance == pytest.approx(RTOL * 10)


@pytest.mark.parametrize(
    ("delta", "passed"),
    [(0.0, True), (0.9e-3, True), (1.1e-3, False), (np.nan, False), (np.inf, False)],
)
def test_passed_is_within_the_tolerance_everywhere(delta, passed):
    candidate = REFERENCE.copy()
    candidate[1, 2] += delta
    assert compare(REFERENCE, candidate).passed is passed


def test_a_changed_top_class_fails_even_within_the_tolerance():
    """Every |diff| is within the tolerance (1e-3), yet the candidate's top class is one the
    reference scores 1.5e-3 below its own: more than a tie, so it fails."""
    reference = np.array([[0.0, 10.0, 10.0 - 1.5e-3]])
    candidate = np.array([[0.0, 10.0 - 0.9e-3, 10.0 - 0.6e-3]])
    agreement = compare(reference, candidate)
    assert agreement.max_abs_diff <= agreement.tolerance
    assert agreement.argmax_agreement == 0.0 and not agreement.passed


def test_validate_outputs_names_the_worst_difference():
    candidate = REFERENCE.copy()
    candidate[0, 1] += 0.5
    with pytest.raises(ConversionMismatchError, match="0.5"):
        validate_outputs(REFERENCE, candidate)
    assert validate_outputs(REFERENCE, REFERENCE).passed
