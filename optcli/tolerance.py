"""Numerical tolerances, written once for every test, `--verify` and benchmark.

``within(actual, expected, precision)`` checks every element::

    |actual - expected| <= max(RELATIVE[p] * |expected|, ABSOLUTE[p] * scale)

where ``scale`` is the largest finite ``|expected|`` (at least 1e-6): within RELATIVE of its own
value, or within ABSOLUTE of the tensor's scale, for values that cancel to near zero.  At fp32
(1e-4, 1e-6: a few float epsilons of the scale) small values (softmax tails, near-zero logits)
are checked too, where a bound of 1e-4 of the tensor's max left them unchecked.  fp16 and int8
keep their budget at the scale (ABSOLUTE = RELATIVE, so the per-element term never binds): half
storage through Winograd transforms and deep nets, and one int8 step, cost up to 6e-3 of the
scale on small values (tests/metal, tests/test_models_gpu.py), which a tighter floor would fail.
Infinities must match exactly, sign included, and NaNs must sit where the reference has NaNs.

``max_error`` gives the tensor-wide figure (max abs error, scale) that end-to-end model tests and
``--precision=auto`` hold against ``RELATIVE``; mismatched infinities or NaNs make it infinite.

``VERIFY_NOISE`` is ``opt --verify``'s pass rule per plan precision: the largest RMS error per RMS
of the output (``r``: SNR >= -20 log10(r) dB), and ``VERIFY_TOP1`` the top-1 agreement that
classifier outputs need on real samples (docs/quantization.md).
"""

from __future__ import annotations

import numpy as np

RELATIVE = {"fp32": 1e-4, "fp16": 1e-2, "int8": 5e-2}
ABSOLUTE = {"fp32": 1e-6, "fp16": 1e-2, "int8": 5e-2}  # of the tensor's scale

VERIFY_NOISE = {"fp32": 1e-4, "int16": 1e-3, "fp16": 1e-2, "int8": 1e-1}  # 80, 60, 40, 20 dB
VERIFY_ROUNDING = {"fp32": 1e-5, "int16": 1e-4, "fp16": 2e-3, "int8": 2e-2}
"""--verify's rounding floor: an output whose largest absolute difference is at most this (times
its scale, the largest |value|, when that is above 1) differs by rounding only and passes whatever
its SNR says.  Why: on a near-zero map (a detector's background on random inputs) a 7e-8 difference
gave 16 dB and failed a good fp32 plan; 2.9e-6 on an opencl fp32 plan gave 79.4 dB < 80 dB."""
VERIFY_TOP1 = {"int8": 0.95}


def _as_float(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def nonfinite_match(actual, expected) -> bool:
    """NaNs, +inf and -inf at the same positions in both."""
    a, e = _as_float(actual), _as_float(expected)
    return (np.array_equal(np.isnan(a), np.isnan(e)) and np.array_equal(np.isposinf(a), np.isposinf(e))
            and np.array_equal(np.isneginf(a), np.isneginf(e)))


def max_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs error, scale) between two arrays of the same shape: the error over positions where
    both are finite, infinite when their NaNs or infinities differ; the scale is the largest
    finite |expected| (at least 1e-6)."""
    a, e = _as_float(actual), _as_float(expected)
    if a.size == 0:
        return 0.0, 1.0
    finite_e = np.isfinite(e)
    scale = max(float(np.max(np.abs(e[finite_e]))) if finite_e.any() else 1.0, 1e-6)
    if not nonfinite_match(a, e):
        return float("inf"), scale
    both = finite_e & np.isfinite(a)
    err = float(np.max(np.abs(a[both] - e[both]))) if both.any() else 0.0
    return err, scale


def _excess(a: np.ndarray, e: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Per finite element: |a - e| and what it may be, and the scale."""
    _, scale = max_error(a, e)
    both = np.isfinite(a) & np.isfinite(e)
    diff = np.where(both, np.abs(np.where(both, a, 0.0) - np.where(both, e, 0.0)), 0.0)
    allowed = np.maximum(RELATIVE[precision] * np.abs(np.where(both, e, 0.0)), ABSOLUTE[precision] * scale)
    return diff, allowed, scale


def within(actual: np.ndarray, expected: np.ndarray, precision: str = "fp32") -> bool:
    a, e = _as_float(actual), _as_float(expected)
    if a.shape != e.shape:
        return False
    if a.size == 0:
        return True
    if not nonfinite_match(a, e):
        return False
    diff, allowed, _ = _excess(a, e, precision)
    return bool(np.all(diff <= allowed))


def describe_mismatch(actual: np.ndarray, expected: np.ndarray, precision: str = "fp32") -> str:
    """Why ``within`` fails, in one line: the worst element, or the non-finite values that differ."""
    a, e = _as_float(actual), _as_float(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if a.size == 0:
        return "both empty: no mismatch"
    if not nonfinite_match(a, e):
        bad = np.argwhere(~((a == e) | (np.isnan(a) & np.isnan(e))) & ~(np.isfinite(a) & np.isfinite(e)))[0]
        i = tuple(int(k) for k in bad)
        return f"non-finite values differ: at {list(i)} got {a[i]}, expected {e[i]}"
    diff, allowed, scale = _excess(a, e, precision)
    i = tuple(int(k) for k in np.unravel_index(np.argmax(diff - allowed), a.shape))
    return (f"at {list(i)} got {a[i]:.7g}, expected {e[i]:.7g}: error {diff[i]:.3g} > {allowed[i]:.3g} allowed "
            f"({precision}: {RELATIVE[precision]:g} of the value or {ABSOLUTE[precision]:g} of the scale {scale:.3g}); "
            f"max abs error {diff.max():.3g}")
