"""The integer 1x1 convs' vpmaddubsw kernel (kernels/host/qpointwise.c) and its weight split
(optcli/native/qgemm.py: pack_quads): exact against the numpy integer reference on odd shapes, on the
plain C, AVX2, AVX-512 VNNI and AVX-VNNI paths and 1 to 3 threads, with weights and inputs chosen so that
vpmaddubsw's saturating int16 pair sums would clip without the split (the VNNI paths read the whole
weights: vpdpbusd has no int16 step)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from optcli.native import library, qgemm
from optcli.ops.qconv import multiplier, reference
from tests.native.test_qgemm import make, native_qconv

# (N, C, H, W, M, group): K = C / group is 2, 3, 4, 5 (tails of the quads; K 1 is the depthwise kernel's), 13,
# 161; columns 1, 15, 16, 17, 49 (tails of the 16-column tiles, and of the 8-column half tile); M not a
# multiple of the 4-row tile
SHAPES = {
    "K 4, one column": (1, 4, 1, 1, 3, 1),
    "K 2, 15 columns": (1, 2, 3, 5, 5, 1),
    "K 3, 16 columns": (2, 3, 4, 4, 7, 1),
    "K 5, 17 columns": (1, 5, 1, 17, 9, 1),
    "K 13, 7x7": (1, 13, 7, 7, 17, 1),
    "K 161, 7x7, 2 images": (2, 161, 7, 7, 37, 1),
    "grouped, K 6": (1, 18, 5, 9, 12, 3),
    "K 96, 56x57 (bands of columns)": (1, 96, 56, 57, 24, 1),
    # one band of columns split by rows at 2+ threads, 32 rows and more an item: each item packs the band again
    "K 160, 7x7, 320 rows (items by rows)": (1, 160, 7, 7, 320, 1),
    # a wide map of few channels: more, equal bands of columns for the threads (was a full panel and 256 columns)
    "K 8, 112x113 (equal bands)": (1, 8, 112, 113, 48, 1),
}


def case(shape, seed, x_signed=0, y_signed=0, xzp=None):
    n, c, h, w, m, g = shape
    return make((n, c, h, w, m, (1, 1), 1, [0, 0, 0, 0], 1, g), seed, x_signed, y_signed, xzp)


@pytest.fixture(params=[1, 2, 4, 5], ids=["plain-C", "AVX2", "AVX512-VNNI", "AVX-VNNI"])
def path(request, native_lib):
    if qgemm.variant(request.param) != request.param:
        pytest.skip("this CPU has no " + {2: "AVX2", 4: "AVX-512 VNNI", 5: "AVX-VNNI"}[request.param])
    yield request.param
    qgemm.variant(0)


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-threads")
def threads(request, native_lib):
    old = native_lib.set_num_threads(request.param)
    yield request.param
    native_lib.set_num_threads(old)


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def pointwise(x, w, b, attrs, whole=None):
    """The pointwise kernel called directly (the plan's routing sends convs with many residual quads to the
    GEMM instead, which the tests here must not), the weights packed for the path in use unless ``whole``
    says how."""
    whole = qgemm.variant() in (4, 5) if whole is None else whole
    m, (n, _, h, wd) = w.shape[0], x.shape
    qp = np.array([attrs[k] for k in ("x_zero_point", "y_zero_point", "qmin", "qmax", "x_signed", "y_signed")],
                  np.int32)
    blob, bias = qgemm.pack_quads(w, b, int(qp[0]), bool(qp[4]), whole=whole)
    geom = np.array([*x.shape, m, 1, 1, 1, 1, 1, 1, 0, 0, h, wd, attrs["group"]], np.int64)
    mult = multiplier(attrs, m)
    y = np.empty((n, m, h, wd), np.int8 if attrs["y_signed"] else np.uint8)
    assert library._lib.optcli_qconv2d_pointwise(ptr(x), ptr(blob), ptr(bias), ptr(mult), ptr(y), ptr(geom),
                                                 ptr(qp)) == 0
    return y


def unpack(blob, m, k):
    """pack_quads' blob back to the main and residual weights [M, 4 * Q] (int32)."""
    q = -(-k // 4)
    blob = blob[1:]  # the format

    def as_bytes(v):
        return v.astype(np.int32).view(np.int8).reshape(*v.shape, 4).astype(np.int32)

    main = as_bytes(blob[:m * q].reshape(m, q)).reshape(m, 4 * q)
    starts = blob[m * q:m * q + m + 1]
    pairs = blob[m * q + m + 1:].reshape(-1, 2)
    assert len(pairs) == starts[-1] and (np.diff(starts) >= 0).all()
    rest = np.zeros_like(main)
    for row in range(m):
        for quad, value in pairs[starts[row]:starts[row + 1]]:
            rest[row, 4 * quad:4 * quad + 4] = as_bytes(np.array([value]))[0]
    return main, rest


def pair_sums_fit_int16(v):
    """Whether no (k even, k + 1) pair of u8 x v can leave int16: its positive parts sum to 128 at most,
    its negative parts to -128 at least."""
    a, b = v[:, 0::2], v[:, 1::2]
    return bool(((np.maximum(a, 0) + np.maximum(b, 0)) * 255 <= 32767).all()
                and ((np.minimum(a, 0) + np.minimum(b, 0)) * 255 >= -32768).all())


@pytest.mark.parametrize("x_signed", [0, 1])
def test_the_split_adds_up_and_no_pair_can_clip(x_signed):
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (23, 37, 1, 1), dtype=np.int8)
    w[0, :4, 0, 0] = [127, 127, -128, -128]  # the extremes: both pairs split
    bias = rng.integers(-2**31, 2**31, 23, dtype=np.int64).astype(np.int32)  # the fold wraps
    blob, folded = qgemm.pack_quads(w, bias, 201, bool(x_signed))
    main, rest = unpack(blob, 23, 37)
    flat = np.zeros_like(main)
    flat[:, :37] = w.reshape(23, 37)
    np.testing.assert_array_equal(main + rest, flat)
    assert pair_sums_fit_int16(main) and pair_sums_fit_int16(rest)
    assert not pair_sums_fit_int16(flat)  # the case needs the split
    assert blob[0] == 0 and 0 < len(blob) - 1 - 23 * 10 - 24 < 2 * 23 * 10  # some quads, not all, carry a residual
    zp = 201 + 128 * x_signed
    want = (bias.astype(np.int64) - zp * flat.sum(axis=1)) % 2**32
    np.testing.assert_array_equal(folded.astype(np.int64) % 2**32, want)
    whole, folded_whole = qgemm.pack_quads(w, bias, 201, bool(x_signed), whole=True)
    main, rest = unpack(whole, 23, 37)
    assert whole[0] == 1 and not rest.any() and len(whole) == 1 + 23 * 10 + 24
    np.testing.assert_array_equal(main, flat)
    np.testing.assert_array_equal(folded_whole, folded)


