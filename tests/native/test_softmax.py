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


@pytest.mark.parametrize("shape, axis", [((1, 21, 16, 17), 1), ((2, 4, 16, 7), 1), ((1, 4, 16, 300), 2), ((3, 5, 2), 1),
                                         ((1, 1, 9), 1), ((2, 4096, 3), 1), ((1, 3, 1000), -2)], ids=str)
@pytest.mark.parametrize("special", [None, "nan", "inf", "-inf"])
def test_native_softmax_along_a_middle_axis(shape, axis, special, pool_threads, monkeypatch):
    """Softmax along an axis that is not the last (a segmentation map's classes, a YOLOv8 head's bins):
    one native call over [outer, n, inner] (positions in vectors of 8 and chunks of 256, the last few
    one at a time), within a few roundings of float64; a NaN or +inf makes its row NaN, a -inf a
    zero; rows over 4096 stay in numpy."""
    from optcli import native
    from optcli.ops import normalization

    calls = []
    real = native.softmax_mid
    monkeypatch.setattr(native, "softmax_mid", lambda x, a: calls.append(a) or real(x, a))
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    if special:
        x.reshape(-1)[x.size // 2 + 1] = float(special)
    with np.errstate(invalid="ignore"):
        got = normalization.softmax([x], {"axis": axis, "_opset": 13})[0]
        x64 = x.astype(np.float64)
        want = np.exp(x64 - x64.max(axis=axis, keepdims=True))
        want /= want.sum(axis=axis, keepdims=True)
    assert got.dtype == np.float32 and got.shape == x.shape and calls == [axis % len(shape)]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_a_middle_axis_longer_than_the_kernel_takes_stays_in_numpy(native_lib, monkeypatch):
    from optcli import native
    from optcli.ops import normalization

    monkeypatch.setattr(native, "softmax_mid", lambda x, a: pytest.fail("native strided softmax taken"))
    x = np.random.default_rng(0).standard_normal((1, 4097, 2)).astype(np.float32)
    got = normalization.softmax([x], {"axis": 1, "_opset": 13})[0]
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
