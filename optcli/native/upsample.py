"""Upsampling by whole factors (kernels/host/upsample.c): a ConvTranspose whose taps never overlap,
each output row written once with its bias and activation, where numpy wrote one strided pass per
tap and one each for the bias and the activation.  (The kernel also takes a nearest Resize, tap
stride 0; measured on a quiet machine it was no faster than numpy's two-copy path, so Resize keeps
numpy's.)"""

from __future__ import annotations

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.library import _check, require


def _upsample(src: np.ndarray, bias: np.ndarray | None, planes: int, channels: int, h: int, w: int, kh: int,
              kw: int, tap_stride: int, activation: str | None, alpha: float, beta: float) -> np.ndarray:
    y = np.empty((planes, h * kh, w * kw), np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    require(b is None or b.shape == (channels,), 'upsample taps')
    geom = np.array((planes, channels, h, w, kh, kw, src.size // max(planes, 1), tap_stride), np.int64)
    _check(library.function("optcli_upsample_taps_f32")(src, b, y, geom, ACTIVATION_CODES[activation], alpha, beta),
           "upsample")
    return y


def transpose_conv_taps(cols: np.ndarray, bias: np.ndarray | None, n: int, m: int, h: int, w: int, kh: int, kw: int,
                        activation: str | None = None, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """A ConvTranspose's output from its GEMM's columns ``cols`` (float32, [N, M * kh * kw, H * W]) where
    its taps never overlap (stride = kernel, no dilation, no padding): pixel (i * kh + a, j * kw + b) of
    channel m is tap (a, b) of input pixel (i, j), plus ``bias[m]``, through the activation.
    Returns [N, M, H * kh, W * kw]."""
    require(library._lib is not None and cols.shape == (n, m * kh * kw, h * w), 'transpose conv taps')
    cols = np.ascontiguousarray(cols, dtype=np.float32)
    y = _upsample(cols, bias, n * m, m, h, w, kh, kw, h * w, activation, alpha, beta)
    return y.reshape(n, m, h * kh, w * kw)
