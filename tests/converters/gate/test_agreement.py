"""The gate's plain comparison (`converters.gate.agreement`: `Agreement.passed`) and its one
tolerance (`RTOL`)."""

from __future__ import annotations

import numpy as np
import pytest
from bnnexport.converters.errors import ConversionMismatchError
from bnnexport.converters.gate import RTOL, GateOptions, compare_outputs, validate

REFERENCE = np.array([[0.0, 10.0, 2.0], [5.0, 1.0, 0.0]])  # logit range 10: tolerance 1e-3


def test_tolerance_is_rtol_times_the_logit_range():
    assert compare_outputs(REFERENCE, REFERENCE).tolerance == pytest.approx(RTOL * 10)


@pytest.mark.parametrize(
    ("delta", "passed"),
    [(0.0, True), (0.9e-3, True), (1.1e-3, False), (np.nan, False), (np.inf, False)],
)
def test_passed_is_within_the_tolerance_everywhere(delta, passed):
    candidate = REFERENCE.copy()
    candidate[1, 2] += delta
    assert compare_outputs(REFERENCE, candidate).passed is passed


def test_a_changed_top_class_fails_even_within_the_tolerance():
    """Every |diff| is within the tolerance (1e-3), yet the candidate's top class is one the
    reference scores 1.5e-3 below its own: more than a tie, so it fails."""
    reference = np.array([[0.0, 10.0, 10.0 - 1.5e-3]])
    candidate = np.array([[0.0, 10.0 - 0.9e-3, 10.0 - 0.6e-3]])
    agreement = compare_outputs(reference, candidate)
    assert agreement.max_abs_diff <= agreement.tolerance
    assert agreement.argmax_agreement == 0.0 and not agreement.passed


def test_a_refusal_without_replay_names_the_worst_difference():
    candidate = REFERENCE.copy()
    candidate[0, 1] += 0.5
    worst = r"worst at sample 0, output 1: 10 vs 10\.5"
    with pytest.raises(ConversionMismatchError, match=worst):
        validate(REFERENCE, candidate, np.zeros((2, 1)), GateOptions())
    assert validate(REFERENCE, REFERENCE, np.zeros((2, 1)), GateOptions()).argmax_agreement == 1


def test_a_nan_output_is_named_as_the_worst():
    candidate = REFERENCE.copy()
    candidate[1, 0] = np.nan
    with pytest.raises(ConversionMismatchError, match="worst at sample 1, output 0: 5 vs nan"):
        validate(REFERENCE, candidate, np.zeros((2, 1)), GateOptions())


def test_without_a_replay_unprobed_flips_judges_predictions_only():
    """`GateOptions.unprobed_flips`: for a reference no replay can probe, logits may move
    (a rounding tie) and at most that many predictions may change."""
    moved = REFERENCE + np.array([[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]])  # logits off, same top
    lenient = GateOptions(unprobed_flips=1)
    assert validate(REFERENCE, moved, np.zeros((2, 1)), lenient).plain_argmax_agreement == 1.0
    one = REFERENCE + np.array([[0.0, 0.0, 9.0], [0.0, 0.0, 0.0]])  # sample 0 now picks class 2
    assert validate(REFERENCE, one, np.zeros((2, 1)), lenient).plain_argmax_agreement == 0.5
    both = one + np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    with pytest.raises(ConversionMismatchError, match="2 predictions differ"):
        validate(REFERENCE, both, np.zeros((2, 1)), lenient)
    with pytest.raises(ConversionMismatchError, match="worst at sample 0"):
        validate(REFERENCE, moved, np.zeros((2, 1)), GateOptions())  # the default: strict
