"""Compressed weight storage in a `.nb`: symmetric per-channel int8/int16, or fp16.

A weight stored this way carries ``quant = {"scheme", "axis", "scales"}`` in its blob entry; the
loader rebuilds float32 once with ``dequantize`` (the math never runs on the stored integers).
"""

from __future__ import annotations

import numpy as np

SCHEMES = {"int8": np.int8, "int16": np.int16, "fp16": np.float16}
_QMAX = {"int8": 127, "int16": 32767}


def quantize(w: np.ndarray, scheme: str, axis: int,
             scales: list[float] | None = None) -> tuple[np.ndarray, list[float]]:
    """(stored array, per-channel scales) for a float weight; ``scales`` given (a model quantized
    before it came here) keeps its integers exactly."""
    if scheme == "fp16":
        return np.asarray(w, np.float16), []
    qmax = _QMAX[scheme]
    if scales is None:
        moved = np.moveaxis(np.asarray(w, np.float64), axis, 0).reshape(w.shape[axis], -1)
        peak = np.abs(moved).max(axis=1) if moved.size else np.zeros(w.shape[axis])
        scales = np.where(peak > 0, peak / qmax, 1.0)
    scales = np.asarray(scales, np.float64)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scales.reshape(shape)), -qmax, qmax).astype(SCHEMES[scheme])
    return q, [float(s) for s in scales]


def dequantize(stored: np.ndarray, scheme: str, axis: int, scales: list[float]) -> np.ndarray:
    if scheme == "fp16":
        return stored.astype(np.float32)
    shape = [1] * stored.ndim
    shape[axis] = -1
    return (stored.astype(np.float32) * np.asarray(scales, np.float32).reshape(shape)).astype(np.float32)
