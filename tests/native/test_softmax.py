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


@pytest.mark.parametrize("shape, axis", [((1, 64, 1), 1), ((1, 5, 1, 1), -3), ((1, 64, 1), -2)])
def test_a_one_row_softmax_on_another_axis_is_native(shape, axis, native_lib, monkeypatch):
    """A softmax whose axis holds every element (a decoder's [1, T, 1] attention weights) is the
    native call over the flat row."""
    from optcli.ops import normalization

    monkeypatch.setattr(normalization, "_one_row_softmax", lambda x: pytest.fail("numpy's one-row path taken"))
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = normalization.softmax([x], {"axis": axis, "_opset": 13})[0]
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
