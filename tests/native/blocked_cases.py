"""Blocked (NCHWc) window cases and their NCHW numpy references, shared by the host tests
(test_blocked_window.py) and the aarch64 driver's (test_aarch64.py)."""

from __future__ import annotations

from unittest import mock

import numpy as np

from optcli import native
from optcli.ops.activation import apply_activation
from tests.native.cases import ACT_PARAMS

# Depthwise (id, N, C, H, W, (KH, KW), strides, dilations, pads [top, left, bottom, right]): one channel,
# primes (pad lanes), 1x1 spatial, 7x7, a large plane, stride 1, 2 and mixed, dilation 2, asymmetric,
# wide and negative pads, a non-square window.
DW_CASES = [
    ("c1-1x1-pad1", 1, 1, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ("c7-s2-odd", 1, 7, 17, 23, (3, 3), (2, 2), (1, 1), (0, 1, 1, 0)),
    ("c13-5x5-s1", 1, 13, 19, 11, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ("c37-5x5-s2-n2", 2, 37, 15, 16, (5, 5), (2, 2), (1, 1), (1, 2, 2, 1)),
    ("c5-dil2", 1, 5, 12, 12, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    ("c11-3x5-dil21", 1, 11, 14, 9, (3, 5), (1, 1), (2, 1), (2, 2, 2, 2)),
    ("c7-112-s2", 1, 7, 112, 112, (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),
    ("c13-7x7-5x5", 1, 13, 7, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ("c16-56", 1, 16, 56, 56, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ("c5-1x5-neg-pad", 1, 5, 6, 12, (1, 5), (1, 1), (1, 1), (0, -1, 0, 2)),
    ("c31-wide-pads", 1, 31, 4, 4, (3, 3), (1, 1), (1, 1), (3, 2, 2, 3)),
    ("c9-7x7-kernel", 1, 9, 14, 14, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    ("c6-strides-21", 1, 6, 10, 11, (3, 3), (2, 1), (1, 1), (1, 1, 1, 1)),
    ("c3-s3", 1, 3, 11, 13, (3, 3), (3, 3), (1, 1), (0, 0, 0, 0)),
    ("c37-14-3x3", 1, 37, 14, 14, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    # rows of 32 pixels or more: read in place, edge columns from padded copies
    ("c3-wide-3x5-dil2-s12", 1, 3, 20, 70, (3, 5), (1, 2), (2, 2), (1, 3, 2, 0)),
    ("c5-wide-neg-pad", 1, 5, 9, 80, (1, 5), (1, 1), (1, 1), (0, -2, 0, 3)),
    ("c2-wide-pads-5x5", 2, 2, 6, 40, (5, 5), (1, 1), (1, 1), (4, 4, 4, 4)),
    ("c1-wide-valid", 1, 1, 3, 35, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0)),
    ("c4-wide-s2-dil2", 1, 4, 11, 64, (3, 3), (2, 2), (2, 2), (2, 2, 2, 2)),
    ("c6-wide-5x5-s2", 1, 6, 9, 69, (5, 5), (2, 2), (1, 1), (1, 2, 2, 1)),
    ("c2-wide-window", 1, 2, 5, 33, (3, 33), (1, 1), (1, 1), (1, 16, 1, 16)),
    # rows of 16 to ~2 tiles: read in place, but no middle between the edge tiles (wrote past the scratch once)
    ("c8-16-3x3", 1, 8, 16, 16, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ("c8-17-5x5", 1, 8, 9, 17, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ("c24-20-s2", 1, 24, 40, 40, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
]

# Pooling (id, N, C, H, W, (KH, KW), strides, dilations, pads)
POOL_CASES = [
    ("c1-1x1", 1, 1, 1, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    ("c13-56-3x3-s2", 1, 13, 56, 56, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    ("c3-odd-2x2", 2, 3, 9, 11, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
    ("c5-ceil", 1, 5, 10, 13, (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),
    ("c7-pads-asym", 1, 7, 8, 6, (3, 2), (1, 1), (1, 1), (1, 0, 2, 1)),
    ("c2-dil2", 1, 2, 12, 12, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    ("c4-5x5-s3", 1, 4, 17, 19, (5, 5), (3, 3), (1, 1), (2, 2, 2, 2)),
    ("c37-112-3x3-s2", 1, 37, 112, 112, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    ("c3-wide-asym", 1, 3, 10, 70, (3, 2), (1, 1), (1, 1), (1, 0, 2, 1)),
    ("c5-wide-dil2-s2", 2, 5, 9, 90, (3, 3), (1, 2), (2, 2), (2, 1, 2, 3)),
    ("c7-64-2x2-s2", 1, 7, 64, 64, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
    ("c8-32-3x3-s2", 1, 8, 32, 32, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # 16 outputs a row, no middle
]

GAP_SHAPES = [(1, 1, 1, 1), (2, 7, 7, 7), (1, 37, 13, 11), (1, 13, 112, 112), (1, 576, 7, 7)]


def out_size(size: int, k: int, s: int, d: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


def geometry(case) -> tuple[tuple[int, int], tuple[int, int]]:
    """(pad_begin, out) of a case."""
    _, _, _, h, w, k, s, d, p = case
    return (p[0], p[1]), (out_size(h, k[0], s[0], d[0], p[0], p[2]), out_size(w, k[1], s[1], d[1], p[1], p[3]))


def block_widths() -> list[int]:
    """The block widths the blocked kernels take on this CPU: 4 and 8, and 16 with AVX-512."""
    from optcli import native

    return [4, 8, 16] if native.available() and native.library._lib.optcli_gemm_variant(-1) == 16 else [4, 8]


def to_blocked(x: np.ndarray, block: int, fill: float = 0.0) -> np.ndarray:
    """NCHW -> [N, ceil(C/B), H, W, B], pad lanes ``fill``."""
    n, c, h, w = x.shape
    cb = -(-c // block)
    y = np.full((n, cb * block, h, w), fill, np.float32)
    y[:, :c] = x
    return np.ascontiguousarray(y.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(y: np.ndarray, c: int) -> np.ndarray:
    """[N, Cb, H, W, B] -> NCHW of the first c channels."""
    n, cb, h, w, b = y.shape
    return np.ascontiguousarray(y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :c])


def _windows(x: np.ndarray, case, fill: float):
    """x [N, C, H, W] padded with ``fill``, and each tap's [N, C, OH, OW] view."""
    _, _, _, h, w, (kh, kw), (sh, sw), (dh, dw), p = case
    (pt, pl), (oh, ow) = geometry(case)
    hp, wp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1), max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    xp = np.full((*x.shape[:2], hp + max(0, -pt), wp + max(0, -pl)), fill, x.dtype)
    r0, c0 = max(0, pt), max(0, pl)
    xp[:, :, r0:r0 + h, c0:c0 + w] = x
    xp = xp[:, :, max(0, -pt):, max(0, -pl):]  # negative pads crop
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]


def ref_depthwise(x, w, b, case, act=None) -> np.ndarray:
    """NCHW depthwise (multiplier 1) in float64, then the activation in numpy."""
    y = 0.0
    for i, j, v in _windows(x.astype(np.float64), case, 0.0):
        y = y + v * w[None, :, 0, i, j, None, None]
    if b is not None:
        y = y + b[None, :, None, None]
    with mock.patch.object(native.library, "_lib", None):
        return apply_activation(np.asarray(y, np.float32), act, *ACT_PARAMS.get(act, (0.0, 0.0)))


def axis_counts(case) -> tuple[np.ndarray, np.ndarray]:
    """1 / (the in-bounds taps of each output row's and column's window)."""
    _, _, _, h, w, (kh, kw), (sh, sw), (dh, dw), _ = case
    (pt, pl), (oh, ow) = geometry(case)

    def counts(size, k, s, d, p0, o):
        pos = np.arange(o)[:, None] * s - p0 + np.arange(k)[None, :] * d
        return (1.0 / np.maximum(((pos >= 0) & (pos < size)).sum(1), 1)).astype(np.float32)

    return counts(h, kh, sh, dh, pt, oh), counts(w, kw, sw, dw, pl, ow)


def ref_pool(x, case, op: str) -> np.ndarray:
    """NCHW max (padding -inf, np.maximum) or average (padding 0, count of in-bounds taps) pooling."""
    if op == "max":
        y = None
        for _, _, v in _windows(x, case, -np.inf):
            y = v.copy() if y is None else np.maximum(y, v)
        return y
    rrow, rcol = axis_counts(case)
    y = 0.0
    for _, _, v in _windows(x.astype(np.float64), case, 0.0):
        y = y + v
    return (y * rrow[:, None] * rcol[None, :]).astype(np.float32)