@pytest.mark.parametrize("whole", [False, True], ids=["split", "whole"])
def test_either_format_is_exact_on_every_path(path, whole):
    """A blob packed for another path (the variant changed after the step was prepared) still gives the
    exact sums: whole weights on a path without VNNI run the plain C tile, never vpmaddubsw (which would
    clip them), split ones on the VNNI path the AVX2 tile."""
    x, w, b, attrs = case(SHAPES["K 161, 7x7, 2 images"], 4, 0, 0)
    w[:] = np.where(np.arange(w.size).reshape(w.shape) % 2, 127, -128).astype(np.int8)
    x[:] = 255
    attrs.update(y_scale=attrs["y_scale"] * 30)
    np.testing.assert_array_equal(pointwise(x, w, b, attrs, whole=whole), reference(x, w, b, attrs))


@pytest.mark.parametrize("name", list(SHAPES))
def test_equals_the_integer_reference(name, path, threads):
    for seed, signs in enumerate([(0, 0), (1, 1), (0, 1), (1, 0)]):
        x, w, b, attrs = case(SHAPES[name], seed, *signs)
        assert qgemm.route(w, (*x.shape, w.shape[0], 1, 1, 1, 1, 1, 1, 0, 0, *x.shape[2:], attrs["group"])) \
            == "pointwise"
        want = reference(x, w, b, attrs)
        np.testing.assert_array_equal(pointwise(x, w, b, attrs), want, err_msg=f"{name}, signs {signs}")
        np.testing.assert_array_equal(native_qconv(x, w, b, attrs), want, err_msg=f"{name}, signs {signs}, routed")


