"""optcli.tolerance: infinities of both signs compared exactly, small values held to their own size."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.tolerance import ABSOLUTE, RELATIVE, describe_mismatch, max_error, within

INF = np.inf


@pytest.mark.parametrize("actual, expected, ok", [
    ([5.0], [-INF], False),  # an expected -inf is a value, not a hole
    ([5.0], [INF], False),
    ([-INF], [INF], False),
    ([INF], [-INF], False),
    ([-INF, 1.0], [-INF, 1.0], True),
    ([INF, -INF], [INF, -INF], True),
    ([np.nan], [np.nan], True),
    ([1.0], [np.nan], False),
    ([np.nan], [1.0], False),
    ([INF], [1.0], False),
])
def test_non_finite_values_match_exactly(actual, expected, ok):
    assert within(np.array(actual), np.array(expected)) is ok
    err, _ = max_error(np.array(actual), np.array(expected))
    assert (err == 0.0) is ok


def test_small_values_are_checked_against_their_own_size():
    # Softmax: one class near 1, a tail near 1e-4.  A 10% error in the tail is far below the
    # tensor's scale (1e-5 of it) but must still fail at fp32.
    expected = np.array([0.9998, 1e-4, 1e-4], np.float32)
    tail_off = expected.copy()
    tail_off[1] *= 1.1
    assert not within(tail_off, expected)
    assert "at [1]" in describe_mismatch(tail_off, expected)
    rounding = expected * (1 + np.float32(3e-7))
    assert within(rounding, expected)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_the_budget_is_relative_per_element_or_absolute_of_the_scale(precision):
    expected = np.array([10.0, 0.5, 0.0])
    allowed = np.maximum(RELATIVE[precision] * np.abs(expected), ABSOLUTE[precision] * 10.0)
    assert within(expected + allowed * 0.99, expected, precision)
    for i in range(3):
        off = expected.copy()
        off[i] += allowed[i] * 1.01
        assert not within(off, expected, precision), i


def test_shapes_and_empty_tensors():
    assert not within(np.zeros(3), np.zeros((3, 1)))
    assert within(np.zeros((0, 4)), np.zeros((0, 4)))
    assert max_error(np.zeros(0), np.zeros(0)) == (0.0, 1.0)
