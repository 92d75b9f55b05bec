"""Depthwise conv and pooling of NCHW float32 (kernels/host/window.c)."""

from __future__ import annotations

import math

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.caches import _geom
from optcli.native.library import _check, require


def depthwise_fits(kernel: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the native depthwise takes this window: any usual one; absurd windows and strides
    (a scratch row per stride phase, a register pass per tap) stay in numpy."""
    return math.prod(kernel) <= 1024 and max(strides, default=1) <= 16


def depthwise_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                     dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                     activation: str | None = None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """Depthwise conv of float32 NCHW ``x`` by ``w`` [M, 1, KH, KW] (M a multiple of C), with bias
    and a fused activation; zero padding at the start is ``pad_begin``, at the end whatever
    ``out`` implies.  Returns a new float32 array [N, M, *out]."""
    require(library._lib is not None, 'depthwise conv2d')
    return _window_conv(library.function("optcli_dwconv2d_f32"), "depthwise conv", x, w, bias, strides, dilations,
                        pad_begin, out, activation, alpha, beta)


def _window_conv(fn, what: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                 dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                 activation: str | None, alpha: float, beta: float) -> np.ndarray:
    """The call shared by the convs that take the 15 geometry values (depthwise, stem)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    require(b is None or b.shape == (w.shape[0],), 'window conv')
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    y = np.empty((n, m, out[0], out[1]), dtype=np.float32)
    geom = _geom((n, c, h, wd, m, kh, kw, *strides, *dilations, *pad_begin, *out))
    _check(fn(x, w, b, y, geom, ACTIVATION_CODES[activation], alpha, beta), what)
    return y


def prepared_depthwise_conv2d(xshape: tuple[int, int, int, int], w: np.ndarray, bias: np.ndarray | None,
                              strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                              out: tuple[int, int], activation: str | None, alpha: float, beta: float):
    """``depthwise_conv2d`` for one plan step and input shape, worked out once (see
    ``prepared_gemm_conv``): a function of a C-contiguous float32 ``x`` of ``xshape``."""
    fn = library.function("optcli_dwconv2d_f32") if library._lib is not None else None
    return _prepared_window_conv(fn, "depthwise conv", xshape, w, bias, strides, dilations, pad_begin, out,
                                 activation, alpha, beta)


def _prepared_window_conv(fn, what: str, xshape: tuple[int, int, int, int], w: np.ndarray, bias: np.ndarray | None,
                          strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                          out: tuple[int, int], activation: str | None, alpha: float, beta: float, *extra: int):
    """``_window_conv`` of one step and input shape worked out once: the geometry array made here,
    ``extra`` ints passed after the geometry (the stem's groups); per call one C call on a
    C-contiguous float32 ``x`` of ``xshape``."""
    require(fn is not None and w.ndim == 4 and w.dtype == np.float32 and w.flags.c_contiguous, f'prepared {what}')
    require(bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[0],) and bias.flags.c_contiguous),
            f'prepared {what}')
    n, c, h, wd = xshape
    m, _, kh, kw = w.shape
    geom_values = np.array((n, c, h, wd, m, kh, kw, *strides, *dilations, *pad_begin, *out), dtype=np.int64)
    code = ACTIVATION_CODES[activation]
    shape, empty, f32 = (n, m, out[0], out[1]), np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        y = empty(shape, f32)
        rc = fn(x, w, bias, y, geom_values, *extra, code, alpha, beta)
        if rc:
            _check(rc, what)
        return y

    return call


POOL_OPS = {"max": 1, "avg": 2}


