"""The integer convolutions (kernels/host/qgemm.c, optcli.QConv's fast path) against the exact numpy
reference (equal, byte for byte) on odd shapes, on each dot-product path this CPU has (plain C, AVX2,
AVX2 with the channels-in-lanes float-sum depthwise where it has FMA, AVX-512 VNNI with the dense convs by
vpdpbusd) and on 1 and 2 threads; and
against onnxruntime's own QLinearConv (within one quantization step)."""

from __future__ import annotations

import ctypes
import os
import platform

import numpy as np
import onnx
import pytest

from optcli.native import library, qgemm
from optcli.ops.qconv import _native_call, multiplier, qconv, reference
from optcli.ops.registry import StepAttrs
from optcli.ops.spatial import window
from tests.helpers import run_ort, single_node_model

# name -> (N, C, H, W, M, (KH, KW), strides, pads [t, l, b, r], dilations, group)
CASES = {
    "one channel, 1x1 plane": (1, 1, 1, 1, 1, (1, 1), 1, [0, 0, 0, 0], 1, 1),
    "pointwise, primes": (2, 13, 7, 11, 17, (1, 1), 1, [0, 0, 0, 0], 1, 1),
    "pointwise, one column": (1, 960, 1, 1, 37, (1, 1), 1, [0, 0, 0, 0], 1, 1),
    "pointwise 7x7, K odd": (1, 161, 7, 7, 160, (1, 1), 1, [0, 0, 0, 0], 1, 1),
    "pointwise, many columns": (1, 24, 56, 57, 40, (1, 1), 1, [0, 0, 0, 0], 1, 1),
    "pointwise, stride 2": (1, 16, 9, 9, 8, (1, 1), 2, [0, 0, 0, 0], 1, 1),
    "stem 3x3 stride 2 padded": (1, 3, 31, 29, 16, (3, 3), 2, [1, 1, 1, 1], 1, 1),
    "stem 3x3 stride 2, rows of 32 (whole tiles)": (1, 3, 20, 64, 8, (3, 3), 2, [1, 1, 1, 1], 1, 1),
    "dense 3x3, rows of 32 (whole tiles)": (1, 4, 6, 32, 5, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 3x3 dilation 2, rows of 16": (2, 3, 9, 20, 4, (3, 3), 1, [0, 0, 0, 0], 2, 1),
    "dense 3x3, primes": (1, 7, 13, 5, 11, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 5x3, asymmetric pads, dilation": (2, 5, 12, 10, 6, (5, 3), 1, [2, 0, 1, 3], 2, 1),
    "grouped 3x3": (1, 12, 8, 8, 18, (3, 3), 1, [1, 1, 1, 1], 1, 3),
    # the dense vpdpbusd kernel's tails (optcli_qconv2d_dense, variant 4): K = C * KH * KW not a multiple of 4
    # (quads past K), K huge and K 2, a 1x1 output of mostly padding, stride 2 and 3 on odd widths (the padded
    # copy's phases), tiles across output rows (rows of 56, 7x7 planes), several bands of columns, rows not a
    # multiple of the 8-row tile, a 7x7 stem
    "dense 3x3, C 5 (K 45)": (1, 5, 9, 9, 10, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 3x3, K 4608, 4x4": (1, 512, 4, 4, 9, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "1x1 stride 2, K 2, odd width": (1, 2, 7, 9, 6, (1, 1), 2, [0, 0, 0, 0], 1, 1),
    "dense 3x3, 1x1 plane": (1, 8, 1, 1, 12, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 3x3 stride 2, width 33": (1, 6, 15, 33, 20, (3, 3), 2, [1, 1, 1, 1], 1, 1),
    "dense 3x3 stride 2 dilation 2, width 35, odd pads": (2, 4, 13, 35, 9, (3, 3), 2, [0, 1, 1, 0], 2, 1),
    "dense 3x3 stride 3, width 40": (1, 5, 17, 40, 8, (3, 3), 3, [1, 1, 1, 1], 1, 1),
    "dense 3x3, rows of 56": (1, 8, 5, 56, 17, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 3x3, 7x7 plane, M 33": (1, 16, 7, 7, 33, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "dense 3x3, 28x28, K 288 (bands)": (1, 32, 28, 28, 20, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "stem 7x7 stride 2, width 70": (1, 3, 30, 70, 16, (7, 7), 2, [3, 3, 3, 3], 1, 1),
    "grouped 3x3 stride 2, 6 channels a group": (2, 18, 9, 11, 12, (3, 3), 2, [1, 1, 1, 1], 1, 3),
    "depthwise 3x3": (1, 32, 15, 15, 32, (3, 3), 1, [1, 1, 1, 1], 1, 32),
    "depthwise 3x3 stride 2": (2, 19, 16, 17, 19, (3, 3), 2, [1, 1, 1, 1], 1, 19),
    "depthwise 5x5 stride 2, odd pads": (1, 7, 14, 9, 7, (5, 5), 2, [2, 1, 2, 2], 1, 7),
    "depthwise multiplier 2, dilation 2": (1, 5, 11, 11, 10, (3, 3), 1, [2, 2, 2, 2], 2, 5),
    "depthwise 1x1 spatial": (1, 3, 1, 1, 3, (3, 3), 1, [1, 1, 1, 1], 1, 3),
    "depthwise 3x3 stride 3": (1, 4, 10, 13, 4, (3, 3), 3, [0, 1, 0, 1], 1, 4),
    "depthwise 9x9, 81 taps (the GEMM's)": (1, 3, 12, 11, 3, (9, 9), 1, [4, 4, 4, 4], 1, 3),
    "depthwise 3x3, 7x7 plane (runs of 7)": (1, 5, 7, 7, 5, (3, 3), 1, [1, 1, 1, 1], 1, 5),
    "depthwise 3x3 stride 2, 67 columns": (1, 3, 5, 67, 3, (3, 3), 2, [1, 1, 1, 1], 1, 3),
    "depthwise 3x3 stride 2, 40 columns, pads right": (1, 2, 6, 40, 2, (3, 3), 2, [0, 0, 1, 1], 1, 2),
    # stride 1, 3x3, rows of 32 or more: AVX2-FMA's float sums (32-wide blocks, then runs of 8 from
    # several rows, the last of a row overlapping)
    "depthwise 3x3, 67 columns": (1, 3, 5, 67, 3, (3, 3), 1, [1, 1, 1, 1], 1, 3),
    "depthwise 3x3, 32 columns, no pads, 2 images": (2, 2, 4, 34, 2, (3, 3), 1, [0, 0, 0, 0], 1, 2),
    "depthwise 3x3, 1 channel, 40 columns": (1, 1, 5, 40, 1, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "depthwise 3x3, 39 columns, wide pads": (1, 2, 13, 30, 2, (3, 3), 1, [3, 9, 1, 2], 1, 2),
    "depthwise 5x5, 37 columns, odd pads": (1, 2, 9, 37, 2, (5, 5), 1, [2, 1, 2, 2], 1, 2),
    # the channels-in-lanes kernel (qdepthwise_lanes.c, path 3): blocks of 8 channels with a partial last one,
    # rows of 8 or more 8 columns at a time (the last 8 overlapping), narrower planes 8 pixels at a time
    # across rows, tiles of several bands (rows 300 wide), fewer than 8 pixels in all
    "depthwise 3x3, 13 channels, 14x14": (1, 13, 14, 14, 13, (3, 3), 1, [1, 1, 1, 1], 1, 13),
    "depthwise 3x3 stride 2, 9 channels, 15x15 (8x8 out)": (1, 9, 15, 15, 9, (3, 3), 2, [1, 1, 1, 1], 1, 9),
    "depthwise 5x5, 17 channels, 7x7": (2, 17, 7, 7, 17, (5, 5), 1, [2, 2, 2, 2], 1, 17),
    "depthwise 5x5 stride 2, 11 channels, 29x23": (1, 11, 29, 23, 11, (5, 5), 2, [1, 2, 2, 1], 1, 11),
    "depthwise 3x3, 16 channels, 3x3 plane": (1, 16, 3, 3, 16, (3, 3), 1, [1, 1, 1, 1], 1, 16),
    "depthwise 2x2, 23 channels, 2x3 plane, no pads": (1, 23, 2, 3, 23, (2, 2), 1, [0, 0, 0, 0], 1, 23),
    "depthwise 3x3, 3 channels, 41x5 plane (bands across rows)": (1, 3, 41, 5, 3, (3, 3), 1, [1, 0, 1, 2], 1, 3),
    "depthwise 3x3, 5 channels, 31x300 (several bands)": (1, 5, 31, 300, 5, (3, 3), 1, [1, 1, 1, 1], 1, 5),
    "depthwise 3x3 stride 2, 24x301, wide pads": (1, 6, 24, 301, 6, (3, 3), 2, [2, 3, 0, 1], 1, 6),
    "depthwise 7x7 (49 taps), dilation 2": (1, 10, 19, 17, 10, (7, 7), 1, [6, 5, 6, 7], 2, 10),
    "depthwise 3x5 stride 3": (1, 9, 16, 20, 9, (3, 5), 3, [1, 2, 1, 2], 1, 9),
    # the AVX-512 quad kernel (path 4): blocks of 16 channels (1, 13: one partial block; 17, 24, 40: a partial
    # last one), quads of 4 window columns (3x3: one a row; 5x5, 7x7: a second with 1 or 3 taps; 5x1: 1 tap;
    # dilation 2: every other column), stored 8 pixels at a time (a 1x1 plane: 1); quads by vpermb from rows of
    # bytes where the CPU has VBMI (rows under 8 wide by masked loads), dilated windows joined from widened
    # words (rows under 8 wide filled across rows; stride 2: every other column)
    "depthwise 3x3, 1 channel, 7x7": (1, 1, 7, 7, 1, (3, 3), 1, [1, 1, 1, 1], 1, 1),
    "depthwise 3x3, 17 channels, 14x14": (1, 17, 14, 14, 17, (3, 3), 1, [1, 1, 1, 1], 1, 17),
    "depthwise 3x3 stride 2, 24 channels, 15x16, 2 images": (2, 24, 15, 16, 24, (3, 3), 2, [0, 1, 1, 0], 1, 24),
    "depthwise 5x5, 40 channels, 7x7": (1, 40, 7, 7, 40, (5, 5), 1, [2, 2, 2, 2], 1, 40),
    "depthwise 5x5 stride 2, 13 channels, 1x1 plane": (1, 13, 1, 1, 13, (5, 5), 2, [2, 2, 2, 2], 1, 13),
    "depthwise 7x7, 17 channels, 9x12": (1, 17, 9, 12, 17, (7, 7), 1, [3, 3, 3, 3], 1, 17),
    "depthwise 5x1 stride 2, 19 channels": (1, 19, 11, 10, 19, (5, 1), 2, [2, 0, 2, 0], 1, 19),
    "depthwise 3x3 dilation 2, 24 channels, 13x19": (1, 24, 13, 19, 24, (3, 3), 1, [2, 2, 2, 2], 2, 24),
    "depthwise 3x3, 16 channels, 28x28, 2 images": (2, 16, 28, 28, 16, (3, 3), 1, [1, 1, 1, 1], 1, 16),
    "depthwise 3x3 stride 2, 20 channels, 7x7": (1, 20, 7, 7, 20, (3, 3), 2, [1, 1, 1, 1], 1, 20),
    "depthwise 5x5 stride 2, 18 channels, 6x9, pads right": (1, 18, 6, 9, 18, (5, 5), 2, [0, 0, 2, 3], 1, 18),
    "depthwise 3x3 dilation 2, 17 channels, 7x7": (1, 17, 7, 7, 17, (3, 3), 1, [2, 2, 2, 2], 2, 17),
    "depthwise 3x3 stride 2 dilation 2, 20 channels, 12x15": (1, 20, 12, 15, 20, (3, 3), 2, [2, 2, 2, 2], 2, 20),
    "depthwise 3x3 dilation 2, 7 channels, 2x3 plane (pixels one at a time)": (1, 7, 2, 3, 7, (3, 3), 1,
                                                                                [2, 2, 2, 2], 2, 7),
}


def make(case: tuple, seed: int, x_signed: int = 0, y_signed: int = 0, xzp: int | None = None,
         w_range: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    n, c, h, w_, m, k, s, pads, d, g = case
    rng = np.random.default_rng(seed)
    xdt = np.int8 if x_signed else np.uint8
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max + 1, (n, c, h, w_), dtype=xdt)
    w = rng.integers(-w_range, w_range, (m, c // g, *k), dtype=np.int8)
    lo, hi = (-128, 127) if y_signed else (0, 255)
    # scales spanning 1e-4..1e2 per channel (over 16 channels or more: fewer would all saturate); y_scale
    # puts a typical accumulator of the median channel mid-range
    w_scale = 10.0 ** (rng.uniform(-4, 2, m) if m >= 16 else rng.uniform(-2.5, -1.5, m))
    x_scale = 0.02
    typical = np.sqrt(c // g * k[0] * k[1]) * 70.0
    b = rng.integers(-3 * typical, 3 * typical, m).astype(np.int32)
    y_scale = float(x_scale * np.median(w_scale) * typical / 40.0)
    attrs = dict(strides=[s, s], pads=pads, dilations=[d, d], group=g, x_scale=x_scale,
                 x_zero_point=int(rng.integers(info.min, info.max + 1)) if xzp is None else xzp,
                 w_scale=[float(v) for v in w_scale], y_scale=y_scale, y_zero_point=int(rng.integers(lo, hi + 1)),
                 qmin=lo, qmax=hi, x_signed=x_signed, y_signed=y_signed)
    return x, w, b, attrs


@pytest.fixture(params=[1, 2, 3, 4, 5], ids=["plain-C", "AVX2", "AVX2-FMA-depthwise", "AVX512-VNNI", "AVX-VNNI"])
def path(request, native_lib):
    if qgemm.variant(request.param) != request.param:
        pytest.skip({2: "this CPU has no AVX2", 3: "this CPU has no AVX2 with FMA", 4: "this CPU has no AVX-512 VNNI",
                     5: "this CPU has no AVX-VNNI"}[request.param])
    yield request.param
    qgemm.variant(0)


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}-threads")
def threads(request, native_lib):
    old = native_lib.set_num_threads(request.param)
    yield request.param
    native_lib.set_num_threads(old)


def native_qconv(x, w, b, attrs):
    call = _native_call(x, w, b, attrs)
    assert call is not None, "the native path did not take the case"
    return call(x)


@pytest.mark.parametrize("name", list(CASES))
def test_equals_the_integer_reference(name, path, threads):
    for seed, signs in enumerate([(0, 0), (1, 1), (0, 1)]):
        x, w, b, attrs = make(CASES[name], seed, *signs)
        got, want = native_qconv(x, w, b, attrs), reference(x, w, b, attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"{name}, signs {signs}")
        if x.size > 8:  # the case says something: not every output at a bound
            assert np.any((want != attrs["qmin"]) & (want != attrs["qmax"]))


@pytest.mark.parametrize("name", ["dense 3x3, primes", "dense 3x3 stride 2, width 33",
                                  "depthwise 5x5, 40 channels, 7x7"])
@pytest.mark.parametrize("x_signed", [0, 1])
@pytest.mark.parametrize("xzp", [0, 255])
def test_saturating_sums_and_extreme_zero_points(path, xzp, x_signed, name):
    """x at the far end from a zero point at either end of its range (u8, or s8 read as u8 by the dense
    kernel) against weights at -128 / 127: every pair of products sums past int16 (what vpmaddubsw would
    clip), and the padding (the zero point) differs from every input by 255 (the depthwise kernels' padding
    too)."""
    x, w, b, attrs = make(CASES[name], 7, x_signed, xzp=xzp - 128 * x_signed)
    x[:] = 255 - xzp - 128 * x_signed
    w[:] = np.where(np.arange(w.size).reshape(w.shape) % 3 == 0, -128, 127).astype(np.int8)
    attrs.update(y_scale=attrs["y_scale"] * 20)
    got, want = native_qconv(x, w, b, attrs), reference(x, w, b, attrs)
    np.testing.assert_array_equal(got, want)
    assert np.abs(np.int64(255) * 127 * 2) > 32767


@pytest.mark.parametrize("name", ["pointwise, primes", "depthwise 3x3 stride 2", "dense 3x3, primes"])
@pytest.mark.parametrize("signs", [(0, 0), (0, 1), (1, 1)])
def test_requantization_past_int32(path, name, signs):
    """Multipliers of 1e8 and 1e-9 with zero points at the ends of their range: float(acc) * multiplier
    leaves int32 both ways (a conversion gives INT32_MIN there, which the vector epilogue must keep at
    the bottom after adding the zero point) or rounds to 0 or -0."""
    x, w, b, attrs = make(CASES[name], 13, *signs)
    lo, hi = (-128, 127) if signs[1] else (0, 255)
    for y_scale, zp in ((attrs["x_scale"] * 1e-8, lo), (attrs["x_scale"] * 1e-8, hi), (attrs["x_scale"] * 1e9, hi)):
        attrs.update(w_scale=[1.0] * w.shape[0], y_scale=y_scale, y_zero_point=zp)
        want = reference(x, w, b, attrs)
        np.testing.assert_array_equal(native_qconv(x, w, b, attrs), want, err_msg=f"y_scale {y_scale}, zp {zp}")
        if y_scale < 1:  # both ends reached
            assert (want == lo).any() and (want == hi).any()


@pytest.mark.parametrize("name, ch", [("depthwise 3x3, 13 channels, 14x14", 5),
                                      ("depthwise 3x3, 17 channels, 14x14", 16)])
@pytest.mark.parametrize("bias", [2**24 - 9 * 255 * 128 - 1, 2**24 - 9 * 255 * 128, 2**30])
def test_depthwise_bias_at_float32s_reach(path, bias, name, ch):
    """The channels-in-lanes kernel starts its float32 sums at the bias (less zero_point * sum(w)) where every
    partial sum stays below 2**24 (exact), and adds it in int32 otherwise: that bias just within the bound,
    at it and far past it, on one channel of a block of 8 (x at 255 against weights of 127: the largest
    sums), its multiplier putting the sum mid-range, so an output that lost or doubled the bias would sit
    at a bound.  The quad kernel (path 4) sums in int32 from the bias: the same biases on a block's channel
    and on the one channel of a last block of 16."""
    x, w, b, attrs = make(CASES[name], 17)
    x[:, ch] = 255
    w[ch] = 127
    b[ch] = bias + attrs["x_zero_point"] * int(w[ch].astype(np.int64).sum())
    scales = list(attrs["w_scale"])
    scales[ch] = 100 * attrs["y_scale"] / (attrs["x_scale"] * (bias + 9 * 255 * 127))
    attrs.update(w_scale=scales, y_zero_point=0)
    want = reference(x, w, b, attrs)
    np.testing.assert_array_equal(native_qconv(x, w, b, attrs), want)
    assert 0 < want[:, ch].min() and want[:, ch].max() < 255


def test_vnni_path_takes_every_gemm_conv_to_the_dense_kernel(native_lib):
    """On variant 4 every conv the GEMM would take (all but the depthwise and unit 1x1 ones) is prepared for
    optcli_qconv2d_dense, so the cases above run it there."""
    if qgemm.variant(4) != 4:
        pytest.skip("this CPU has no AVX-512 VNNI")
    try:
        for name, case in CASES.items():
            x, w, b, attrs = make(case, 0)
            geom, qp = geometry(x, w, attrs)
            if qgemm.route(w, geom) == "gemm":
                assert qgemm.prepared_weights(w, b, geom, qp)[0] == "dense", name
    finally:
        qgemm.variant(0)


def geometry(x, w, attrs) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(geom, qp) as the C entry points read them."""
    win = window(attrs, x.shape[2:], w.shape[2:])
    geom = (*x.shape, w.shape[0], *w.shape[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out,
            attrs["group"])
    qp = tuple(int(attrs[k]) for k in ("x_zero_point", "y_zero_point", "qmin", "qmax", "x_signed", "y_signed"))
    return tuple(int(v) for v in geom), qp


def dense(x, w, b, attrs, whole: bool) -> np.ndarray:
    """optcli_qconv2d_dense called directly with the weights packed whole (vpdpbusd's) or split (vpmaddubsw's)."""
    geom, qp = geometry(x, w, attrs)
    blob, bias = qgemm.pack_quads(w, b, qp[0], bool(qp[4]), whole=whole)
    mult = multiplier(attrs, w.shape[0])
    y = np.empty((x.shape[0], w.shape[0], *geom[13:15]), np.int8 if attrs["y_signed"] else np.uint8)
    g, p = np.array(geom, np.int64), np.array(qp, np.int32)
    assert library._lib.optcli_qconv2d_dense(*(a.ctypes.data_as(ctypes.c_void_p) for a in (x, blob, bias, mult, y, g,
                                                                                          p))) == 0
    return y


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "split"])
@pytest.mark.parametrize("name", ["dense 3x3, 7x7 plane, M 33", "dense 3x3 stride 2 dilation 2, width 35, odd pads"])
def test_dense_kernel_is_exact_in_either_format_on_every_path(path, whole, name):
    """A dense blob packed for another path (the variant changed after the step was prepared) still gives
    the exact sums: whole weights without VNNI run the plain C tile, split ones on the VNNI path the AVX2
    tile with its residuals; x at 255 against weights at 127 / -128 (pair sums past int16)."""
    x, w, b, attrs = make(CASES[name], 4)
    x[:] = np.where(np.arange(x.size).reshape(x.shape) % 7 == 0, 0, 255).astype(np.uint8)
    w[:] = np.where(np.arange(w.size).reshape(w.shape) % 2, 127, -128).astype(np.int8)
    attrs.update(y_scale=attrs["y_scale"] * 30)
    want = reference(x, w, b, attrs)
    np.testing.assert_array_equal(dense(x, w, b, attrs, whole), want)
    assert np.any((want != attrs["qmin"]) & (want != attrs["qmax"]))


def test_dense_kernel_refuses_blobs_that_do_not_fit(native_lib):
    """The dense kernel reads the blob's format word and residual lists as the pointwise one does: an unknown
    format, whole weights with residuals, a residual quad past K and a missing bias end in OPT_EINVAL, never
    a read out of bounds."""
    x, w, b, attrs = make(CASES["dense 3x3, primes"], 2)
    geom, qp = geometry(x, w, attrs)
    blob, bias = qgemm.pack_quads(w, b, qp[0], False)  # split: row 0's residuals first
    m, quads = w.shape[0], -(-w[0].size // 4)
    assert blob[1 + m * quads + m] > 0  # the case has residuals to corrupt
    mult = multiplier(attrs, m)
    y = np.empty((1, m, *geom[13:15]), np.uint8)
    g, p = np.array(geom, np.int64), np.array(qp, np.int32)
    ptr = ctypes.c_void_p

    def call(blob, bias=bias):
        args = [x, blob, bias, mult, y, g, p]
        return library._lib.optcli_qconv2d_dense(*(None if a is None else a.ctypes.data_as(ptr) for a in args))

    assert call(blob) == 0
    np.testing.assert_array_equal(y, reference(x, w, b, attrs))
    bad_format, whole_with_residuals, past_k = blob.copy(), blob.copy(), blob.copy()
    bad_format[0] = 2
    whole_with_residuals[0] = 1
    past_k[1 + m * quads + m + 1] = quads
    for bad in (bad_format, whole_with_residuals, past_k):
        assert call(bad) == -1
    assert call(blob, bias=None) == -1


def test_relu_and_clip_bounds(path):
    x, w, b, attrs = make(CASES["pointwise, primes"], 3)
    attrs.update(qmin=attrs["y_zero_point"], qmax=min(255, attrs["y_zero_point"] + 40))
    got = native_qconv(x, w, b, attrs)
    np.testing.assert_array_equal(got, reference(x, w, b, attrs))
    assert got.min() >= attrs["qmin"] and got.max() <= attrs["qmax"]


def test_step_kernel_prepares_once_and_without_bias(native_lib):
    x, w, _, attrs = make(CASES["depthwise 3x3 stride 2"], 5)
    step = StepAttrs(attrs)
    first = qconv([x, w], step)[0]
    assert "qconv" in step.memo
    np.testing.assert_array_equal(qconv([x, w], step)[0], first)
    np.testing.assert_array_equal(first, reference(x, w, None, attrs))


def qlinear_conv_ort(x, w, b, attrs) -> np.ndarray:
    onnx_attrs = {k: attrs[k] for k in ("strides", "pads", "dilations", "group")}
    inits = {"xs": np.float32(attrs["x_scale"]), "xz": np.uint8(attrs["x_zero_point"]), "w": w,
             "ws": np.asarray(attrs["w_scale"], np.float32), "wz": np.zeros(w.shape[0], np.int8),
             "ys": np.float32(attrs["y_scale"]), "yz": np.uint8(attrs["y_zero_point"]), "b": b}
    model = single_node_model("QLinearConv", {"x": x}, attrs=onnx_attrs, initializers=inits,
                              input_names=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"])
    for o in model.graph.output:
        o.CopyFrom(onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.UINT8, None))
    return run_ort(model, {"x": x})[0]


@pytest.mark.parametrize("name", list(CASES))
def test_within_one_step_of_onnxruntime_qlinearconv(name, native_lib):
    """Weights within 7 bits: onnxruntime's u8 x s8 kernels on AVX2 machines without VNNI sum pairs of
    products in saturating int16 (vpmaddubsw), so with full-range weights its own results drift from
    the exact ones (that is why its quantizer has reduce_range); ours are exact either way (above)."""
    x, w, b, attrs = make(CASES[name], 11, w_range=64)
    got = native_qconv(x, w, b, attrs)
    theirs = qlinear_conv_ort(x, w, b, attrs)
    assert np.abs(got.astype(int) - theirs.astype(int)).max() <= 1


def test_fma_depthwise_is_the_default_where_the_cpu_has_it(native_lib):
    """On x86 with AVX2 and FMA the depthwise convs run channels in lanes, summed in float32 (exact): the
    CPU's pick is path 3, or 4 where it also has AVX-512 with VNNI (the 1x1 convs by vpdpbusd), or 5 where it
    has AVX-VNNI without AVX-512; elsewhere 2 (AVX2 only) or 1."""
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    words = set(flags.split())
    want = 3 if {"avx2", "fma"} <= words else 2 if "avx2" in words else 1
    if want == 3 and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= words:
        want = 4
    elif want == 3 and "avx_vnni" in words:
        want = 5
    if platform.machine() not in ("x86_64", "AMD64"):
        want = 1
    assert qgemm.variant(0) == want
