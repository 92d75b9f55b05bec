"""The stem conv: a dense (one group) 2-D conv for few input channels, direct, no padded copy
(kernels/host/stem.c)."""

from __future__ import annotations

import math

import numpy as np

from optcli.native import library
from optcli.native.library import require
from optcli.native.window import _prepared_window_conv, _window_conv

STEM_MAX_CHANNELS = 4  # input channels up to which a one-group conv always runs in stem_conv2d
STEM_MAX_TAPS = 576  # beyond the stems: C * KH * KW up to this (64 channels of 3x3) ...
STEM_MIN_WIDTH = 14  # ... and output rows at least this wide


def stem_fits(channels: int, kernel: tuple[int, ...], strides: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether ``stem_conv2d`` takes a one-group 2-D conv: always with few input channels (the
    stems: the GEMM's packing costs as much as its K = C*KH*KW multiply-adds), and measured faster
    than the implicit GEMM also for up to 64 channels of a 3x3 window (ResNet's first stage, the
    3x3 convs of detection necks) where the output rows fill its vectors; 1x1 windows are GEMMs.
    With wider windows and narrow rows (7x7 maps of 512 channels: 3x slower) the GEMM stays."""
    if not (math.prod(kernel) <= 1024 and max(strides, default=1) <= 16 and channels >= 1):
        return False
    taps = channels * math.prod(kernel)
    return channels <= STEM_MAX_CHANNELS or (taps <= STEM_MAX_TAPS and math.prod(kernel) > 1
                                              and out[-1] >= STEM_MIN_WIDTH)


def stem_fits_grouped(channels_per_group: int, kernel: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether ``stem_conv2d`` takes a grouped conv (groups > 1, more than one channel per group):
    small groups, whatever the map.  The implicit GEMM packs each group's few rows and columns on
    their own; RegNetX-200MF's 3x3 convs of 8 channels a group ran 1.6-3x faster here, on maps from
    112x112 down to 7x7 (1 thread, AVX2)."""
    return (math.prod(kernel) <= 1024 and max(strides, default=1) <= 16 and channels_per_group >= 1
            and channels_per_group * math.prod(kernel) <= STEM_MAX_TAPS)


def stem_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                dilations: tuple[int, int], pad_begin: tuple[int, int], out: tuple[int, int],
                activation: str | None = None, alpha: float = 0.0, beta: float = 0.0, groups: int = 1) -> np.ndarray:
    """Conv of float32 NCHW ``x`` by ``w`` [M, C / groups, KH, KW] with bias and a fused
    activation, for few input channels per group (kernels/host/stem.c): zero padding at the start
    is ``pad_begin``, at the end whatever ``out`` implies, applied by the kernel (no padded copy).
    Returns a new float32 array [N, M, *out]."""
    require(library._lib is not None and x.ndim == 4 and w.ndim == 4 and groups >= 1 and
            w.shape[1] * groups == x.shape[1] and w.shape[0] % groups == 0, 'stem conv2d')
    grouped = library.function("optcli_stem_conv2d_grouped_f32")

    def fn(xa, wa, ba, ya, geom, code, al, be):
        return grouped(xa, wa, ba, ya, geom, groups, code, al, be)

    return _window_conv(fn, "stem conv", x, w, bias, strides, dilations, pad_begin, out, activation, alpha, beta)


def prepared_stem_conv2d(xshape: tuple[int, int, int, int], w: np.ndarray, bias: np.ndarray | None,
                         strides: tuple[int, int], dilations: tuple[int, int], pad_begin: tuple[int, int],
                         out: tuple[int, int], activation: str | None, alpha: float, beta: float, groups: int = 1):
    """``stem_conv2d`` for one plan step and input shape, worked out once: a function of a
    C-contiguous float32 ``x`` of ``xshape``.  A face detector's 3 -> 28 stem over 24x24 spent ~8
    of its ~29 us in the window, checks and conversions that this makes once."""
    require(library._lib is not None and len(xshape) == 4 and w.ndim == 4 and groups >= 1
            and w.shape[1] * groups == xshape[1] and w.shape[0] % groups == 0, 'prepared stem conv2d')
    return _prepared_window_conv(library.function("optcli_stem_conv2d_grouped_f32"), "stem conv", xshape, w, bias,
                                 strides, dilations, pad_begin, out, activation, alpha, beta, groups)
