"""Native max / average pooling against the numpy kernels and onnxruntime: odd shapes, strides,
dilations, paddings, ceil_mode, count_include_pad, non-finite values, 1-D."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from optcli import native
from optcli.ops.pool import average_pool, max_pool
from tests.helpers import assert_close, run_ort, single_node_model

RNG = np.random.default_rng(11)

# (id, x shape, attrs)
CASES = [
    ("c1-1x1", (1, 1, 1, 1), {"kernel_shape": [1, 1]}),
    ("c64-112-3x3-s2", (1, 64, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("c3-odd-2x2", (2, 3, 9, 11), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("c5-ceil", (1, 5, 10, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("c7-pads-asym", (1, 7, 8, 6), {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1]}),
    ("c2-dil2", (1, 2, 12, 12), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ("c13-same-upper", (1, 13, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("c4-5x5-s3", (1, 4, 17, 19), {"kernel_shape": [5, 5], "strides": [3, 3], "pads": [2, 2, 2, 2]}),
    ("c6-1d", (1, 6, 31), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    # 2x2 / 2 without padding: a max pooling of its own (vectors of 8 outputs and a tail, odd rows)
    ("c28-2x2-s2-wide", (2, 28, 65, 70), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    # small planes (16 x 16 outputs or fewer) take eight planes per vector: MTCNN's 3x3 / 2 ceil-mode
    # pool over 28 channels (four lanes of the last eight unused), and two images of 9 channels
    ("c28-22-3x3-s2-ceil", (1, 28, 22, 22), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("c9x2-small-pads", (2, 9, 6, 5), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 1, 0, 2]}),
    ("c3-16x16-out", (1, 3, 32, 32), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    # max pools with output rows of a vector or more read the input straight (direct_max), column
    # stride 1 or 2: one channel on a prime plane, dilations with asymmetric pads, one input row,
    # a 1 x 1 window on a 1 x 9 plane, rows under a vector on a plane over 256 outputs
    ("c1-prime-s1", (1, 1, 29, 31), {"kernel_shape": [3, 3]}),
    ("c3-s2-dil-asym", (1, 3, 23, 37), {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 3],
                                        "pads": [2, 1, 0, 1]}),
    ("c5-one-row-s2", (1, 5, 1, 40), {"kernel_shape": [1, 3], "strides": [1, 2], "pads": [0, 1, 0, 1]}),
    ("c2-1x9-1x1", (1, 2, 1, 9), {"kernel_shape": [1, 1]}),
    ("c3-tall-narrow", (2, 3, 300, 7), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 0, 1, 0]}),
]
IDS = {c[0]: c[1:] for c in CASES}


def _ort(op: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    model = single_node_model(op, {"x": x}, attrs=attrs)
    for o in model.graph.output:
        o.ClearField("type")
    return run_ort(model, {"x": x})[0]


def _numpy(kernel, x, attrs):
    with mock.patch.object(native.library, "_lib", None):
        return kernel([x], dict(attrs))[0]


@pytest.fixture
def pool_calls(native_lib, monkeypatch):
    calls = []
    real = native.pool2d

    def spy(x, op, *args, **kwargs):
        calls.append(op)
        return real(x, op, *args, **kwargs)

    monkeypatch.setattr(native, "pool2d", spy)
    return calls


@pytest.mark.parametrize("name", list(IDS))
def test_max_pool(name, pool_calls):
    xs, attrs = IDS[name]
    x = RNG.standard_normal(xs).astype(np.float32)
    got = max_pool([x], dict(attrs))[0]
    assert pool_calls == ["max"]
    assert_close(got, _numpy(max_pool, x, attrs), what=f"{name} vs numpy")
    assert_close(got, _ort("MaxPool", x, attrs), what=f"{name} vs onnxruntime")


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("name", list(IDS))
def test_average_pool(name, include_pad, pool_calls):
    xs, attrs = IDS[name]
    attrs = {**attrs, "count_include_pad": include_pad}
    x = RNG.standard_normal(xs).astype(np.float32)
    got = average_pool([x], dict(attrs))[0]
    assert pool_calls == ["avg"]
    assert_close(got, _numpy(average_pool, x, attrs), what=f"{name} vs numpy")
    if "dilations" not in attrs:  # onnxruntime's AveragePool has no dilations before opset 19
        assert_close(got, _ort("AveragePool", x, attrs), what=f"{name} vs onnxruntime")


def test_nan_and_inf_like_numpy(pool_calls):
    x = RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)
    x[0, 0, 4, 4], x[0, 1, 0, 0], x[0, 2, 8, 8] = np.nan, np.inf, -np.inf
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    for kernel in (max_pool, average_pool):
        assert_close(kernel([x], dict(attrs))[0], _numpy(kernel, x, attrs), what=kernel.__name__)
    assert pool_calls == ["max", "avg"]


def test_direct_max_pool_keeps_nans_and_infs(pool_calls):
    """Output rows of a vector or more (direct_max): a NaN in the middle of a row, in the input's last
    row (its scalar tail) and past the last whole vector of a row wins its windows, an inf too."""
    x = RNG.standard_normal((1, 3, 12, 41)).astype(np.float32)
    x[0, 0, 5, 17], x[0, 2, 11, 40], x[0, 1, 3, 38], x[0, 1, 0, 0] = np.nan, np.nan, np.nan, np.inf
    for attrs in ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, {"kernel_shape": [2, 3]}):
        got = max_pool([x], dict(attrs))[0]
        assert_close(got, _numpy(max_pool, x, attrs), what=f"direct max pooling with NaNs {attrs}")
        assert np.isnan(got).sum() == np.isnan(_numpy(max_pool, x, attrs)).sum() > 0
    assert pool_calls == ["max", "max"]


def test_direct_max_pool_window_of_padding_rows_only(pool_calls):
    """A dilated window whose taps both fall in the padding (output row 2 reads input rows -1 and 4 of a
    4-row input padded by 3) gives -inf, as the numpy kernel's -inf padded input does; the rows around
    it read input rows.  Eight planes: one band of all the rows per item, so row 2 follows row 1 in it."""
    x = RNG.standard_normal((1, 8, 4, 12)).astype(np.float32)
    attrs = {"kernel_shape": [2, 1], "dilations": [5, 1], "pads": [3, 0, 3, 0]}
    got = max_pool([x], dict(attrs))[0]
    want = _numpy(max_pool, x, attrs)
    assert got.shape == want.shape == (1, 8, 5, 12)
    assert_close(got, want, what="window of padding rows")
    assert np.isneginf(got[0, :, 2]).all() and np.isfinite(got[0, :, [0, 1, 3, 4]]).all()
    assert pool_calls == ["max"]


def test_2x2_max_pool_keeps_nans_anywhere_in_the_window(pool_calls):
    x = RNG.standard_normal((1, 2, 4, 40)).astype(np.float32)
    for j, (r, c) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):  # each corner, in vector lanes and the tail
        x[0, 0, r, 2 * j + c] = np.nan
        x[0, 1, 2 + r, 2 * (16 + j) + c] = np.nan
    x[0, 1, 0, 6] = np.inf
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    got = max_pool([x], dict(attrs))[0]
    assert_close(got, _numpy(max_pool, x, attrs), what="2x2 max pooling with NaNs")
    assert np.isnan(got[0, 0, 0, :4]).all() and np.isnan(got[0, 1, 1, 16:20]).all()
    assert pool_calls == ["max"]


def test_other_dtypes_stay_in_numpy(pool_calls):
    x = RNG.integers(0, 255, (1, 3, 8, 8)).astype(np.uint8)
    got = max_pool([x], {"kernel_shape": [2, 2], "strides": [2, 2]})[0]
    assert pool_calls == [] and got.dtype == np.uint8
