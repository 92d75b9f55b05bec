"""The native GEMM of the GEMM convs (kernels/host/gemm.c) against numpy on odd shapes, every fused
activation, bias and residual, on each vector width the CPU runs and on 1, 2 and 3 threads; the
1x1 and im2col conv kernels that call it, end to end against onnxruntime; and the fully connected
heads that take its thin and narrow paths."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from optcli import native
from optcli.native import caches
from optcli.ops import gemm
from optcli.ops.activation import apply_activation
from optcli.ops.conv import conv_1x1, conv_im2col
from optcli.ops.gemm import fully_connected
from optcli.ops.spatial import window
from tests.helpers import assert_close
from tests.native.cases import ACT_PARAMS
from tests.native.test_depthwise import ort_conv

ACTS = [None, *ACT_PARAMS]
# (M, K, N): ones, primes, shapes off every tile size (6, 8 or 12 rows, 8, 16 or 32 columns), K over
# one K block (192 floats for 32-column tiles, 384 for 16, 768 for 8) so partial sums go through the output,
# and the MobileNet family's own shapes.
SHAPES = [(1, 1, 1), (1, 7, 16), (2, 3, 5), (5, 1, 17), (7, 13, 31), (13, 29, 49), (16, 32, 33), (9, 385, 47),
          (31, 97, 196), (96, 16, 1000), (160, 961, 49), (24, 5, 3136), (1, 200, 3),
          (1, 1280, 1000), (3, 50, 70), (4, 9, 129),  # up to 4 rows: the thin path (no packing)
          # under 16 columns: the narrow path (dot products along K), N = 1..15, K = 1, K off every
          # vector width, rows off its 8-row tiles, a squeeze-excitation block, a conv head
          (1, 200, 3), (1, 1, 7), (9, 1, 15), (17, 33, 2), (8, 16, 14), (3, 5, 9), (37, 1000, 13), (2, 17, 11),
          (72, 24, 1), (1024, 576, 1), (1000, 1024, 4), (1, 4, 5), (23, 129, 6), (64, 64, 8), (15, 7, 12)]


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-threads")
def threads(request, native_lib):
    old = native_lib.set_num_threads(request.param)
    yield request.param
    native_lib.set_num_threads(old)


def product(w, x, bias=None, residual=None) -> np.ndarray:
    """The product and its sums in float64, rounded to float32 once."""
    y = np.einsum("mk,bkn->bmn", w.astype(np.float64), x.astype(np.float64))
    if bias is not None:
        y += bias[:, None]
    if residual is not None:
        y += residual
    return y.astype(np.float32)


def assert_epilogue_close(got: np.ndarray, pre: np.ndarray, act: str | None, what: str) -> None:
    """``got`` against optcli's numpy activation of the exact pre-activation ``pre``, within fp32's
    tolerance at the scale of ``pre``: a sum's rounding is relative to its own terms, so a
    saturating activation (tanh, clip, hard_sigmoid) must not judge it at the scale of its output.
    The activations are at most 1.5-Lipschitz, hence the factor."""
    a, b = ACT_PARAMS.get(act, (0.0, 0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        want = apply_activation(pre.copy(), act, a, b)
        finite = np.isfinite(pre)
        scale = float(np.abs(pre[finite]).max()) if finite.any() else 1.0
        tol = 1.5 * (1e-4 * np.abs(pre) + 1e-6 * scale)
        ok = (got == want) | (np.abs(got - want) <= tol) | (np.isnan(got) & np.isnan(want))
    assert got.shape == want.shape and ok.all(), (
        f"{what}: {np.count_nonzero(~ok)} of {ok.size} off; first at {np.argwhere(~ok)[0].tolist()}: "
        f"got {got[~ok][0]}, expected {want[~ok][0]}")


def operands(m, k, n, batch=1, seed=0):
    rng = np.random.default_rng(seed)
    # weights scaled as a trained net's are, so that outputs are O(1) and saturating activations
    # do not shrink the tolerance below the product's own fp32 rounding
    w = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    x = (rng.standard_normal((batch, k, n)) * 2).astype(np.float32)
    return w, x, rng.standard_normal(m).astype(np.float32)


@pytest.mark.parametrize("shape", [(7, 13, 31), (160, 961, 49), (24, 5, 3136)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", ["relu", "swish", None])
def test_residual_added_once_before_the_activation(shape, act, lanes, threads):
    m, k, n = shape
    w, x, bias = operands(m, k, n, batch=2)
    res = np.random.default_rng(9).standard_normal((2, m, n)).astype(np.float32) * 3
    got = native.gemm_conv(w, x, bias, act, residual=res)
    assert_epilogue_close(got, product(w, x, bias, res), act, f"{shape} {act} + residual")


# (M, K, N) for the transposed product of small planes: M a multiple of 16 (every vector width takes
# it; M = 8 and 24 only on 4 and 8 lanes), N = 16..256 (primes, 7x7, 14x14), K = 1 and off the widths,
# M an odd number of vectors (a last panel one vector wide), rows of Y.T off the 6/8/12-row tiles.
T_SHAPES = [(16, 7, 16), (32, 1, 17), (48, 961, 49), (320, 97, 49), (16, 5, 196), (160, 576, 49), (64, 3, 256),
            (8, 9, 20), (24, 33, 37), (96, 24, 196), (1280, 20, 23), (112, 160, 49)]


@pytest.mark.parametrize("shape, transposed", [(s, False) for s in SHAPES] + [(s, True) for s in T_SHAPES],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else ["plain", "transposed"][s])
def test_matches_numpy(shape, transposed, lanes, threads):
    """Every activation, with and without bias; the transposed product (on W.T's panels) with a
    residual as well."""
    m, k, n = shape
    for i, act in enumerate(ACTS):
        w, x, bias = operands(m, k, n, batch=1 + i % 2, seed=i)
        bias = bias if i % 3 else None
        res, panels = None, None
        if transposed:
            if i % 4 == 1:
                res = np.random.default_rng(i).standard_normal(x.shape[:1] + (m, n)).astype(np.float32)
            panels = native.pack_panels(w)
            assert (panels is None) == (m % lanes != 0)
        a, b = ACT_PARAMS.get(act, (0.0, 0.0))
        got = native.gemm_conv(w, x, bias, act, a, b, residual=res, panels=panels)
        assert_epilogue_close(got, product(w, x, bias, res), act, f"{shape} {act} bias={bias is not None}")


def test_transposed_product_ignores_panels_of_another_width(native_lib):
    """Panels packed for one vector width, the GEMM switched to another: the plain product."""
    w, x, bias = operands(64, 40, 49)
    panels = native.pack_panels(w)
    old = native_lib._lib.optcli_gemm_variant(-1)
    try:
        other = 4 if old != 4 else 8
        assert native_lib._lib.optcli_gemm_variant(other) == other
        got = native.gemm_conv(w, x, bias, "relu", panels=panels)
    finally:
        native_lib._lib.optcli_gemm_variant(0)
    assert_epilogue_close(got, product(w, x, bias), "relu", "panels of another width")


def test_small_plane_convs_pack_their_weight_once(native_calls):
    """The 1x1 convs on 7x7 and 14x14: the first call notes the weight, the second packs its panels
    and runs transposed, later calls find them; against onnxruntime each time."""
    rng = np.random.default_rng(6)
    for xs, ws in [((1, 160, 7, 7), (320, 160, 1, 1)), ((2, 24, 14, 14), (48, 24, 1, 1))]:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(ws[1])).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        want = np.maximum(ort_conv(x, w, b, {"kernel_shape": [1, 1]}), 0)
        for _ in range(3):
            assert_close(conv_1x1([x, w, b], {"kernel_shape": [1, 1], "activation": "relu"})[0], want)
        nr, wt = caches._DERIVED[(id(w), "conv.panels")][1]
        assert wt.size == w.size and nr == 2 * native.library._lib.optcli_gemm_variant(-1)


def test_same_result_on_any_thread_count(native_lib):
    """Items split differently, each output is computed the same way: bit-identical results."""
    w, x, bias = operands(160, 961, 49, batch=3)
    w2, x2, bias2 = operands(96, 16, 12544)
    w3, x3, bias3 = operands(1000, 1024, 3, batch=2)  # the narrow path: bands of rows by thread count
    w4, x4, bias4 = operands(320, 960, 49, batch=2)  # the transposed product
    panels = native.pack_panels(w4)
    old = native.get_num_threads()
    try:
        results = []
        for t in (1, 2, 3, 5):
            native.set_num_threads(t)
            results.append((native.gemm_conv(w, x, bias, "hard_swish"), native.gemm_conv(w2, x2, bias2, "clip", 0, 6),
                            native.gemm_conv(w3, x3, bias3, "swish"),
                            native.gemm_conv(w4, x4, bias4, "gelu", panels=panels)))
    finally:
        native.set_num_threads(old)
    for got in results[1:]:
        assert all(np.array_equal(a, c) for a, c in zip(got, results[0]))


def test_nan_and_inf_propagate_like_numpy(lanes):
    w, x, bias = operands(13, 29, 49)
    x[0, 3, 5], x[0, 7, 40] = np.nan, np.inf
    for act in ("relu", "clip", "sigmoid", None):
        a, b = ACT_PARAMS.get(act, (0.0, 0.0))
        assert_epilogue_close(native.gemm_conv(w, x, bias, act, a, b), product(w, x, bias), act, str(act))


def test_refuses_bad_arguments(native_lib):
    w, x, _ = operands(4, 3, 20)
    y = np.empty((1, 4, 20), np.float32)
    rc = native_lib._lib.optcli_gemm_conv_f32(w.ctypes.data, x.ctypes.data, None, None, y.ctypes.data, 1, 4, 3, 20,
                                              len(native.ACTIVATION_CODES), 0.0, 0.0)
    assert rc == -1  # an activation code the library does not know
    with pytest.raises(native.NativeError, match="GEMM conv failed with code -1"):
        native.library._check(rc, "GEMM conv")


# ------------------------------------------------------------------------- the conv kernels
CONVS = [  # (kernel, x shape, w shape, attrs)
    (conv_1x1, (1, 16, 56, 56), (24, 16, 1, 1), {}),
    (conv_1x1, (2, 37, 7, 7), (61, 37, 1, 1), {}),
    (conv_1x1, (1, 960, 7, 7), (320, 960, 1, 1), {}),
    (conv_1x1, (1, 5, 1, 17), (3, 5, 1, 1), {}),
    (conv_1x1, (1, 12, 19), (8, 12, 1), {}),  # 1-D
    (conv_im2col, (1, 3, 37, 41), (16, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (conv_im2col, (2, 8, 15, 13), (11, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    (conv_im2col, (1, 7, 20, 20), (5, 7, 5, 5), {"dilations": [2, 2]}),
    (conv_im2col, (1, 5, 17, 30), (13, 5, 3, 5), {"strides": [3, 2], "dilations": [2, 1], "pads": [2, 0, 1, 3]}),
    (conv_im2col, (3, 64, 14, 14), (40, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # K over one block
    (conv_im2col, (1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    (conv_im2col, (1, 16, 23, 9), (24, 16, 1, 1), {"strides": [2, 2]}),  # strided 1x1: the subsampled input's GEMM
    (conv_im2col, (2, 40, 14, 15), (64, 40, 1, 1), {"strides": [2, 3]}),  # two images, unequal strides, 7x5 out
    (conv_im2col, (1, 8, 9, 9), (16, 8, 1, 1), {"strides": [2, 2], "pads": [1, 1, 0, 0]}),  # padded: implicit
    (conv_im2col, (2, 6, 40), (7, 6, 3), {"pads": [1, 1], "strides": [2]}),  # 1-D: a 2-D conv of height 1
    (conv_im2col, (1, 28, 11, 11), (48, 28, 3, 3), {}),  # MTCNN R-net: every panel crosses output rows
    (conv_im2col, (1, 4, 12, 22), (6, 4, 3, 3), {"strides": [1, 1]}),  # 10x20 out: in-row and crossing panels
    # grouped: each group a GEMM of its own rows of W, the groups of all images spread over the pool
    (conv_im2col, (1, 8, 12, 12), (8, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    (conv_im2col, (1, 56, 28, 28), (56, 8, 3, 3), {"group": 7, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # RegNet
    (conv_im2col, (1, 368, 7, 7), (368, 8, 3, 3), {"group": 46, "pads": [1, 1, 1, 1]}),  # many narrow groups
    (conv_im2col, (2, 9, 11, 17), (12, 3, 3, 2), {"group": 3, "strides": [2, 1], "pads": [0, 1, 2, 0]}),
]


@pytest.mark.parametrize("kernel, xs, ws, attrs", CONVS, ids=[f"{c[0].__name__}-{c[1]}" for c in CONVS])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("route", ["as-picked", "gemm"])
def test_convs_match_onnxruntime(kernel, xs, ws, attrs, act, route, native_calls, monkeypatch):
    """Each conv as conv_1x1 / conv_im2col pick its kernel, and (``gemm``) with the stem conv
    turned off, so the implicit GEMM is also tested on the shapes the stem conv now takes (small
    grouped convs included)."""
    if route == "gemm":
        monkeypatch.setattr(native, "stem_fits", lambda *a: False)
        monkeypatch.setattr(native, "stem_fits_grouped", lambda *a: False)
    rng = np.random.default_rng(len(xs) + ws[0])
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    full = {"kernel_shape": list(ws[2:]), **attrs}
    if act:
        a, be = ACT_PARAMS[act]
        full.update(activation=act, activation_alpha=a, activation_beta=be)
    got = kernel([x, w, b], dict(full))[0]
    reference_attrs = {k: v for k, v in full.items() if not k.startswith("activation")}
    if kernel is conv_im2col and len(xs) == 3:  # 1-D runs as 2-D of height 1 (conv._conv1d_as_2d)
        xs, ws = (xs[0], xs[1], 1, xs[2]), (ws[0], ws[1], 1, ws[2])
        full = {**full, "kernel_shape": list(ws[2:]), "strides": [1, *full.get("strides", [1])],
                "pads": [0, full.get("pads", [0, 0])[0], 0, full.get("pads", [0, 0])[1]]}
        attrs = {**attrs, "strides": full["strides"], "pads": full["pads"]}
    implicit = kernel is conv_im2col and len(xs) == 4  # 2-D: the implicit GEMM, no column matrix
    win = window(full, xs[2:], ws[2:])
    group = attrs.get("group", 1)
    stem = implicit and (native.stem_fits(xs[1], win.kernel, win.strides, win.out) if group == 1 else
                         ws[1] > 1 and native.stem_fits_grouped(ws[1], win.kernel, win.strides))
    # a strided 1x1 conv is the plain GEMM of the subsampled input (conv._strided_pointwise)
    strided_1x1 = implicit and tuple(ws[2:]) == (1, 1) and attrs.get("group", 1) == 1 and not any(attrs.get("pads", ()))
    assert native_calls["stem"] == int(stem)
    assert (native_calls["conv_gemm"], native_calls["gemm"]) == ((0, 0) if stem else (0, 1) if strided_1x1 else
                                                                 (1, 0) if implicit else
                                                                 (0, 1 if kernel is conv_1x1 else xs[0]))
    assert native_calls["epilogue"] == 0  # the GEMM's own epilogue, no second pass
    want = ort_conv(x, w, b, reference_attrs)
    assert_epilogue_close(got, want, act, f"{kernel.__name__} {xs} {act} vs onnxruntime")


def test_fp16_storage_runs_natively_in_fp32(native_calls):
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((1, 16, 9, 9)).astype(np.float16), rng.standard_normal((8, 16, 1, 1)).astype(np.float16)
    got = conv_1x1([x, w, None], {"activation": "relu"})[0]
    assert native_calls["gemm"] == 1 and got.dtype == np.float16
    with mock.patch.object(native.library, "_lib", None):
        assert_close(got, conv_1x1([x, w, None], {"activation": "relu"})[0], "fp16")


@pytest.mark.parametrize("xs, ws", [
    ((1, 72, 1, 1), (24, 72, 1, 1)),  # squeeze-excitation: a matrix-vector product
    ((1, 576, 1, 1), (1024, 576, 1, 1)),  # MobileNetV3's conv head
    ((2, 13, 3, 5), (7, 13, 1, 1)),  # 15 positions
    ((1, 1, 2, 1), (5, 1, 1, 1)),  # K = 1
    ((3, 31, 1), (29, 31, 1)),  # 1-D, one position
], ids=["se", "head", "15-positions", "K=1", "1-D"])
@pytest.mark.parametrize("act", ["relu", "hard_sigmoid", None])
def test_narrow_convs_run_natively(xs, ws, act, native_calls):
    """Fewer than 16 positions: the native narrow path (BLAS would leave its threads spinning)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(ws[1])).astype(np.float32)  # O(1) outputs, as a trained net's
    b = rng.standard_normal(ws[0]).astype(np.float32)
    attrs = {"kernel_shape": list(ws[2:])}
    fused = {} if act is None else {"activation": act, **dict(zip(("activation_alpha", "activation_beta"),
                                                                  ACT_PARAMS[act]))}
    got = conv_1x1([x, w, b], {**attrs, **fused})[0]
    assert native_calls["gemm"] == 1
    want = ort_conv(x, w, b, attrs)
    assert_close(got, want if act is None else apply_activation(want.copy(), act, *ACT_PARAMS[act]))
    with mock.patch.object(native.library, "_lib", None):  # the numpy fallback agrees
        assert_close(got, conv_1x1([x, w, b], {**attrs, **fused})[0])


