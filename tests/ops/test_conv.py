"""Conv / ConvTranspose kernels: every variant against onnxruntime, fused epilogues, variant choice."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.activation_codes import ACTIVATIONS
from optcli.ir import Graph, Node, Value
from optcli.ops import kernels_for
from tests.helpers import assert_close, gelu_ref, run_ort, run_variants, single_node_model

RNG = np.random.default_rng(0)

# Epilogue parameters per activation, and the numpy composition they must equal.
ACT_PARAMS = {"clip": (-0.5, 0.7), "leaky_relu": (0.1, 0.0), "hard_sigmoid": (0.2, 0.5)}


def _sig(y: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-y.astype(np.float64)))


def act_ref(y: np.ndarray, name: str) -> np.ndarray:
    a, b = ACT_PARAMS.get(name, (0.0, 0.0))
    y = y.astype(np.float64)
    return {
        "relu": lambda: np.maximum(y, 0),
        "clip": lambda: np.clip(y, a, b),
        "leaky_relu": lambda: np.where(y >= 0, y, a * y),
        "sigmoid": lambda: _sig(y),
        "tanh": lambda: np.tanh(y),
        "hard_sigmoid": lambda: np.clip(a * y + b, 0, 1),
        "hard_swish": lambda: y * np.clip(y / 6 + 0.5, 0, 1),
        "swish": lambda: y * _sig(y),
        "gelu": lambda: gelu_ref(y),
        "gelu_tanh": lambda: gelu_ref(y, tanh=True),
    }[name]()


def act_attrs(name: str) -> dict:
    a, b = ACT_PARAMS.get(name, (0.0, 0.0))
    return {"activation": name, "activation_alpha": a, "activation_beta": b}


def ort_ref(op: str, x: np.ndarray, attrs: dict, inits: dict) -> np.ndarray:
    model = single_node_model(op, {"x": x}, attrs=attrs, initializers=inits)
    for o in model.graph.output:
        o.ClearField("type")  # ORT rejects the UNDEFINED element type
    return run_ort(model, {"x": x})[0]


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES = [
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((1, 3, 10, 11), (5, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 10, 11), (5, 3, 4, 4), {"strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 10, 11), (5, 3, 3, 2), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 12, 12), (4, 3, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}),
    # depthwise: multiplier 1 and 2, strides, dilations, auto_pad
    ((2, 8, 13, 12), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((1, 6, 15, 14), (6, 1, 5, 5), {"group": 6, "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 4, 11, 9), (8, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 5, 9, 9), (5, 1, 3, 3), {"group": 5, "strides": [3, 3]}),
    ((1, 4, 7, 8), (4, 1, 3, 2), {"group": 4, "pads": [0, 1, 2, 0], "auto_pad": "NOTSET"}),
    # pointwise
    ((2, 16, 7, 5), (8, 16, 1, 1), {}),
    ((1, 8, 9, 9), (4, 8, 1, 1), {"strides": [2, 2]}),
    # a window of the whole height and one column (a pointwise conv of [N, C * H, 1, W]), and near misses
    ((2, 5, 4, 7), (3, 5, 4, 1), {}),
    ((1, 7, 3, 5), (2, 7, 3, 1), {"strides": [2, 1], "dilations": [1, 3]}),
    ((1, 1, 1, 9), (4, 1, 1, 1), {"strides": [5, 1]}),
    ((1, 4, 4, 6), (3, 4, 4, 1), {"strides": [1, 2]}),
    ((1, 4, 4, 6), (3, 4, 4, 1), {"pads": [0, 1, 0, 1]}),
    ((1, 4, 4, 6), (3, 4, 2, 1), {}),
    # 1-D and 3-D
    ((2, 3, 17), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    ((1, 4, 20), (4, 1, 5), {"group": 4, "dilations": [3], "pads": [2, 2]}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 1, 2), {"pads": [1, 0, 1, 1, 0, 0], "strides": [1, 2, 1]}),
    ((1, 3, 5, 6, 7), (3, 1, 3, 3, 3), {"group": 3, "pads": [1, 1, 1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_variants_match_ort(xs, ws, attrs, bias):
    x, w = _rand(*xs), _rand(*ws)
    inits = {"w": w, **({"b": _rand(ws[0])} if bias else {})}
    expected = ort_ref("Conv", x, attrs, inits)
    x.setflags(write=False)
    for variant, out in run_variants("Conv", [x, w, inits.get("b")], attrs).items():
        assert_close(out[0], expected, what=f"Conv[{variant}] {xs} {ws} {attrs}")
        assert out[0].dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_keeps_dtype(dtype):
    x, w, b = _rand(1, 4, 8, 8), _rand(4, 1, 3, 3), _rand(4)
    ref = run_variants("Conv", [x, w, b], {"group": 4})["im2col"][0]
    for variant, out in run_variants("Conv", [x.astype(dtype), w.astype(dtype), b.astype(dtype)],
                                     {"group": 4}).items():
        assert out[0].dtype == dtype
        assert_close(out[0], ref, "fp16" if dtype == np.float16 else "fp32", what=variant)


EPILOGUE_CASES = [
    ((1, 6, 9, 9), (4, 6, 1, 1), {}),
    ((2, 6, 4, 9), (5, 6, 4, 1), {}),
    ((1, 6, 9, 9), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((1, 6, 9, 9), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
]


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_conv_epilogue(name):
    for xs, ws, attrs in EPILOGUE_CASES:
        x, w, b = _rand(*xs), _rand(*ws), _rand(ws[0])
        plain = run_variants("Conv", [x, w, None], attrs)["im2col"][0]
        expected = act_ref(plain + b.reshape(1, -1, 1, 1), name)
        for variant, out in run_variants("Conv", [x, w, b], {**attrs, **act_attrs(name)}).items():
            assert_close(out[0], expected, what=f"Conv[{variant}]+{name}")


def test_a_full_height_window_runs_as_a_pointwise_conv(monkeypatch):
    """The [H, 1] window over an H-row input goes to the 1x1 path on the input seen as [N, C * H, 1, W]
    (no columns gathered); a padded one, or one with a column stride, does not."""
    from optcli.ops import conv
    from optcli.ops.registry import StepAttrs

    seen = []
    real = conv.conv_1x1

    def spy(inputs, attrs):
        seen.append(inputs[0].shape)
        return real(inputs, attrs)

    monkeypatch.setattr(conv, "conv_1x1", spy)
    x, w, b = _rand(2, 5, 4, 7), _rand(3, 5, 4, 1), _rand(3)
    attrs = StepAttrs({"kernel_shape": [4, 1], **act_attrs("relu")})
    for _ in range(2):  # (the second call through the step's memo)
        y = conv.conv_im2col([x, w, b], attrs)[0]
    assert seen == [(2, 20, 1, 7)] * 2
    assert_close(y, np.maximum(np.einsum("mchk,nchw->nmw", w, x)[:, :, None, :] + b.reshape(1, 3, 1, 1), 0))
    seen.clear()
    conv.conv_im2col([x, w, b], {"kernel_shape": [4, 1], "pads": [0, 1, 0, 1]})
    conv.conv_im2col([x, w, b], {"kernel_shape": [4, 1], "strides": [1, 2]})
    assert seen == []


def _choose(op: str, attrs: dict, wshape: tuple | None, as_initializer: bool = True) -> str:
    """The variant kernel selection would pick: highest priority whose ``applies`` holds."""
    inits = {"w": np.zeros(wshape, np.float32)} if wshape and as_initializer else {}
    values = {"w": Value("w", "float32", wshape)} if wshape and not as_initializer else {}
    node = Node(op, ["x", "w"], ["y"], attrs=attrs)
    graph = Graph("g", [node], [Value("x")], [Value("y")], initializers=inits, values=values)
    for k in kernels_for(op):
        if k.applies is None or k.applies(node, graph):
            return k.variant
    raise AssertionError("no variant applies")


def test_conv_variant_choice():
    assert _choose("Conv", {}, (8, 16, 1, 1)) == "1x1"
    assert _choose("Conv", {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0]}, (8, 16, 1, 1)) == "1x1"
    assert _choose("Conv", {}, (8, 16, 1, 1), as_initializer=False) == "1x1"  # shape from value info
    assert _choose("Conv", {"strides": [2, 2]}, (8, 16, 1, 1)) == "im2col"
    assert _choose("Conv", {"pads": [1, 1, 1, 1]}, (8, 16, 1, 1)) == "im2col"
    assert _choose("Conv", {"group": 2}, (8, 8, 1, 1)) == "im2col"
    assert _choose("Conv", {"group": 16}, (16, 1, 3, 3)) == "depthwise"
    assert _choose("Conv", {"group": 16, "strides": [2, 2]}, (32, 1, 3, 3)) == "depthwise"
    assert _choose("Conv", {"group": 4}, (16, 2, 3, 3)) == "im2col"
    assert _choose("Conv", {}, (16, 1, 3, 3)) == "im2col"  # one input channel, one group
    assert _choose("Conv", {}, (16, 8, 3, 3)) == "im2col"
    assert _choose("Conv", {"group": 16}, None) == "im2col"  # weight unknown


CONVT_CASES = [
    ((1, 3, 4, 5), (3, 2, 3, 3), {}),
    ((2, 4, 5, 4), (4, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((1, 4, 3, 5), (4, 1, 3, 3), {"group": 2, "strides": [2, 1], "dilations": [2, 2]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 2, 4, 5), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 2, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 7), (3, 2, 4), {"strides": [3], "pads": [1, 2]}),
    ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 2]}),
    # taps that never overlap (kernel == stride): written once each, no zeroed buffer
    ((1, 16, 5, 6), (16, 8, 2, 2), {"strides": [2, 2]}),  # a text detector's upsampling head
    ((2, 3, 4, 5), (3, 2, 3, 2), {"strides": [3, 2], "pads": [1, 0, 2, 1]}),  # cropped
    ((1, 4, 3, 3), (4, 2, 2, 2), {"strides": [2, 2], "output_padding": [1, 1]}),  # padded past the taps
    ((1, 4, 3, 3), (4, 1, 2, 2), {"strides": [2, 2], "group": 2}),  # grouped: BLAS products
    ((2, 3, 7), (3, 2, 4), {"strides": [4]}),  # 1-D
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
def test_conv_transpose_matches_ort(xs, ws, attrs):
    x, w = _rand(*xs), _rand(*ws)
    b = _rand(ws[1] * int(attrs.get("group", 1)))
    expected = ort_ref("ConvTranspose", x, attrs, {"w": w, "b": b})
    for variant, out in run_variants("ConvTranspose", [x, w, b], attrs).items():
        assert_close(out[0], expected, what=f"ConvTranspose[{variant}] {attrs}")


def test_non_overlapping_taps_are_recognised(monkeypatch):
    from optcli.ops import conv

    assert conv.taps_never_overlap((2, 2), [2, 2], [1, 1]) and conv.taps_never_overlap((4,), [4], [1])
    assert not conv.taps_never_overlap((3, 3), [2, 2], [1, 1]) and not conv.taps_never_overlap((2, 2), [2, 2], [2, 1])
    # the kernel takes that path for such a model: no zeroed buffer is made
    zeros = []
    monkeypatch.setattr(conv.np, "zeros", lambda *a, **k: zeros.append(a) or np.zeros(*a, **k))
    x, w = _rand(1, 4, 3, 5), _rand(4, 2, 2, 2)
    run_variants("ConvTranspose", [x, w, _rand(2)], {"strides": [2, 2]})
    assert not zeros


def test_conv_transpose_epilogue():
    x, w, b = _rand(1, 3, 4, 4), _rand(3, 2, 3, 3), _rand(2)
    plain = run_variants("ConvTranspose", [x, w, b], {"strides": [2, 2]})["col2im"][0]
    for name in ACTIVATIONS:
        out = run_variants("ConvTranspose", [x, w, b], {"strides": [2, 2], **act_attrs(name)})["col2im"][0]
        assert_close(out, act_ref(plain, name), what=name)



CONV1D = [((4, 6, 3, 1), 1, 1, [0, 0]), ((4, 6, 3, 1), 2, 2, [1, 2]), ((6, 6, 5, 3), 2, 1, [2, 2]),
          ((1, 8, 7, 1), 1, 2, [3, 0]), ((64, 96, 3, 1), 1, 1, [1, 1]), ((64, 96, 3, 1), 2, 1, "SAME_UPPER")]


@pytest.mark.parametrize("shape, stride, dilation, pads", CONV1D, ids=str)
@pytest.mark.parametrize("native_on", [True, False], ids=["native", "numpy"])
def test_conv1d_runs_as_a_2d_conv_of_height_one(monkeypatch, shape, stride, dilation, pads, native_on):
    """Conv1d through the 2-D native kernels (height 1) where the library is loaded, the numpy im2col
    where not: both against onnxruntime, a run twice on the same step attributes (the memo)."""
    from optcli import native
    from optcli.ops.conv import conv_im2col
    from optcli.ops.registry import StepAttrs

    if native_on and not native.available():
        pytest.skip("the native library is not built here")
    if not native_on:
        monkeypatch.setattr(native, "available", lambda: False)
    c, m, k, group = shape
    x = RNG.standard_normal((2, c, 37)).astype(np.float32)
    w = RNG.standard_normal((m, c // group, k)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    attrs = {"strides": [stride], "dilations": [dilation], "group": group, "kernel_shape": [k]}
    attrs.update({"auto_pad": pads} if isinstance(pads, str) else {"pads": pads})
    expected = run_ort(single_node_model("Conv", {"x": x, "w": w, "b": b}, attrs=attrs), {"x": x, "w": w, "b": b})[0]
    bound = StepAttrs(attrs)
    for run in range(2):
        assert_close(conv_im2col([x, w, b], bound)[0], expected, what=f"{attrs}, run {run}")
