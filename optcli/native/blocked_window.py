"""Depthwise conv and pooling in the channel-blocked layout NCHWc (kernels/host/blocked_window.c).

A value of logical shape [N, C, H, W] is stored as a C-contiguous float32 [N, ceil(C/B), H, W, B]:
channel c at block c // B, lane c % B.  B is the library's vector width (4, 8 or 16; 16 only where
the CPU has AVX-512).  Lanes of channels >= C ("pad lanes") hold finite values that never reach a
real channel: the depthwise conv writes act(0) there, pooling carries the input's pad lanes through.
Callers check shapes first; the wrappers assert them.
"""

from __future__ import annotations

import math

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.caches import _geom, _ptr
from optcli.native.library import _check, require

POOL_OPS = {"max": 1, "avg": 2}


def pack_depthwise_weights(w: np.ndarray, block: int) -> np.ndarray:
    """w [C, 1, KH, KW] (multiplier 1) -> float32 C-contiguous [ceil(C/B), KH, KW, B], zero pad lanes."""
    require(w.ndim == 4 and w.shape[1] == 1 and block in (4, 8, 16), 'pack depthwise weights')
    c, _, kh, kw = w.shape
    cb = -(-c // block)
    packed = np.zeros((cb * block, kh, kw), np.float32)
    packed[:c] = w[:, 0]
    return np.ascontiguousarray(packed.reshape(cb, block, kh, kw).transpose(0, 2, 3, 1))


def _aligned_empty(shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``shape`` whose data starts on a 64-byte boundary (numpy's start 16
    bytes past one: every 16-float vector would straddle two cache lines, ~20% of a layer's time)."""
    n = math.prod(shape)
    buf = np.empty(n + 16, np.float32)
    k = (-_ptr(buf) >> 2) & 15
    return buf[k:k + n].reshape(shape)


def _padded_bias(bias: np.ndarray | None, lanes: int) -> np.ndarray | None:
    """bias [C] as float32 [lanes] (Cb * B), zero past C; None stays None."""
    if bias is None:
        return None
    require(bias.ndim == 1 and bias.shape[0] <= lanes, 'padded bias')
    b = np.zeros(lanes, np.float32)
    b[:bias.shape[0]] = bias
    return b


def _geometry(xshape: tuple[int, ...], kernel, strides, dilations, pad_begin, out) -> tuple[int, ...]:
    n, cb, h, w, b = xshape
    return (n, cb, h, w, *kernel, *strides, *dilations, *pad_begin, *out, b)


def _check_x(x: np.ndarray) -> None:
    require(x.dtype == np.float32 and x.flags.c_contiguous and x.ndim == 5 and x.shape[4] in (4, 8, 16), 'check x')


def depthwise_conv2d_blocked(x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None, kernel: tuple[int, int],
                             strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                             out: tuple[int, int], activation: str | None = None, alpha: float = 0.0,
                             beta: float = 0.0) -> np.ndarray:
    """Depthwise conv (multiplier 1) of blocked ``x`` [N, Cb, H, W, B] by ``packed`` (from
    ``pack_depthwise_weights``), with ``bias`` [C] or None (C <= Cb * B) and a fused activation; zero
    padding ``pad_begin`` at the start, at the end whatever ``out`` implies.  Returns a new
    [N, Cb, OH, OW, B]; its pad lanes hold act(0)."""
    return prepared_depthwise_conv2d_blocked(x.shape, packed, bias, kernel, strides, dilations, pad_begin, out,
                                             activation, alpha, beta)(x)


def prepared_depthwise_conv2d_blocked(xshape: tuple[int, ...], packed: np.ndarray, bias: np.ndarray | None,
                                      kernel: tuple[int, int], strides: tuple[int, int],
                                      dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                                      activation: str | None, alpha: float, beta: float):
    """``depthwise_conv2d_blocked`` for one plan step and input shape, worked out once: returns
    call(x) for a C-contiguous float32 ``x`` of ``xshape``."""
    require(library._lib is not None and len(xshape) == 5, 'prepared depthwise conv2d blocked')
    n, cb, _, _, blk = xshape
    require(packed.dtype == np.float32 and packed.flags.c_contiguous, 'prepared depthwise conv2d blocked')
    require(packed.shape == (cb, *kernel, blk), (packed.shape, xshape, kernel))
    b = _padded_bias(None if bias is None else np.asarray(bias, np.float32), cb * blk)
    geom_values = np.array(_geometry(tuple(xshape), kernel, strides, dilations, pad_begin, out), dtype=np.int64)
    fn, code = library.function("optcli_dwconv2d_blocked_f32"), ACTIVATION_CODES[activation]
    shape, empty, f32, xs = (n, cb, out[0], out[1], blk), _aligned_empty, np.float32, tuple(xshape)

    def call(x: np.ndarray) -> np.ndarray:
        require(x.shape == xs and x.dtype == f32 and x.flags.c_contiguous, 'prepared depthwise conv2d blocked')
        y = empty(shape)
        rc = fn(x, packed, b, y, geom_values, code, alpha, beta)
        if rc:
            _check(rc, "blocked depthwise conv")
        return y

    return call


def pool2d_blocked(x: np.ndarray, op: str, kernel: tuple[int, int], strides: tuple[int, int],
                   dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                   rrow: np.ndarray | None = None, rcol: np.ndarray | None = None) -> np.ndarray:
    """Max ("max") or average ("avg") pooling of blocked ``x`` [N, Cb, H, W, B], as ``native.pool2d``:
    padding -inf for max (np.maximum's NaN rule), 0 for average, whose window sums are multiplied by
    ``rrow[oh] * rcol[ow]``.  Returns a new [N, Cb, OH, OW, B]."""
    require(library._lib is not None, 'pool2d blocked')
    _check_x(x)
    n, cb, _, _, blk = x.shape
    y = _aligned_empty((n, cb, out[0], out[1], blk))
    geom = _geom(_geometry(x.shape, kernel, strides, dilations, pad_begin, out))
    r = None if rrow is None else np.ascontiguousarray(rrow, dtype=np.float32)
    k = None if rcol is None else np.ascontiguousarray(rcol, dtype=np.float32)
    require(op == "max" or (r is not None and k is not None and r.shape == (out[0],) and k.shape == (out[1],)),
            'pool2d blocked')
    _check(library.function("optcli_pool2d_blocked_f32")(x, y, geom, POOL_OPS[op], r, k), f"blocked {op} pooling")
    return y


def global_average_pool_blocked(x: np.ndarray) -> np.ndarray:
    """[N, Cb, H, W, B] -> a new [N, Cb, 1, 1, B]: the mean over H * W (float32 sums of 256 pixels,
    those in double)."""
    require(library._lib is not None, 'global average pool blocked')
    _check_x(x)
    n, cb, h, w, blk = x.shape
    y = np.empty((n, cb, 1, 1, blk), dtype=np.float32)
    _check(library.function("optcli_global_avg_blocked_f32")(x, y, n, cb, h * w, blk), "blocked global average pool")
    return y
