"""The 8-bit MaxPool (kernels/host/qpool.c) an integer plan's pools run: exact against a numpy reference (the
max over the window's taps, padding never winning) on odd shapes, strides 1 to 8, dilations, asymmetric
and ceil-mode padding, u8 and s8, 1 to 3 threads; geometries that would read past the input refused."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from optcli.native import window

# (N, C, H, W), kernel, strides, dilations, pad_begin, out
CASES = {
    "ResNet stem 3x3 s2": ((1, 5, 17, 19), (3, 3), (2, 2), (1, 1), (1, 1), (9, 10)),
    "2x2 s2, no pad": ((2, 3, 8, 9), (2, 2), (2, 2), (1, 1), (0, 0), (4, 4)),
    "1 channel 1x1 plane": ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (1, 1)),
    "3x3 s1 pad 1 (same)": ((1, 4, 7, 13), (3, 3), (1, 1), (1, 1), (1, 1), (7, 13)),
    "ceil mode: last window past the end": ((1, 2, 6, 7), (3, 3), (2, 2), (1, 1), (0, 0), (3, 3)),
    "dilated 3x2": ((1, 3, 11, 12), (3, 2), (1, 2), (2, 3), (2, 1), (7, 6)),
    "stride 3 and 5": ((1, 2, 16, 23), (4, 5), (3, 5), (1, 1), (2, 0), (6, 4)),
    "stride 8 (the largest)": ((1, 2, 9, 33), (8, 8), (8, 8), (1, 1), (0, 0), (1, 4)),
    "window wider than the row": ((1, 2, 3, 2), (2, 5), (1, 1), (1, 1), (0, 2), (2, 2)),
}


def reference(x: np.ndarray, kernel, strides, dilations, pad_begin, out) -> np.ndarray:
    """The max over the taps that land in the input; the dtype's lowest value where none does."""
    n, c, h, w = x.shape
    lo = np.iinfo(x.dtype).min
    y = np.full((n, c, *out), lo, x.dtype)
    for oh in range(out[0]):
        for ow in range(out[1]):
            for kh in range(kernel[0]):
                for kw in range(kernel[1]):
                    ih = oh * strides[0] - pad_begin[0] + kh * dilations[0]
                    iw = ow * strides[1] - pad_begin[1] + kw * dilations[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        y[:, :, oh, ow] = np.maximum(y[:, :, oh, ow], x[:, :, ih, iw])
    return y


@pytest.fixture(params=[1, 3], ids=lambda n: f"{n}-threads")
def threads(request, native_lib):
    old = native_lib.set_num_threads(request.param)
    yield request.param
    native_lib.set_num_threads(old)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("name", list(CASES))
def test_equals_the_reference(name, dtype, threads):
    shape, *geom = CASES[name]
    info = np.iinfo(dtype)
    x = np.random.default_rng(7).integers(info.min, info.max + 1, shape, dtype=dtype)
    x.flat[::11] = info.min  # the lowest value in real positions: a max that must not be told from padding
    got = window.prepared_maxpool2d_q8(shape, dtype, *geom)(x)
    np.testing.assert_array_equal(got, reference(x, *geom))


def test_refuses_geometry_that_would_read_past_the_input(native_lib):
    x = np.zeros((1, 2, 6, 6), np.uint8)
    y = np.zeros((1, 2, 8, 8), np.uint8)
    fn = native_lib._lib.optcli_maxpool2d_q8

    def call(*geom):
        g = np.array([1, 2, 6, 6, *geom], np.int64)
        return fn(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p),
                  g.ctypes.data_as(ctypes.c_void_p), 0)

    assert call(3, 3, 2, 2, 1, 1, 1, 1, 3, 3) == 0
    assert call(3, 3, 2, 2, 1, 1, 1, 1, 5, 3) == -1  # a fifth row of windows would start past the input
    assert call(3, 3, 9, 9, 1, 1, 0, 0, 1, 1) == -1  # stride 9: past the column phases the kernel keeps
    assert call(0, 3, 1, 1, 1, 1, 0, 0, 3, 3) == -1
    assert call(3, 3, 1, 1, 1, 1, -1, 0, 3, 3) == -1