@pytest.mark.parametrize("xzp", [0, 255])
@pytest.mark.parametrize("x_signed", [0, 1])
def test_saturating_pairs_and_extreme_zero_points(path, threads, xzp, x_signed):
    """Inputs at the far end of their zero point against weights at 127 and -128 in runs of two: every
    pair's products sum past int16 (what vpmaddubsw alone would clip, in both directions)."""
    x, w, b, attrs = case(SHAPES["K 161, 7x7, 2 images"], 9, x_signed, 0, xzp=xzp - 128 * x_signed)
    lo = -128 if x_signed else 0
    x[:] = np.where(np.arange(x.size).reshape(x.shape) % 5 == 0, lo, lo + 255 - xzp).astype(x.dtype)
    w[:] = np.where(np.arange(w.size).reshape(w.shape) // 2 % 3 == 0, -128, 127).astype(np.int8)
    attrs.update(y_scale=attrs["y_scale"] * 30)
    want = reference(x, w, b, attrs)
    np.testing.assert_array_equal(pointwise(x, w, b, attrs), want)
    assert np.any((want != attrs["qmin"]) & (want != attrs["qmax"]))


def test_routing(native_lib):
    """1x1 convs with unit strides and no padding take the pointwise kernel unless their weights leave
    more than MAX_RESIDUAL of the quads a residual (then the GEMM was as fast)."""
    w1, w3 = np.zeros((4, 8, 1, 1), np.int8), np.zeros((4, 8, 3, 3), np.int8)

    def geom(k, s, p, o):
        return (1, 8, 6, 6, 4, k, k, s, s, 1, 1, p, p, o, o, 1)

    assert qgemm.route(w1, geom(1, 1, 0, 6)) == "pointwise"
    assert qgemm.route(w1, geom(1, 2, 0, 3)) == "gemm"  # strided: the GEMM's gather
    assert qgemm.route(w1, geom(1, 1, 1, 8)) == "gemm"  # padded
    assert qgemm.route(w3, geom(3, 1, 1, 6)) == "gemm"
    qp = (0, 0, 0, 255, 0, 0)
    if qgemm.variant(2) == 2:
        try:
            assert qgemm.prepared_weights(w1 + 64, None, geom(1, 1, 0, 6), qp)[0] == "pointwise"  # pairs of 128
            assert qgemm.prepared_weights(w1 + 65, None, geom(1, 1, 0, 6), qp)[0] == "gemm"  # every quad split
        finally:
            qgemm.variant(0)
    for vnni in (4, 5):  # no split with VNNI: every 1x1 conv takes the pointwise kernel, whole
        if qgemm.variant(vnni) == vnni:
            try:
                kind, blob, _ = qgemm.prepared_weights(w1 + 65, None, geom(1, 1, 0, 6), qp)
                assert kind == "pointwise" and blob[0] == 1
            finally:
                qgemm.variant(0)


def test_refuses_residual_lists_out_of_order_or_range(native_lib):
    """The kernel reads the residual lists' quad indices as offsets into its packed input: a list that
    runs backwards or names a quad past K ends in OPT_EINVAL, never a read out of bounds."""
    x, w, b, attrs = case(SHAPES["K 13, 7x7"], 1)
    m, q = w.shape[0], 4
    blob, bias = qgemm.pack_quads(w, b, attrs["x_zero_point"], False)
    blob = blob[1:]  # the format word, set below
    geom = np.array([*x.shape, m, 1, 1, 1, 1, 1, 1, 0, 0, 7, 7, 1], np.int64)
    qp = np.array([attrs["x_zero_point"], 0, 0, 255, 0, 0], np.int32)
    mult = np.ones(m, np.float32)
    y = np.empty((1, m, 7, 7), np.uint8)
    fn = native_lib._lib.optcli_qconv2d_pointwise

    def call(body, fmt=0, g=geom):
        whole = np.concatenate([[fmt], body]).astype(np.int32)
        return fn(ptr(x), ptr(whole), ptr(bias), ptr(mult), ptr(y), ptr(g), ptr(qp))

    assert call(blob) == 0
    assert blob[m * q + m] > 1  # the case has residuals to corrupt
    backwards = blob.copy()
    backwards[m * q + 1] = backwards[m * q + m] + 1
    past = blob.copy()
    past[m * q + m + 1] = q
    for bad in (backwards, past):
        assert call(bad) == -1
    assert call(blob, fmt=1) == -1  # "whole" weights with residual lists
    assert call(blob, fmt=2) == -1  # no such format
    padded = geom.copy()
    padded[11:15] = [1, 1, 9, 9]
    assert call(blob, g=padded) == -1
