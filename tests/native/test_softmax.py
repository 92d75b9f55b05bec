"""Softmax along the last axis of float32 as one native call (kernels/host/elementwise.c
``optcli_softmax_f32``, ``native.softmax_rows``), as the Softmax kernel takes it."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(1,), (1, 2), (3, 7), (2, 2, 16, 16), (5, 1023), (2, 1025), (1, 300000), (70, 1000)])
@pytest.mark.parametrize("special", [None, "nan", "inf", "-inf"])
def test_native_softmax_rows(shape, special, pool_threads, monkeypatch):
    """Softmax along the last axis of float32 is one native call (kernels/host/elementwise.c):
    within a few float32 roundings of float64 (a row of 300000: its sum in double blocks), rows
    over the pool's threshold split; a NaN or +inf makes its row NaN and a -inf a zero, as
    numpy's general path makes them; nothing else is called."""
    from optcli.ops import normalization

    monkeypatch.setattr(normalization, "_one_row_softmax", lambda x: pytest.fail("numpy's one-row path taken"))
    monkeypatch.setattr(normalization, "_tiny_softmax", lambda x: pytest.fail("Python's tiny path taken"))
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    if special:
        x.reshape(-1)[x.size // 2] = float(special)
    with np.errstate(invalid="ignore"):
        got = normalization.softmax([x], {"axis": -1, "_opset": 13})[0]
        x64 = x.astype(np.float64)
        want = np.exp(x64 - x64.max(axis=-1, keepdims=True))
        want /= want.sum(axis=-1, keepdims=True)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    if special is None:
        assert np.abs(got.astype(np.float64).sum(axis=-1) - 1).max() < 2e-6
