"""A blocked 1x1 conv of a 1x1 image (a classifier head after the global pool) runs as the GEMM's
matrix-vector product (ops/blocked.py ``_pointwise_gemv``): its results against the NCHW conv on odd
channel counts (1, primes, partial blocks on either side), batches, a stride, every activation, and
finite garbage in the input's pad lanes; and the route is taken only where the image and the
output are 1x1."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.ops import blocked, conv
from optcli.ops.registry import StepAttrs
from tests.native.cases import ACT_PARAMS

# (N, C, M, stride)
CASES = [(1, 1, 1, 1), (1, 16, 24, 1), (2, 13, 37, 1), (3, 8, 5, 2), (1, 72, 128, 1), (2, 40, 9, 1)]
ACTS = [None, *ACT_PARAMS]


def _native_blocked_or_skip():
    if not native.available() or blocked._native_blocked() is None:
        pytest.skip("needs the native library's blocked kernels")


@pytest.mark.parametrize("block", (4, 8))
@pytest.mark.parametrize("case", CASES, ids=[f"n{c[0]}_c{c[1]}_m{c[2]}_s{c[3]}" for c in CASES])
def test_head_conv_matches_nchw(case, block, monkeypatch):
    _native_blocked_or_skip()
    n, c, m, s = case
    i = CASES.index(case)
    rng = np.random.default_rng(i)
    x = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    taken = []
    real = blocked._pointwise_gemv
    monkeypatch.setattr(blocked, "_pointwise_gemv", lambda *a: taken.append(1) or real(*a))
    for j, act in enumerate(ACTS[i % 3::3]):
        alpha, beta = ACT_PARAMS.get(act, (0.0, 0.0))
        attrs = {"kernel_shape": [1, 1], "strides": [s, s]}
        if act:
            attrs.update(activation=act, activation_alpha=alpha, activation_beta=beta)
        xb = blocked.to_blocked(x, block)
        if c % block:  # pad lanes hold finite values no kernel may mix into a real channel
            xb[:, -1, :, :, c % block:] = 1e30
        bias = b if j % 2 == 0 else None
        y = blocked.conv_blocked([xb, w, bias], StepAttrs(dict(attrs)))[0]
        want = conv.conv_im2col([x, w, bias], dict(attrs))[0]
        assert y.shape == (n, -(-m // block), 1, 1, block)
        np.testing.assert_allclose(blocked.from_blocked(y, m), want, rtol=1e-5, atol=1e-5)
        assert np.isfinite(y).all()
    assert taken


def test_larger_images_keep_the_blocked_kernel(monkeypatch):
    """A 1x1 conv of a 2x2 image, or a padded one of a 1x1 image (a 3x3 output), is no GEMV."""
    _native_blocked_or_skip()
    taken = []
    monkeypatch.setattr(blocked, "_pointwise_gemv", lambda *a: taken.append(1))
    rng = np.random.default_rng(7)
    w = rng.standard_normal((9, 8, 1, 1)).astype(np.float32)
    for hw, pads in ((2, [0, 0, 0, 0]), (1, [1, 1, 1, 1])):
        x = rng.standard_normal((1, 8, hw, hw)).astype(np.float32)
        attrs = {"kernel_shape": [1, 1], "pads": pads}
        y = blocked.conv_blocked([blocked.to_blocked(x, 8), w, None], StepAttrs(dict(attrs)))[0]
        want = conv.conv_im2col([x, w, None], dict(attrs))[0]
        np.testing.assert_allclose(blocked.from_blocked(y, 9), want, rtol=1e-5, atol=1e-5)
    assert not taken
