"""Quantized element-wise ops (kernels/host/qelementwise.c): per-tensor QuantizeLinear from float32 (the input of
an integer plan) and DequantizeLinear to float32 (its output), optcli.QAdd's fast path, and its prepared call
(``prepared_qadd``: the parameters made C arrays once per step; a residual Add of a small plane takes
10-40 us, of which the per-call conversions took half); the prepared calls of optcli.QLookup (a byte table),
optcli.QMul (a per-channel gate) and optcli.QGlobalAveragePool, made once per step for the same reason."""

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
    _check(library.function("optcli_qadd")(a, b, y, a.size, params, flags), "quantized add")
    return y


def prepared_qadd(shape: tuple[int, ...], a_dtype: np.dtype, b_dtype: np.dtype, params: np.ndarray,
                  y_dtype: np.dtype):
    """``qadd`` for one plan step: a function of C-contiguous ``a`` and ``b`` of ``shape`` and these dtypes."""
    require(library._lib is not None and params.dtype == np.float32 and params.shape == (5,), "prepared qadd")
    a_dtype, b_dtype, y_dtype = np.dtype(a_dtype), np.dtype(b_dtype), np.dtype(y_dtype)
    require(a_dtype in _BYTES and b_dtype in _BYTES and y_dtype in _BYTES, "prepared qadd")
    lo, hi = (-128, 127) if y_dtype == np.int8 else (0, 255)
    require(lo <= params[3] <= params[4] <= hi, "prepared qadd")
    params = np.array(params, dtype=np.float32)
    flags = np.array([a_dtype == np.int8, b_dtype == np.int8], dtype=np.int32)
    shape, n, fn, empty = tuple(shape), int(np.prod(shape)), library.function("optcli_qadd"), np.empty

    def call(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        require(a.shape == shape and b.shape == shape and a.dtype == a_dtype and b.dtype == b_dtype
                and a.flags.c_contiguous and b.flags.c_contiguous, "qadd")
        y = empty(shape, y_dtype)
        rc = fn(a, b, y, n, params, flags)
        if rc:
            _check(rc, "quantized add")
        return y

    return call


def quantize(x: np.ndarray, scale: np.float32, zero_point: int, dtype: np.dtype) -> np.ndarray:
    """Per-tensor QuantizeLinear of float32 ``x`` to uint8 / int8: rint(x / scale) + zero_point, saturated, NaN
    to 0 (optcli.ops.quant.quantize's result, one pass instead of five)."""
    dtype = np.dtype(dtype)
    require(library._lib is not None and x.dtype == np.float32 and dtype in _BYTES, "quantize")
    lo, hi = (-128, 127) if dtype == np.int8 else (0, 255)
    require(lo <= zero_point <= hi, "quantize")
    y = np.empty(x.shape, dtype)
    x = np.require(x, requirements="C")
    _check(library.function("optcli_quantize_f32")(x, y, x.size, float(np.float32(scale)), float(zero_point),
                                                   float(lo), float(hi)), "quantize")
    return y


def dequantize(x: np.ndarray, scale: np.float32, zero_point: int) -> np.ndarray:
    """Per-tensor DequantizeLinear of uint8 / int8 ``x`` to float32: (x - zero_point) * scale, the bits of
    optcli.ops.quant's numpy kernel (float64 product cast to float32) in one pass instead of four."""
    require(library._lib is not None and x.dtype in _BYTES, "dequantize")
    signed = x.dtype == np.int8
    require((-128 if signed else 0) <= zero_point <= (127 if signed else 255), "dequantize")
    y = np.empty(x.shape, np.float32)
    x = np.require(x, requirements="C")
    _check(library.function("optcli_dequantize_f32")(x, y, x.size, float(np.float32(scale)), int(zero_point),
                                                     int(signed)), "dequantize")
    return y


def lookup_variant(which: int) -> int:
    """Tests: the lookup's and the quantization's path (1 the portable loops, 0 by the CPU, -1 asks); returns the
    lookup's path in use (2: VBMI)."""
    require(library._lib is not None, "lookup variant")
    return int(library.function("optcli_lookup_variant")(which))


def prepared_lookup(shape: tuple[int, ...], x_dtype: np.dtype, table: np.ndarray):
    """``lookup`` for one plan step: a function of a C-contiguous ``x`` of ``shape`` and ``x_dtype`` (a squeeze-
    excite gate's lookup is 2 us of work and was 4 us of per-call checks and conversions)."""
    x_dtype = np.dtype(x_dtype)
    require(library._lib is not None and x_dtype in _BYTES and table.dtype in _BYTES and table.shape == (256,),
            "prepared lookup")
    table = np.array(table, order="C")  # its own copy: the step's table cannot change under the call
    shape, n, fn, empty, y_dtype = tuple(shape), int(np.prod(shape)), library.function("optcli_lookup_u8"), \
        np.empty, table.dtype

    def call(x: np.ndarray) -> np.ndarray:
        require(x.shape == shape and x.dtype == x_dtype and x.flags.c_contiguous, "lookup")
        y = empty(shape, y_dtype)
        rc = fn(x, y, n, table)
        if rc:
            _check(rc, "table lookup")
        return y

    return call


def _requantization(params: np.ndarray, zps: np.ndarray, n_zps: int, y_dtype: np.dtype, what: str):
    """The step's own C copies of float32 [multiplier, qmin, qmax] and int32 zero points and signs, checked:
    the clamp within ``y_dtype`` (its bytes are the two's complement of the result)."""
    require(y_dtype in _BYTES and params.dtype == np.float32 and params.shape == (3,) and zps.dtype == np.int32
            and zps.shape == (n_zps,), what)
    lo, hi = (-128, 127) if y_dtype == np.int8 else (0, 255)
    require(lo <= params[1] <= params[2] <= hi, what)
    return np.array(params, order="C"), np.array(zps, order="C")


def prepared_qmul(shape: tuple[int, ...], x_dtype: np.dtype, g_dtype: np.dtype, params: np.ndarray,
                  zps: np.ndarray, y_dtype: np.dtype):
    """``qmul_rows`` for one plan step: a function of C-contiguous ``x`` [N, C, ...] of ``shape`` and its gate
    ``g`` [N, C, 1...]."""
    x_dtype, g_dtype, y_dtype = np.dtype(x_dtype), np.dtype(g_dtype), np.dtype(y_dtype)
    require(library._lib is not None and x_dtype in _BYTES and g_dtype in _BYTES and len(shape) >= 2, "prepared qmul")
    params, zps = _requantization(params, zps, 5, y_dtype, "prepared qmul")
    shape = tuple(shape)
    gate = (*shape[:2], *([1] * (len(shape) - 2)))
    rows = shape[0] * shape[1]
    inner = int(np.prod(shape[2:])) if rows else 0
    fn, empty = library.function("optcli_qmul_rows"), np.empty

    def call(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        require(x.shape == shape and g.shape == gate and x.dtype == x_dtype and g.dtype == g_dtype
                and x.flags.c_contiguous and g.flags.c_contiguous, "qmul")
        y = empty(shape, y_dtype)
        rc = fn(x, g, y, rows, inner, params, zps)
        if rc:
            _check(rc, "quantized multiply")
        return y

    return call


def prepared_qgap(shape: tuple[int, ...], x_dtype: np.dtype, params: np.ndarray, zps: np.ndarray,
                  y_dtype: np.dtype):
    """``qgap_rows`` for one plan step: a function of a C-contiguous ``x`` [N, C, ...] of ``shape``, giving
    [N, C, 1...]."""
    x_dtype, y_dtype = np.dtype(x_dtype), np.dtype(y_dtype)
    require(library._lib is not None and x_dtype in _BYTES and len(shape) >= 2, "prepared qgap")
    params, zps = _requantization(params, zps, 3, y_dtype, "prepared qgap")
    shape = tuple(shape)
    rows, inner = shape[0] * shape[1], int(np.prod(shape[2:]))
    require(inner <= 1 << 23, "prepared qgap")  # (the int32 sum and its float32 stay exact)
    out = (*shape[:2], *([1] * (len(shape) - 2)))
    fn, empty = library.function("optcli_qgap_rows"), np.empty

    def call(x: np.ndarray) -> np.ndarray:
        require(x.shape == shape and x.dtype == x_dtype and x.flags.c_contiguous, "qgap")
        y = empty(out, y_dtype)
        rc = fn(x, y, rows, inner, params, zps)
        if rc:
            _check(rc, "quantized global average pool")
        return y

    return call
