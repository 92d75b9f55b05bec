"""The native float32 <-> half casts of the GPU's half storage (``native.to_half``/``from_half``,
used by ``to_storage`` for every fp16 upload and by the OpenCL download): bit for bit what numpy's
cast plus optcli's saturation give, edge values included, at 10x numpy's speed (numpy's cast was
1.3 ms of an fp16 run's 3 ms on an H100)."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.runtime.gpu_common.device_buffers import to_storage

EDGES = [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 1e6, -3.4e38,
         3.4e38, 6.1035156e-05, 6.0975552e-05, 5.96e-08, 2.98e-08, 2.9802326e-08, 2.9802327e-08, 1.0009765625,
         1.00048828125, 1.00146484375, 2049.0, 2051.0]


def _numpy_half(x: np.ndarray) -> np.ndarray:
    """numpy's cast (round to nearest even), finite values that overflowed put back to +-65504."""
    with np.errstate(over="ignore"):
        half = x.astype(np.float16)
    overflowed = np.isfinite(x) & ~np.isfinite(half)
    return np.where(overflowed, np.clip(x, -65504, 65504), half).astype(np.float16)


def _values(n: int = 200_003) -> np.ndarray:  # odd: the 8-wide loop's tail runs too
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(n) * np.float32(4.0) ** rng.integers(-20, 12, n)).astype(np.float32)
    x[: min(n, len(EDGES))] = EDGES[:n]
    return x


def test_to_half_is_numpys_cast_with_saturation(native_lib):
    x = _values()
    got, want = native.to_half(x), _numpy_half(x)
    nan = np.isnan(x)
    assert got.dtype == np.float16 and got.shape == x.shape
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan]).all()
    assert got[6] == 65504 and got[9] == 65504 and got[12] == -65504 and np.isinf(got[0]) and got[1] == -np.inf


def test_from_half_is_exact(native_lib):
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got, want = native.from_half(every_half), every_half.astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan], want[~nan]) and np.isnan(got[nan]).all()


@pytest.mark.parametrize("shape", [(), (1,), (7,), (1, 3, 5, 9)])
def test_shapes_and_non_contiguous_inputs(native_lib, shape):
    x = _values(int(np.prod(shape, dtype=np.int64)) * 2)[::2].reshape(shape)
    assert native.to_half(x).shape == shape
    assert np.array_equal(native.to_half(x), _numpy_half(x), equal_nan=True)
    assert native.from_half(native.to_half(x)).shape == shape


def test_to_storage_takes_the_native_cast_and_numpy_where_there_is_none(native_lib, monkeypatch):
    x = _values(1001).reshape(7, 11, 13)
    with_native = to_storage(x, np.float16)
    monkeypatch.setattr(native.library, "_lib", None)
    assert native.to_half(x) is None and native.from_half(with_native) is None
    without = to_storage(x, np.float16)
    nan = np.isnan(x)
    assert np.array_equal(with_native.view(np.uint16)[~nan], without.view(np.uint16)[~nan])
