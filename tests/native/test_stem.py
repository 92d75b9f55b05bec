"""The native stem conv (kernels/host/stem.c: one group, few input channels) against a float64 reference
conv and onnxruntime: odd shapes, every stride, dilation, padding and fused activation, each vector
width the CPU runs, any thread count; and the routing of conv_im2col to it."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from optcli import native
from optcli.ops.conv import conv_im2col
from optcli.ops.spatial import pad_input, window
from tests.native.cases import ACT_PARAMS, GROUPED_STEM_CASES, STEM_CASES, make_case
from tests.native.test_depthwise import ort_conv
from tests.native.test_gemm import assert_epilogue_close

CASES = {c[0]: c[1:] for c in STEM_CASES}
ORT_REFUSES = {"c3-neg-pads"}  # negative pads: valid ONNX, onnxruntime rejects them


def make(name, seed=0, activation=None, bias=True):
    xs, ws, attrs = CASES[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    full = {"kernel_shape": list(ws[2:]), **attrs}
    if activation:
        a, be = ACT_PARAMS[activation]
        full.update(activation=activation, activation_alpha=a, activation_beta=be)
    return x, w, b, full


def reference(x, w, b, attrs) -> np.ndarray:
    """The conv in float64 from its definition (tap by tap over the padded input), rounded once."""
    win = window(attrs, x.shape[2:], w.shape[2:])
    xp = pad_input(x.astype(np.float64), win)
    (sh, sw), (dh, dw), (oh, ow) = win.strides, win.dilations, win.out
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for kh in range(w.shape[2]):
        for kw in range(w.shape[3]):
            tap = xp[:, :, kh * dh:kh * dh + (oh - 1) * sh + 1:sh, kw * dw:kw * dw + (ow - 1) * sw + 1:sw]
            y += np.einsum("mc,nchw->nmhw", w[:, :, kh, kw].astype(np.float64), tap)
    if b is not None:
        y += b[None, :, None, None]
    return y.astype(np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_and_onnxruntime(name, lanes, native_calls):  # lanes: the GEMM's, which it follows
    x, w, b, attrs = make(name, bias=name != "c3-1x1-kernel")
    got = conv_im2col([x, w, b], dict(attrs))[0]
    assert native_calls["stem"] == 1 and native_calls["conv_gemm"] == 0
    assert got.dtype == np.float32 and got.flags.c_contiguous
    assert_epilogue_close(got, reference(x, w, b, attrs), None, f"{name} vs float64")
    with mock.patch.object(native.library, "_lib", None):  # the numpy kernel, as where the library is absent
        assert_epilogue_close(got, conv_im2col([x, w, b], dict(attrs))[0], None, f"{name} vs numpy")
    if name not in ORT_REFUSES:
        assert_epilogue_close(got, ort_conv(x, w, b, attrs), None, f"{name} vs onnxruntime")


@pytest.mark.parametrize("activation", list(ACT_PARAMS))
@pytest.mark.parametrize("name", ["c3-s2-odd", "c2-s3-prime", "c4-wide-pads", "c3-128-face"])
def test_fused_activations(name, activation, native_calls):
    x, w, b, attrs = make(name, seed=1, activation=activation)
    x *= 3  # reach the saturated parts of clip, hard_sigmoid, sigmoid and tanh
    got = conv_im2col([x, w, b], dict(attrs))[0]
    assert native_calls["stem"] == 1
    plain = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    assert_epilogue_close(got, reference(x, w, b, plain), activation, f"{name} {activation} vs float64")
    assert_epilogue_close(got, ort_conv(x, w, b, plain), activation, f"{name} {activation} vs onnxruntime")


def test_same_result_on_any_thread_count(native_lib):
    """Items split differently, each output is computed the same way: bit-identical results."""
    cases = [make("c3-224-mnv3", activation="hard_swish"), make("c3-128-face", activation="relu"),
             make("c2-s3-prime")]
    old = native.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 5):
            native.set_num_threads(n)
            results.append([conv_im2col([x, w, b], dict(a))[0] for x, w, b, a in cases])
    finally:
        native.set_num_threads(old)
    for r in results[1:]:
        assert all(np.array_equal(a, c) for a, c in zip(r, results[0]))


def test_fp16_storage_and_a_view_run_natively_in_fp32(native_calls):
    x, w, b, attrs = make("c3-s2-odd", activation="relu")
    view = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values, not C-contiguous
    assert_epilogue_close(conv_im2col([view, w, b], dict(attrs))[0], reference(x, w, b, attrs), "relu", "view")
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
    got = conv_im2col([x16, w16, b16], dict(attrs))[0]
    assert native_calls["stem"] == 2 and got.dtype == np.float16
    with mock.patch.object(native.library, "_lib", None):
        want = conv_im2col([x16, w16, b16], dict(attrs))[0]
    assert np.allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 5, 12, 12), (8, 5, 3, 3), {"pads": [1, 1, 1, 1]}),  # 5 input channels, rows of 12: the implicit GEMM
    ((1, 65, 16, 16), (8, 65, 3, 3), {"pads": [1, 1, 1, 1]}),  # over 576 taps
    ((1, 24, 16, 16), (8, 24, 5, 5), {"pads": [2, 2, 2, 2]}),  # 600 taps
    ((1, 32, 16, 16), (8, 32, 1, 1), {"strides": [2, 2]}),  # a strided 1x1: the GEMM of the subsampled input
    ((1, 256, 12, 12), (8, 128, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # 1152 taps a group
], ids=["c5-narrow", "c65", "c24-5x5", "1x1-s2", "grouped-wide"])
def test_other_convs_stay_with_the_gemm(xs, ws, attrs, native_calls):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    full = {"kernel_shape": list(ws[2:]), **attrs}
    got = conv_im2col([x, w, None], dict(full))[0]
    # a strided 1x1 is the plain GEMM of the subsampled input (conv._strided_pointwise)
    assert native_calls["stem"] == 0 and native_calls["conv_gemm" if ws[2:] != (1, 1) else "gemm"] == 1
    assert_epilogue_close(got, ort_conv(x, w, None, full), None, "vs onnxruntime")


def test_nan_and_inf_propagate(native_calls):
    x, w, b, attrs = make("c3-s2-odd", activation="relu")
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 0, 0] = np.inf
    got = conv_im2col([x, w, b], dict(attrs))[0]
    with mock.patch.object(native.library, "_lib", None):
        want = conv_im2col([x, w, b], dict(attrs))[0]
    assert native_calls["stem"] == 1
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert np.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4)


def test_refuses_bad_arguments(native_lib):
    x, w = np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    y = np.empty((1, 4, 3, 3), np.float32)
    geom = np.array([1, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 0, 0, 3, 3], np.int64)
    lib = native_lib._lib
    assert lib.optcli_stem_conv2d_f32(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, geom.ctypes.data, 0, 0.0,
                                      0.0) == 0
    assert lib.optcli_stem_conv2d_f32(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, geom.ctypes.data,
                                      len(native.ACTIVATION_CODES), 0.0, 0.0) == -1
    geom[7] = 0  # stride 0
    assert lib.optcli_stem_conv2d_f32(x.ctypes.data, w.ctypes.data, None, y.ctypes.data, geom.ctypes.data, 0, 0.0,
                                      0.0) == -1


def grouped_reference(x, w, b, attrs) -> np.ndarray:
    """The float64 reference conv one group at a time."""
    g = int(attrs["group"])
    cg, mg = x.shape[1] // g, w.shape[0] // g
    dense = {k: v for k, v in attrs.items() if k != "group"}
    return np.concatenate([reference(x[:, i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg],
                                     None if b is None else b[i * mg:(i + 1) * mg], dense) for i in range(g)], axis=1)


@pytest.mark.parametrize("case", GROUPED_STEM_CASES, ids=[c[0] for c in GROUPED_STEM_CASES])
def test_grouped_convs_of_small_groups(case, native_calls):
    """Grouped convs of few channels a group (RegNet's 8) run in the grouped stem conv, each image's
    groups as images of their own with their own weights: against the float64 reference, the numpy
    kernel and onnxruntime, with an activation, uneven pads, dilation, M / G != C / G, 2 images."""
    i = GROUPED_STEM_CASES.index(case)
    name, xs, ws, attrs = case
    act = [None, *ACT_PARAMS][i % (1 + len(ACT_PARAMS))]
    x, w, b, full = make_case(xs, ws, attrs, seed=i, activation=act, bias=i % 3 != 1)
    w /= np.sqrt(np.prod(ws[1:]))
    got = conv_im2col([x, w, b], dict(full))[0]
    assert native_calls["stem"] == 1 and native_calls["conv_gemm"] == 0
    plain = {k: v for k, v in full.items() if not k.startswith("activation")}
    assert_epilogue_close(got, grouped_reference(x, w, b, plain), act, f"{name} vs float64")
    with mock.patch.object(native.library, "_lib", None):
        assert_epilogue_close(got, conv_im2col([x, w, b], dict(full))[0], None, f"{name} vs numpy")
    assert_epilogue_close(got, ort_conv(x, w, b, plain), act, f"{name} vs onnxruntime")


def test_grouped_refuses_groups_that_do_not_divide(native_lib):
    x, w = np.zeros((1, 6, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    y = np.empty((1, 4, 3, 3), np.float32)
    geom = np.array([1, 6, 5, 5, 4, 3, 3, 1, 1, 1, 1, 0, 0, 3, 3], np.int64)
    fn = native_lib._lib.optcli_stem_conv2d_grouped_f32
    args = (x.ctypes.data, w.ctypes.data, None, y.ctypes.data, geom.ctypes.data)
    assert fn(*args, 2, 0, 0.0, 0.0) == 0
    for groups in (0, -1, 4, 5):  # 4 does not divide C = 6, 5 divides neither
        assert fn(*args, groups, 0, 0.0, 0.0) != 0, groups

