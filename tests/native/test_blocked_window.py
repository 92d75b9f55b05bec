"""Blocked (NCHWc) depthwise conv, pooling and global average pooling (kernels/host/blocked_window.c) against
NCHW numpy references: odd shapes, every block width the CPU has, every activation, 1 and 2 threads,
garbage in the input's pad lanes."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.native import caches
from tests.helpers import assert_close
from tests.native.blocked_cases import (
    DW_CASES,
    GAP_SHAPES,
    POOL_CASES,
    axis_counts,
    block_widths,
    from_blocked,
    geometry,
    ref_depthwise,
    ref_pool,
    to_blocked,
)
from tests.native.cases import ACT_PARAMS

ACTS = [None, *ACT_PARAMS]
GARBAGE = 1e30  # large finite values in the input's pad lanes: they must not reach a real channel


BLOCKS = block_widths()


def _bw():
    from optcli.native import blocked_window

    return blocked_window


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("case", DW_CASES, ids=[c[0] for c in DW_CASES])
def test_depthwise_matches_numpy(case, block, pool_threads):
    bw = _bw()
    i = DW_CASES.index(case)
    rng = np.random.default_rng(i)
    _, n, c, h, w, k, s, d, _ = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if i % 4 != 1 else None
    act = ACTS[(i + block) % len(ACTS)]
    alpha, beta = ACT_PARAMS.get(act, (0.0, 0.0))
    pad_begin, out = geometry(case)
    packed = bw.pack_depthwise_weights(wt, block)
    assert packed.shape == (-(-c // block), *k, block) and packed.flags.c_contiguous
    xb = to_blocked(x, block, GARBAGE)
    y = bw.depthwise_conv2d_blocked(xb, packed, b, k, s, d, pad_begin, out, act, alpha, beta)
    assert y.shape == (n, -(-c // block), *out, block)
    want = ref_depthwise(x, wt, b, case, act)
    assert_close(from_blocked(y, c), want, what=f"{case[0]} B={block} {act}")
    assert np.isfinite(y).all(), "pad lanes must stay finite"
    call = bw.prepared_depthwise_conv2d_blocked(xb.shape, packed, b, k, s, d, pad_begin, out, act, alpha, beta)
    np.testing.assert_array_equal(call(xb), y)
    np.testing.assert_array_equal(call(to_blocked(x, block, 0.0)), y)  # pad lanes: act(0) either way


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_matches_numpy(case, op, block, pool_threads):
    bw = _bw()
    rng = np.random.default_rng(POOL_CASES.index(case))
    _, n, c, h, w, k, s, d, _ = case
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    pad_begin, out = geometry(case)
    rrow, rcol = axis_counts(case) if op == "avg" else (None, None)
    y = bw.pool2d_blocked(to_blocked(x, block, GARBAGE), op, k, s, d, pad_begin, out, rrow, rcol)
    assert y.shape == (n, -(-c // block), *out, block)
    assert_close(from_blocked(y, c), ref_pool(x, case, op), what=f"{case[0]} {op} B={block}")
    assert np.isfinite(y).all()


@pytest.mark.parametrize("block", BLOCKS)
def test_max_pool_nan_and_inf(block, native_lib):
    bw = _bw()
    case = POOL_CASES[1]
    _, n, c, h, w, k, s, d, _ = case
    x = np.random.default_rng(3).standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 0, 5, 7] = np.nan
    x[0, 1, 10, 10] = np.inf
    x[0, 2, 20, 20] = -np.inf
    pad_begin, out = geometry(case)
    y = bw.pool2d_blocked(to_blocked(x, block), "max", k, s, d, pad_begin, out)
    np.testing.assert_array_equal(from_blocked(y, c), ref_pool(x, case, "max"))


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", GAP_SHAPES, ids=[str(s) for s in GAP_SHAPES])
def test_global_average_matches_numpy(shape, block, pool_threads):
    bw = _bw()
    x = (np.random.default_rng(1).standard_normal(shape) + 3).astype(np.float32)
    y = bw.global_average_pool_blocked(to_blocked(x, block, GARBAGE))
    assert y.shape == (shape[0], -(-shape[1] // block), 1, 1, block)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(np.float32)
    assert_close(from_blocked(y, shape[1]), want, what=f"global average {shape} B={block}")
    assert np.isfinite(y).all()


def test_nonsense_geometry_is_refused(native_lib):
    """Bad sizes come back as OPT_EINVAL, never a crash."""
    lib = native.library._lib
    x = np.zeros(64, np.float32)
    y = np.zeros(64, np.float32)
    good = [1, 1, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 2, 2, 4]
    geom = caches._geom(tuple(good)).ctypes.data
    assert lib.optcli_pool2d_blocked_f32(x.ctypes.data, y.ctypes.data, geom, 1, None, None) == 0
    for i, bad in [(1, 0), (4, 0), (6, 0), (8, 0), (14, 3), (14, 32), (2, -1), (12, -2), (5, 1 << 40), (0, 1 << 60),
                   (2, 1 << 41), (3, -5)]:
        g = list(good)
        g[i] = bad
        geom = caches._geom(tuple(g)).ctypes.data
        assert lib.optcli_pool2d_blocked_f32(x.ctypes.data, y.ctypes.data, geom, 1, None, None) == -1, (i, bad)
        assert lib.optcli_dwconv2d_blocked_f32(x.ctypes.data, x.ctypes.data, None, y.ctypes.data, geom, 0, 0.0,
                                               0.0) == -1, (i, bad)
    geom = caches._geom(tuple(good)).ctypes.data
    assert lib.optcli_pool2d_blocked_f32(x.ctypes.data, y.ctypes.data, geom, 3, None, None) == -1
    assert lib.optcli_pool2d_blocked_f32(x.ctypes.data, y.ctypes.data, geom, 2, None, None) == -1
    assert lib.optcli_dwconv2d_blocked_f32(x.ctypes.data, x.ctypes.data, None, y.ctypes.data, geom, 99, 0.0,
                                           0.0) == -1
    assert lib.optcli_global_avg_blocked_f32(x.ctypes.data, y.ctypes.data, 1, 1, 0, 4) == -1
    assert lib.optcli_global_avg_blocked_f32(x.ctypes.data, y.ctypes.data, 1, 1, 4, 5) == -1
    assert lib.optcli_global_avg_blocked_f32(x.ctypes.data, y.ctypes.data, 1, 1, 4, 4) == 0
