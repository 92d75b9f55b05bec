"""Numerical tolerances, written once for every test, `--verify` and benchmark.

The error budget is relative to the reference output's scale: an output passes when
``max|actual - expected| <= RELATIVE[precision] * max(max|expected|, 1e-6)``.
"""

from __future__ import annotations

import numpy as np

RELATIVE = {"fp32": 1e-4, "fp16": 1e-2, "int8": 5e-2}


def max_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs error, allowed scale) between two arrays of the same shape."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.size == 0:
        return 0.0, 1.0
    finite = np.isfinite(e)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are inf: masked below
        diff = np.where(finite, a - e, 0.0)
    err = float(np.max(np.abs(diff))) if finite.any() else 0.0
    scale = float(np.max(np.abs(e[finite]))) if finite.any() else 1.0
    return err, max(scale, 1e-6)


def within(actual: np.ndarray, expected: np.ndarray, precision: str = "fp32") -> bool:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return False
    # Non-finite reference values (inf, nan) must be matched exactly in kind.
    if not np.array_equal(np.isnan(a), np.isnan(e)) or not np.array_equal(np.isinf(a) & (a > 0), np.isinf(e) & (e > 0)):
        return False
    err, scale = max_error(a, e)
    return err <= RELATIVE[precision] * scale
