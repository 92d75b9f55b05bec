"""The blocked dense conv and the layout conversions (kernels/host/blocked_conv.c) against the NCHW numpy conv:
odd shapes, every block width the CPU has, plain and blocked inputs, residual, every activation,
1 and 2 threads, garbage in the input's pad lanes, and refusal of bad geometry."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.ops.activation import activate
from optcli.ops.conv import conv_im2col
from tests.helpers import assert_close
from tests.native.blocked_cases import block_widths, from_blocked, to_blocked
from tests.native.cases import ACT_PARAMS

GARBAGE = 1e30
# (label, N, C, M, H, W, kernel, stride, dilation, pads (top, left, bottom, right))
CASES = [
    ("stem 3->16 s2", 1, 3, 16, 17, 19, 3, 2, 1, (1, 1, 1, 1)),
    ("1ch", 1, 1, 5, 6, 7, 3, 1, 1, (1, 1, 1, 1)),
    ("primes 13->37", 2, 13, 37, 9, 11, 3, 1, 1, (1, 1, 1, 1)),
    ("pointwise 16", 1, 16, 16, 8, 8, 1, 1, 1, (0, 0, 0, 0)),
    ("pointwise 7x7 40->24", 1, 40, 24, 7, 7, 1, 1, 1, (0, 0, 0, 0)),
    ("1x1 plane", 1, 5, 7, 1, 1, 1, 1, 1, (0, 0, 0, 0)),
    ("1x1 plane 3x3", 1, 6, 9, 1, 1, 3, 1, 1, (1, 1, 1, 1)),
    ("dilation 2", 1, 7, 29, 12, 10, 3, 1, 2, (2, 2, 2, 2)),
    ("7x7 s2 stem", 1, 3, 64, 23, 23, 7, 2, 1, (3, 3, 3, 3)),
    ("3x3 64@14", 1, 64, 64, 14, 14, 3, 1, 1, (1, 1, 1, 1)),
    ("5x5 s2", 1, 24, 40, 5, 6, 5, 2, 1, (2, 2, 2, 2)),
    ("no pad 3x3", 1, 8, 8, 3, 3, 3, 1, 1, (0, 0, 0, 0)),
    ("asymmetric pads", 1, 9, 17, 8, 9, 3, 2, 1, (0, 1, 1, 0)),
    ("strided 1x1", 1, 20, 33, 9, 9, 1, 2, 1, (0, 0, 0, 0)),
    ("wide 112", 1, 16, 24, 112, 112, 3, 2, 1, (1, 1, 1, 1)),
    ("many input blocks", 1, 300, 20, 5, 5, 3, 1, 1, (1, 1, 1, 1)),
    # a pointwise input past 256 KB: bands of ~64 KB, every output group in turn within a band
    ("pointwise past L2 n2", 2, 21, 40, 61, 67, 1, 1, 1, (0, 0, 0, 0)),
    # whole input blocks (the tile's unrolled-lane path) with dilation, strides, asymmetric pads,
    # rows of 1-3 pixels (the narrow tiles' split accumulators) and a partial last block
    ("blocks dilated asym", 1, 16, 24, 12, 13, 3, 1, 2, (2, 1, 0, 3)),
    ("blocks narrow rows s2 n2", 2, 24, 17, 5, 3, 3, 2, 1, (1, 0, 0, 1)),
    ("blocks 5x5 s2 d2 + partial", 1, 43, 16, 15, 16, 5, 2, 2, (3, 2, 1, 4)),
    ("blocks 1 wide", 1, 32, 16, 9, 1, 3, 1, 1, (1, 1, 1, 1)),
    # rows of up to 32 outputs take a zero-padded copy of a blocked input (every tile unchecked);
    # wider ones keep the checked edge tiles: both sides of that line, asymmetric pads
    ("padded copy at its widest", 1, 17, 16, 5, 32, 3, 1, 1, (1, 2, 1, 0)),
    ("checked edges past the copy", 1, 16, 16, 6, 40, 3, 1, 1, (1, 1, 1, 1)),
    ("padded copy, pads past the input", 1, 8, 8, 2, 3, 3, 1, 2, (3, 2, 4, 3)),
    # weights past 1 MB: each pass prefetches the next pass's weights, the last the next group's
    ("weights past L2", 1, 200, 190, 5, 4, 3, 1, 1, (1, 1, 1, 1)),
]


BLOCKS = block_widths()


def _bc():
    from optcli.native import blocked_conv

    return blocked_conv


def _case(case, seed):
    _, n, c, m, h, w, k, s, d, pads = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"pads": list(pads), "strides": [s, s], "dilations": [d, d]}
    ref = conv_im2col([x, wt, b], attrs)[0]
    return x, wt, b, attrs, ref


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_matches_numpy(case, block, pool_threads):
    bc = _bc()
    i = CASES.index(case)
    x, wt, b, attrs, ref = _case(case, i)
    _, n, c, m, h, w, k, s, d, pads = case
    out = ref.shape[2:]
    packed = bc.pack_conv_weights(wt, block)
    act = [None, *ACT_PARAMS][i % (1 + len(ACT_PARAMS))]
    alpha, beta = ACT_PARAMS.get(act, (0.0, 0.0)) if act else (0.0, 0.0)
    rng = np.random.default_rng(100 + i)
    res = rng.standard_normal(ref.shape).astype(np.float32)
    want = activate(ref + res, act, alpha, beta)
    for x_in in (x, to_blocked(x, block, fill=GARBAGE)):  # a stem's plain input, and a blocked one
        y = bc.conv2d_blocked(x_in, packed, b, m, (k, k), (s, s), (d, d), pads[:2], out, act, alpha, beta,
                              residual=to_blocked(res, block))
        assert y.shape == (n, -(-m // block), *out, block)
        assert np.isfinite(y).all(), "pad lanes must hold finite values"
        assert_close(from_blocked(y, m), want, "fp32", what=f"{case[0]} B={block} {act}")


@pytest.mark.parametrize("block", BLOCKS)
def test_conversions_round_trip(block, pool_threads):
    bc = _bc()
    rng = np.random.default_rng(1)
    for shape in [(1, 1, 1, 1), (2, 13, 5, 7), (1, 37, 56, 56), (1, 16, 3, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        xb = bc.to_blocked(x, block)
        np.testing.assert_array_equal(xb, to_blocked(x, block))  # pad lanes zero
        np.testing.assert_array_equal(bc.from_blocked(xb, shape[1]), x)


def test_bad_geometry_is_refused(native_lib):
    bc = _bc()
    block = BLOCKS[-1]
    x = np.zeros((1, 1, 4, 4, block), np.float32)
    packed = bc.pack_conv_weights(np.zeros((4, 3, 3, 3), np.float32), block)
    y = np.empty((1, 1, 4, 4, block), np.float32)
    for bad in [(1, 3, 4, 4, 4, 3, 3, 0, 1, 1, 1, 1, 1, 4, 4, block, block),   # stride 0
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 3, block),       # input block neither 1 nor B
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, 5),       # no such block width
                (1, 0, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, block),   # no input channel
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1 << 50, 4, block, block)]:  # absurd output
        geom = np.array(bad, np.int64)
        rc = native.library._lib.optcli_conv2d_blocked_f32(x.ctypes.data, packed.ctypes.data, None, None,
                                                           y.ctypes.data, geom.ctypes.data, 0, 0.0, 0.0)
        assert rc == -1, bad
    assert native.library._lib.optcli_to_blocked_f32(x.ctypes.data, y.ctypes.data, 1, 3, 16, 5) == -1