def prepared_pool2d(xshape: tuple[int, ...], op: str, kernel: tuple[int, int], strides: tuple[int, int],
                    dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                    rrow: np.ndarray | None = None, rcol: np.ndarray | None = None):
    """``pool2d`` for one plan step and one input shape, worked out once: a function of ``x`` (that
    shape, C-contiguous float32).  The geometry array and the average's factors are made here; per
    call the input is checked and one C call made (~13 us of Python around a 16 us pool of a face
    detector's 28 x 22 x 22 map)."""
    require(library._lib is not None and len(xshape) == 4 and op in POOL_OPS, 'prepared pool2d')
    xshape = tuple(int(d) for d in xshape)
    n, c, h, wd = xshape
    geom_array = np.array((n, c, h, wd, c, *kernel, *strides, *dilations, *pad_begin, *out), dtype=np.int64)
    r = None if rrow is None else np.ascontiguousarray(rrow, dtype=np.float32)
    k = None if rcol is None else np.ascontiguousarray(rcol, dtype=np.float32)
    fn, code = library.function("optcli_pool2d_f32"), POOL_OPS[op]
    shape, empty, f32 = (n, c, out[0], out[1]), np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        # the C code reads x by the geometry above: its shape, dtype and layout are checked every call
        require(x.shape == xshape and x.dtype == f32 and x.flags.c_contiguous, 'prepared pool2d')
        y = empty(shape, f32)
        rc = fn(x, y, geom_array, code, r, k)
        if rc:
            _check(rc, f"{op} pooling")
        return y

    return call


def pool2d(x: np.ndarray, op: str, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
           pad_begin: tuple[int, int], out: tuple[int, int], rrow: np.ndarray | None = None,
           rcol: np.ndarray | None = None) -> np.ndarray:
    """Max or average pooling of float32 NCHW ``x``; padding is -inf (max) or 0 (average), at the end
    whatever ``out`` implies.  Average pooling multiplies each window's sum by ``rrow[oh] * rcol[ow]``
    (1 / count along each axis).  Returns a new float32 array [N, C, *out]."""
    require(library._lib is not None, 'pool2d')
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, c, h, wd = x.shape
    y = np.empty((n, c, out[0], out[1]), dtype=np.float32)
    geom = _geom((n, c, h, wd, c, *kernel, *strides, *dilations, *pad_begin, *out))
    r = None if rrow is None else np.ascontiguousarray(rrow, dtype=np.float32)
    k = None if rcol is None else np.ascontiguousarray(rcol, dtype=np.float32)
    _check(library.function("optcli_pool2d_f32")(x, y, geom, POOL_OPS[op], r, k), f"{op} pooling")
    return y


Q8_MAX_STRIDE = 8  # QPOOL_MAX_STRIDE in kernels/host/qpool.c: a column phase per stride


def prepared_maxpool2d_q8(xshape: tuple[int, ...], dtype: np.dtype, kernel: tuple[int, int],
                          strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                          out: tuple[int, int]):
    """MaxPool of an 8-bit NCHW tensor of ``xshape`` and ``dtype`` (u8 or s8: an integer plan's pool,
    kernels/host/qpool.c) worked out once: a function of ``x``.  Padding never wins, as the float pool's
    -inf."""
    dtype = np.dtype(dtype)
    require(library._lib is not None and len(xshape) == 4 and dtype in (np.dtype(np.uint8), np.dtype(np.int8)),
            'prepared 8-bit max pool')
    require(max(strides) <= Q8_MAX_STRIDE, 'prepared 8-bit max pool')
    xshape = tuple(int(d) for d in xshape)
    n, c, h, wd = xshape
    geom_array = np.array((n, c, h, wd, *kernel, *strides, *dilations, *pad_begin, *out), dtype=np.int64)
    fn, signed = library.function("optcli_maxpool2d_q8"), int(dtype == np.int8)
    shape, empty = (n, c, out[0], out[1]), np.empty

    def call(x: np.ndarray) -> np.ndarray:
        require(type(x) is np.ndarray and x.shape == xshape and x.dtype == dtype and x.flags.c_contiguous,
                '8-bit max pool')
        y = empty(shape, dtype)
        rc = fn(x, y, geom_array, signed)
        if rc:
            _check(rc, "8-bit max pooling")
        return y

    return call
