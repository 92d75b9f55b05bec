"""Quantized element-wise ops (kernels/host/qelementwise.c): optcli.QAdd's fast path."""

from __future__ import annotations

import numpy as np

from optcli.native import library
from optcli.native.library import _check, require

_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))


def qadd(a: np.ndarray, b: np.ndarray, params: np.ndarray, y_dtype: np.dtype) -> np.ndarray:
    """``a`` + ``b`` (same shape, u8 or s8) requantized as onnxruntime's QLinearAdd into ``y_dtype``;
    ``params`` float32 [ratio a, ratio b, constant term, qmin, qmax] (optcli/ops/qadd.py)."""
    require(library._lib is not None and a.shape == b.shape and a.dtype in _BYTES and b.dtype in _BYTES, "qadd")
    require(params.dtype == np.float32 and params.shape == (5,) and np.dtype(y_dtype) in _BYTES, "qadd")
    lo, hi = (-128, 127) if np.dtype(y_dtype) == np.int8 else (0, 255)
    require(lo <= params[3] <= params[4] <= hi, "qadd")
    y = np.empty(a.shape, y_dtype)
    a, b = np.require(a, requirements="C"), np.require(b, requirements="C")  # (ascontiguousarray makes 0-d 1-d)
    params = np.require(params, requirements="C")
    flags = np.array([a.dtype == np.int8, b.dtype == np.int8], dtype=np.int32)
    _check(library._lib.optcli_qadd(a.ctypes.data, b.ctypes.data, y.ctypes.data, a.size, params.ctypes.data,
                                    flags.ctypes.data), "quantized add")
    return y
