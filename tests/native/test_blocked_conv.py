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


# Grouped: (label, N, C, M, H, W, kernel, stride, dilation, pads, groups), each group's inputs and
# outputs whole blocks at the widths it runs with (``grouped_fits``): RegNet's 8-channel groups, 16,
# and 4 (B = 4 only); 1x1 spatial, primes of rows and columns, strides, dilation, asymmetric pads,
# pointwise, 2 images, more outputs than inputs per group and fewer.
GROUPED_CASES = [
    ("regnet w8 3x3 s2 g3", 1, 24, 24, 13, 11, 3, 2, 1, (1, 1, 1, 1), 3),
    ("w8 s1 n2 g5", 2, 40, 40, 7, 5, 3, 1, 1, (1, 1, 1, 1), 5),
    ("1x1 spatial w8->16", 1, 16, 32, 1, 1, 3, 1, 1, (1, 1, 1, 1), 2),
    ("w16->8 dilated asym", 1, 32, 16, 9, 10, 3, 1, 2, (2, 1, 0, 3), 2),
    ("pointwise w8->16 g4", 1, 32, 64, 6, 7, 1, 1, 1, (0, 0, 0, 0), 4),
    ("strided 1x1 w8", 1, 16, 16, 9, 9, 1, 2, 1, (0, 0, 0, 0), 2),
    ("w16 g4 wide rows", 1, 64, 64, 10, 29, 3, 1, 1, (1, 1, 1, 1), 4),
    ("w8 5x5 s2 no pad", 1, 16, 16, 11, 13, 5, 2, 1, (0, 0, 0, 0), 2),
    ("w4->8 g3 asym s2", 1, 12, 24, 5, 5, 3, 2, 1, (0, 1, 1, 0), 3),
    ("w8 g46 7x7", 1, 368, 368, 7, 7, 3, 1, 1, (1, 1, 1, 1), 46),
]

BLOCKS = block_widths()


def _bc():
    from optcli.native import blocked_conv

    return blocked_conv


def _case(case, seed):
    _, n, c, m, h, w, k, s, d, pads, *rest = case
    groups = rest[0] if rest else 1
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    cg = c // groups
    wt = (rng.standard_normal((m, cg, k, k)) / np.sqrt(cg * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"pads": list(pads), "strides": [s, s], "dilations": [d, d], "group": groups}
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


def grouped_reference(x, wt, b, attrs, groups):
    """The grouped conv in float64, one group at a time through the one-group numpy conv."""
    c, m = x.shape[1], wt.shape[0]
    parts = [conv_im2col([x[:, g * c // groups:(g + 1) * c // groups].astype(np.float64),
                          wt[g * m // groups:(g + 1) * m // groups].astype(np.float64),
                          b[g * m // groups:(g + 1) * m // groups].astype(np.float64)],
                         {**attrs, "group": 1})[0] for g in range(groups)]
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("case", GROUPED_CASES, ids=[c[0] for c in GROUPED_CASES])
def test_grouped_conv_matches_numpy(case, block, pool_threads):
    """Each group reads only its own input blocks and its own packed weights: a group that read its
    neighbour's channels, or the first group's weights, differs from the per-group float64 reference."""
    bc = _bc()
    _, n, c, m, h, w, k, s, d, pads, groups = case
    if not bc.grouped_fits(c // groups, m // groups, block):
        pytest.skip(f"{c // groups} -> {m // groups} channels a group are not whole blocks of {block}")
    i = GROUPED_CASES.index(case)
    x, wt, b, attrs, ref = _case(case, 50 + i)
    assert_close(ref, grouped_reference(x, wt, b, attrs, groups), "fp32", what="numpy's grouped conv")
    out = ref.shape[2:]
    packed = bc.pack_conv_weights(wt, block, groups)
    act = [None, *ACT_PARAMS][i % (1 + len(ACT_PARAMS))]
    alpha, beta = ACT_PARAMS.get(act, (0.0, 0.0)) if act else (0.0, 0.0)
    res = np.random.default_rng(200 + i).standard_normal(ref.shape).astype(np.float32)
    want = activate(grouped_reference(x, wt, b, attrs, groups) + res, act, alpha, beta)
    for x_in in (x, to_blocked(x, block, fill=GARBAGE)):
        for residual in (None, to_blocked(res, block)):
            y = bc.conv2d_blocked(x_in, packed, b, m, (k, k), (s, s), (d, d), pads[:2], out, act, alpha, beta,
                                  residual=residual, groups=groups)
            expect = want if residual is not None else activate(grouped_reference(x, wt, b, attrs, groups), act,
                                                                 alpha, beta)
            assert y.shape == (n, m // block, *out, block)
            assert_close(from_blocked(y, m), expect, "fp32", what=f"{case[0]} B={block} {act}")


@pytest.mark.parametrize("block", BLOCKS)
def test_conversions_round_trip(block, pool_threads):
    bc = _bc()
    rng = np.random.default_rng(1)
    # (channels filling groups of 8 take the in-register transposes: 24 at B = 16 is a block of 16 and one
    # of 8 real lanes and 8 zeros; positions past the last 8 take the scalar loop)
    for shape in [(1, 1, 1, 1), (2, 13, 5, 7), (1, 37, 56, 56), (1, 16, 3, 3), (1, 24, 7, 9), (2, 32, 4, 11),
                  (1, 8, 3, 17), (1, 48, 1, 8)]:
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
    for bad in [(1, 3, 4, 4, 4, 3, 3, 0, 1, 1, 1, 1, 1, 4, 4, block, block, 1),   # stride 0
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 3, block, 1),       # input block neither 1 nor B
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, 5, 1),       # no such block width
                (1, 0, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, block, 1),   # no input channel
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1 << 50, 4, block, block, 1),  # absurd output
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, block, 0),   # no group
                (1, 3, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, block, 2),   # C not a multiple of groups
                (1, 2, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, block, block, 2),   # a group's inputs not whole blocks
                (1, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 1, block, 2)]:      # a group's outputs not whole blocks
        geom = np.array(bad, np.int64)
        rc = native.library._lib.optcli_conv2d_blocked_f32(x.ctypes.data, packed.ctypes.data, None, None,
                                                           y.ctypes.data, geom.ctypes.data, 0, 0.0, 0.0)
        assert rc == -1, bad
    assert native.library._lib.optcli_to_blocked_f32(x.ctypes.data, y.ctypes.data, 1, 3, 16, 5) == -1