# ------------------------------------------------------------------------ FullyConnected
@pytest.mark.parametrize("xs, n, bias_shape", [((1, 1280), 1000, (1000,)), ((1, 3, 17), 40, (1, 40)),
                                               ((4, 64), 16, None), ((1, 7), 129, (129,)), ((15, 33), 1, (1,)),
                                               ((1, 1), 5, (5,)), ((2, 1, 1024), 1000, (1000,)), ((1, 64), 8, None)])
@pytest.mark.parametrize("act", ["relu", "hard_swish", None])
def test_fully_connected_heads_run_natively(xs, n, bias_shape, act, native_calls):
    """A classifier's head (up to 15 rows): the native GEMM, bias and activation fused; the thin
    path on a weight's first call, then the narrow path on the weight transposed once and kept.
    A layer small enough for numpy's one-thread matmul (gemm._SMALL_FC) runs there; with that
    path turned off every case here takes the native one, odd shapes included."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((xs[-1], n)) / np.sqrt(xs[-1])).astype(np.float32)
    b = None if bias_shape is None else rng.standard_normal(bias_shape).astype(np.float32)
    attrs = {} if act is None else {"activation": act, **dict(zip(("activation_alpha", "activation_beta"),
                                                                  ACT_PARAMS[act]))}
    pre = (x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)).astype(np.float32)
    small = w.size < gemm._SMALL_FC and x.size * n <= gemm._SMALL_FC_MACS
    got = fully_connected([x, w, b], dict(attrs))[0]
    assert_epilogue_close(got, pre, act, f"FC {xs} x {n} {act} (numpy's matmul)" if small else f"FC {xs} x {n} {act}")
    assert native_calls["gemm"] == (0 if small else 1)
    with mock.patch.object(gemm, "_SMALL_FC", 0):
        for call in ("first", "transposed"):
            got = fully_connected([x, w, b], dict(attrs))[0]
            assert got.shape == xs[:-1] + (n,)
            assert_epilogue_close(got, pre, act, f"FC {xs} x {n} {act} ({call} call)")
    assert native_calls["gemm"] == (2 if small else 3)
    assert caches._DERIVED[(id(w), "fc.T")][1] is not None


def test_fully_connected_transposes_a_weight_only_while_it_lives(native_lib):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    for _ in range(3):  # a weight made afresh per call (dequantized per run) is never transposed
        w = rng.standard_normal((32, 300)).astype(np.float32)  # above gemm._SMALL_FC: the native path
        assert_close(fully_connected([x, w, None], {})[0], x @ w)
        key = (id(w), "fc.T")
        assert caches._DERIVED[key][1] is caches._UNMADE
        del w
        assert key not in caches._DERIVED


@pytest.mark.parametrize("xs, n", [((16, 64), 32), ((3, 8, 10), 5)], ids=["16-rows", "24-rows"])
def test_fully_connected_beyond_the_narrow_path_stays_with_blas(xs, n, native_calls):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal((xs[-1], n)).astype(np.float32)
    got = fully_connected([x, w, None], {})[0]
    assert native_calls["gemm"] == 0
    assert_close(got, x @ w)


def test_implicit_gemm_with_negative_pads_matches_numpy(native_calls):
    """Negative pads (valid ONNX, refused by onnxruntime) crop the input before the columns."""
    rng = np.random.default_rng(8)
    # 5 input channels: the GEMM's (4 or fewer go to the stem conv, see test_stem.py)
    x, w = rng.standard_normal((1, 5, 11, 12)).astype(np.float32), rng.standard_normal((9, 5, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [-1, 2, 0, -2], "strides": [1, 2]}
    got = conv_im2col([x, w, None], dict(attrs))[0]
    assert native_calls["conv_gemm"] == 1
    with mock.patch.object(native.library, "_lib", None):
        assert_close(got, conv_im2col([x, w, None], dict(attrs))[0])


def test_implicit_gemm_refuses_windows_outside_the_input(native_lib):
    xp = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(native.NativeError, match="conv GEMM failed with code -1"):
        native.conv2d_gemm(xp, w, None, (1, 1), (1, 1), (4, 3))  # 4 rows of 3 taps need 6 input rows


@pytest.mark.parametrize("xs, n", [((3, 37, 129), 61), ((300, 40), 160), ((1, 98, 201), 40)])
@pytest.mark.parametrize("act", ["relu", None])
def test_products_past_blas_one_thread_size_run_on_the_pool(xs, n, act, native_calls):
    """With 2 threads or more, a FullyConnected or 2-D MatMul larger than OpenBLAS runs on one
    thread (gemm.BLAS_ONE_THREAD_MACS) goes to the native GEMM on the pool, where BLAS's own
    threads would fight the pool for the cores; at 1 thread, and below that size, BLAS keeps it."""
    rng = np.random.default_rng(xs[-1])
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((xs[-1], n)) / np.sqrt(xs[-1])).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    attrs = {} if act is None else {"activation": act}
    pre = x.astype(np.float64) @ w.astype(np.float64)
    assert int(np.prod(xs)) * n > gemm.BLAS_ONE_THREAD_MACS
    before = native.set_num_threads(2)
    try:
        got_fc = fully_connected([x, w, b], dict(attrs))[0]
        got_mm = gemm.matmul([x, w], {})[0]
        assert native_calls["gemm"] == 2
        small = gemm.matmul([x[..., :1, :], w], {})[0]  # one row: below the size, BLAS
        assert native_calls["gemm"] == 2
        native.set_num_threads(1)
        assert_close(fully_connected([x, w, b], dict(attrs))[0], got_fc)
        assert native_calls["gemm"] == 2
    finally:
        native.set_num_threads(before)
    assert got_fc.shape == got_mm.shape == xs[:-1] + (n,)
    assert_epilogue_close(got_fc, (pre + b).astype(np.float32), act, f"FC {xs} x {n} on the pool")
    assert_close(got_mm, pre.astype(np.float32))
    assert_close(small, (x[..., :1, :].astype(np.float64) @ w).astype(np.float32))
