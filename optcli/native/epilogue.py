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
