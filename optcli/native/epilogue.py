"""The per-channel epilogue: ``act(x * scale[c] + shift[c])`` in one pass (kernels/host/epilogue.c)."""

from __future__ import annotations

import math

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.library import _check, require


def channel_affine(x: np.ndarray, scale: np.ndarray | None, shift: np.ndarray | None,
                   activation: str | None = None, alpha: float = 0.0, beta: float = 0.0,
                   out: np.ndarray | None = None) -> np.ndarray:
    """``act(x * scale[c] + shift[c])`` over a float32 [N, C, ...] in one pass (``out=x``: in place);
    ``scale`` / ``shift`` None mean 1 / 0."""
    require(library._lib is not None and x.ndim >= 2, 'channel affine')
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    require(out.dtype == np.float32 and out.flags.c_contiguous and out.shape == x.shape, 'channel affine')
    s = None if scale is None else np.ascontiguousarray(scale, dtype=np.float32)
    b = None if shift is None else np.ascontiguousarray(shift, dtype=np.float32)
    require((s is None or s.size == x.shape[1]) and (b is None or b.size == x.shape[1]), 'channel affine')
    _check(library.function("optcli_channel_affine_f32")(x, out, s, b, x.shape[0], x.shape[1], math.prod(x.shape[2:]),
                                                         ACTIVATION_CODES[activation], alpha, beta), "channel affine")
    return out


def bias_activation_(y: np.ndarray, bias: np.ndarray | None, activation: str | None = None,
                     alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """``y = act(y + bias[channel])`` in place, one pass; ``y`` a C-contiguous float32 [N, C, ...]."""
    require(y.dtype == np.float32 and y.flags.c_contiguous, 'bias activation ')
    return channel_affine(y, None, bias, activation, alpha, beta, out=y)


def prepared_channel_prelu(slope: np.ndarray, layout: tuple[int, int, int, int], shape: tuple[int, ...]):
    """PRelu for one plan step and one input shape, worked out once: a function of ``x`` (``shape``,
    C-contiguous float32) that returns ``x`` where x >= 0 and ``x * slope`` elsewhere in a new array;
    x seen as [N, C, HW, lanes] (``layout``), ``slope`` [C * lanes].  Per call one output array
    and one C call: MTCNN's PRelu steps on maps of a few KB take ~1-2 us of
    arithmetic, where checking and converting every argument would cost more than numpy's pass."""
    n, c, hw, lanes = layout
    require(library._lib is not None and slope.dtype == np.float32 and slope.flags.c_contiguous
            and slope.size == c * lanes and math.prod(shape) == n * c * hw * lanes, 'channel prelu')
    fn, empty, f32 = library.function("optcli_channel_prelu_f32"), np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        y = empty(shape, f32)
        rc = fn(x, y, slope, n, c, hw, lanes)
        if rc:
            _check(rc, "channel prelu")
        return y

    return call
