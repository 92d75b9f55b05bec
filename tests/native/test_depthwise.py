"""The native depthwise conv against the numpy kernel and onnxruntime: odd shapes, every stride,
dilation, padding and fused activation, fp32 (and fp16 storage through fp32)."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.ops.conv import _native_depthwise, conv_depthwise
from optcli.ops.spatial import window
from tests.helpers import assert_close, gelu_ref, run_ort, single_node_model
from tests.native.cases import ACT_PARAMS, DEPTHWISE_CASES, make_case, numpy_depthwise

CASES = {c[0]: c[1:] for c in DEPTHWISE_CASES}
ORT_REFUSES = {"c5-1x5-neg-pad"}  # negative pads: valid ONNX, onnxruntime rejects them


def _sig(y):
    return 1.0 / (1.0 + np.exp(-y))


def act_ref(y: np.ndarray, name: str) -> np.ndarray:
    """The activation in float64, written independently of optcli's epilogue."""
    a, b = ACT_PARAMS[name]
    y = y.astype(np.float64)
    return {
        "relu": lambda: np.maximum(y, 0), "clip": lambda: np.clip(y, a, b),
        "leaky_relu": lambda: np.where(y >= 0, y, a * y), "sigmoid": lambda: _sig(y), "tanh": lambda: np.tanh(y),
        "hard_sigmoid": lambda: np.clip(a * y + b, 0, 1), "hard_swish": lambda: y * np.clip(y / 6 + 0.5, 0, 1),
        "swish": lambda: y * _sig(y), "gelu": lambda: gelu_ref(y), "gelu_tanh": lambda: gelu_ref(y, tanh=True),
    }[name]()


def ort_conv(x, w, b, attrs) -> np.ndarray:
    onnx_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    inits = {"w": w} if b is None else {"w": w, "b": b}
    model = single_node_model("Conv", {"x": x}, attrs=onnx_attrs, initializers=inits)
    for o in model.graph.output:
        o.ClearField("type")
    return run_ort(model, {"x": x})[0]


def depthwise(x, w, b, attrs) -> np.ndarray:
    """The depthwise kernel; one input channel (group 1, which kernel selection gives im2col) goes
    to the native library directly, the way conv_depthwise calls it."""
    if attrs["group"] > 1:
        return conv_depthwise([x, w, b], dict(attrs))[0]
    win = window(attrs, x.shape[2:], w.shape[2:])
    return _native_depthwise(x, w, b, attrs, win)[0]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_numpy_and_onnxruntime(name, native_calls):
    x, w, b, attrs = make_case(*CASES[name])
    got = depthwise(x, w, b, attrs)
    assert native_calls["depthwise"] == 1
    assert got.dtype == np.float32 and got.flags.c_contiguous
    assert_close(got, numpy_depthwise(x, w, b, attrs), what=f"{name} vs numpy")
    if name not in ORT_REFUSES:
        assert_close(got, ort_conv(x, w, b, attrs), what=f"{name} vs onnxruntime")


@pytest.mark.parametrize("activation", list(ACT_PARAMS))
@pytest.mark.parametrize("name", ["c1-1x1-pad1", "c7-s2-odd", "c13-5x5-s1", "c5-dil3-s2", "c3-mult2", "c7-1d"])
def test_fused_activations(name, activation, native_calls):
    x, w, b, attrs = make_case(*CASES[name], seed=1, activation=activation)
    x *= 3  # reach the saturated parts of clip, hard_sigmoid, sigmoid and tanh
    got = depthwise(x, w, b, attrs)
    assert native_calls["depthwise"] == 1
    assert_close(got, numpy_depthwise(x, w, b, attrs), what=f"{name} {activation} vs numpy")
    assert_close(got, act_ref(ort_conv(x, w, b, attrs), activation), what=f"{name} {activation} vs onnxruntime")


def test_without_bias_and_from_a_view(native_calls):
    x, w, _, attrs = make_case(*CASES["c17-5x5-s2"], bias=False)
    view = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values, not C-contiguous
    got = conv_depthwise([view, w, None], dict(attrs))[0]
    assert native_calls["depthwise"] == 1
    assert_close(got, numpy_depthwise(x, w, None, attrs))


def test_same_result_on_any_thread_count(native_lib):
    """Items split differently, each output is computed the same way: bit-identical results."""
    x, w, b, attrs = make_case(*CASES["c1-large"], activation="hard_swish")
    xs, ws, bs, attrs2 = make_case(*CASES["c144-56"], activation="swish")
    old = native.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 5):
            native.set_num_threads(n)
            results.append((depthwise(x, w, b, attrs), depthwise(xs, ws, bs, attrs2)))
    finally:
        native.set_num_threads(old)
    for a, c in results[1:]:
        assert np.array_equal(a, results[0][0]) and np.array_equal(c, results[0][1])


def test_fp16_storage_runs_natively_in_fp32(native_calls):
    x, w, b, attrs = make_case(*CASES["c13-5x5-s1"], activation="relu")
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
    got = conv_depthwise([x16, w16, b16], dict(attrs))[0]
    assert native_calls["depthwise"] == 1 and got.dtype == np.float16
    assert_close(got, numpy_depthwise(x16, w16, b16, attrs), "fp16")


def test_fp64_stays_in_numpy(native_calls):
    x, w, b, attrs = make_case(*CASES["c3-s2"])
    got = conv_depthwise([x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)], dict(attrs))[0]
    assert native_calls["depthwise"] == 0 and got.dtype == np.float64
    assert_close(got, numpy_depthwise(x, w, b, attrs))


def test_nan_and_inf_propagate_like_numpy(native_calls):
    x, w, b, attrs = make_case(*CASES["c3-s2"], activation="relu")
    x[0, 0, 4, 4] = np.nan
    x[0, 1, 0, 0] = np.inf
    got = conv_depthwise([x, w, b], dict(attrs))[0]
    assert native_calls["depthwise"] == 1
    assert_close(got, numpy_depthwise(x, w, b, attrs))


def test_refuses_bad_geometry(native_lib):
    x = np.zeros((1, 3, 4, 4), np.float32)
    w = np.zeros((4, 1, 3, 3), np.float32)  # 4 output channels for 3 inputs: not depthwise
    with pytest.raises(native.NativeError, match="depthwise conv failed with code -1"):
        native.depthwise_conv2d(x, w, None, (1, 1), (1, 1), (1, 1), (4, 4))


def test_absurd_windows_stay_in_numpy(native_calls):
    x, w, b, attrs = make_case((1, 3, 40, 40), (3, 1, 3, 3), {"strides": [20, 20]})
    got = conv_depthwise([x, w, b], dict(attrs))[0]
    assert native_calls["depthwise"] == 0
    assert_close(got, numpy_depthwise(x, w, b, attrs))
