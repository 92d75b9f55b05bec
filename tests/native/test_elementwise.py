"""The native element-wise kernels (kernels/host/elementwise.c: stand-alone activations, GELU, sums with an activation,
row means, LayerNormalization)
and the native ChannelAffine / BatchNormalization, against float64 references, the numpy kernels and
onnxruntime: one element, primes, large, non-contiguous inputs, 1 and 2 threads; and a ConvNeXt-like
model run with and without the library."""

from __future__ import annotations

from unittest import mock

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import optcli
from optcli import native
from optcli.ops import kernels_for
from optcli.ops.activation import NUMPY_TANH_BELOW, hard_swish, leaky_relu, sigmoid, tanh
from optcli.ops.elementwise import add, gelu
from optcli.ops.normalization import batch_normalization, channel_affine, layer_normalization
from optcli.ops.pool import global_average_pool
from tests.helpers import assert_close, gelu_ref, run_ort, single_node_model

RNG = np.random.default_rng(17)
SHAPES = [(1,), (7,), (13, 97), (2, 3, 1009), (1, 160, 56, 56)]


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}-threads")
def threads(request, native_lib):
    old = native_lib.set_num_threads(request.param)
    yield request.param
    native_lib.set_num_threads(old)


@pytest.fixture
def calls(native_lib, monkeypatch):
    """Counts calls into the native activation, layer norm and channel affine: proof a test ran them."""
    counts = {}

    def counting(name, fn):
        def counted(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    for name in ("activation", "layer_norm", "channel_affine", "row_mean", "add", "add_period"):
        counts[name] = 0
        monkeypatch.setattr(native, name, counting(name, getattr(native, name)))
    return counts


def numpy_kernel(fn, inputs, attrs):
    """The numpy kernel's answer, with the native library out of the way."""
    with mock.patch.object(native.library, "_lib", None):
        return fn(inputs, dict(attrs))


def _x(shape, scale=3.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_matches_float64_numpy_and_onnxruntime(shape, approximate, threads, calls):
    x = _x(shape)
    attrs = {"approximate": approximate}
    got = gelu([x], attrs)[0]
    assert calls["activation"] == 1 and got.dtype == np.float32 and got.shape == x.shape
    assert_close(got, gelu_ref(x, approximate == "tanh"), what=f"gelu {approximate} {shape} vs float64")
    assert_close(got, numpy_kernel(gelu, [x], attrs)[0], what="vs the numpy kernel")
    ort = run_ort(single_node_model("Gelu", {"x": x}, attrs=attrs, opset=20), {"x": x})[0]
    assert_close(got, ort, what="vs onnxruntime")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_tails_and_non_finite_values(approximate, calls):
    """The negative tail keeps its relative accuracy (no 1 + erf cancellation), +inf stays, -inf
    and NaN give NaN, as x * 0.5 * (1 + erf(x / sqrt 2)) does."""
    x = np.concatenate([np.linspace(-16, 16, 4001), [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38,
                                                     -3e38]]).astype(np.float32)
    got = gelu([x], {"approximate": approximate})[0]
    want = gelu_ref(x, approximate == "tanh")
    assert_close(got, want, what="gelu over [-16, 16] and special values")
    tail = (x < -3) & (np.abs(want) > 1e-30)
    assert np.all(np.abs(got[tail] - want[tail]) <= 2e-5 * np.abs(want[tail]))


def test_gelu_non_contiguous_input(threads, calls):
    base = _x((3, 10, 17))
    x = base[:, ::3, 1:]
    got = gelu([x], {})[0]
    assert calls["activation"] == 1 and got.flags.c_contiguous
    assert_close(got, gelu_ref(x), what="strided gelu")
    assert np.array_equal(base, base.copy()), "the input must stay as it was"


@pytest.mark.parametrize("kernel, name, attrs", [(sigmoid, "sigmoid", {}), (tanh, "tanh", {}),
                                                 (hard_swish, "hard_swish", {}),
                                                 (leaky_relu, "leaky_relu", {"alpha": 0.3})])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=str)
def test_standalone_activations_match_numpy_and_onnxruntime(kernel, name, attrs, shape, threads, calls):
    x = _x(shape)
    got = kernel([x], attrs)[0]
    # Tanh of a few elements stays in numpy (one vectorised call beats a native call's overhead).
    assert calls["activation"] == (0 if name == "tanh" and x.size < NUMPY_TANH_BELOW else 1)
    assert_close(got, numpy_kernel(kernel, [x], attrs)[0], what=f"{name} vs the numpy kernel")
    op = {"sigmoid": "Sigmoid", "tanh": "Tanh", "hard_swish": "HardSwish", "leaky_relu": "LeakyRelu"}[name]
    assert_close(got, run_ort(single_node_model(op, {"x": x}, attrs=attrs), {"x": x})[0], what=f"{name} vs ort")


def test_tanh_in_eight_lanes_keeps_extremes_and_nan(threads):
    """A stand-alone tanh runs tanh8 (elementwise.c): its polynomial below 0.625, the exp form above,
    the clamp at 10, the sign and NaN from the bits, and the lanes past the last whole vector."""
    x = np.concatenate([_x(1013), np.array([0.0, -0.0, 0.6249, 0.6251, -9.99, 10.01, 88.0, -1e30, np.inf, -np.inf,
                                            np.nan, 1e-30, -3e-8], np.float32)])
    got = native.activation(x, "tanh")
    assert_close(got, np.tanh(x.astype(np.float64)).astype(np.float32), what="tanh8 vs float64")
    assert np.isnan(got[-3]) and np.signbit(got[1013 + 1]) and got[1013 + 8] == 1.0 and got[1013 + 9] == -1.0


def test_small_sigmoid_epilogue_is_one_native_call_in_place(native_lib, monkeypatch):
    """A fused sigmoid on a GRU's gates (96 floats: below _SMALL_ACTIVATION) is one native call on
    the array itself (native.activation_), not numpy's passes; its answer is the float64 one."""
    from optcli.ops.activation import activate

    seen = []
    real = native.activation_
    monkeypatch.setattr(native, "activation_", lambda y, *a: seen.append(y) or real(y, *a))
    y = _x((1, 96), 6.0)
    want = (1.0 / (1.0 + np.exp(-y.astype(np.float64)))).astype(np.float32)
    got = activate(y, "sigmoid")
    assert got is y and len(seen) == 1 and seen[0] is y
    assert_close(got, want, what="sigmoid of 96 gates")
    with pytest.raises(native.NativeError):  # not converted: a non-contiguous array is refused
        native.activation_(np.zeros((4, 4), np.float32)[:, ::2], "sigmoid")


def test_activation_refuses_unknown_codes(native_lib):
    x = np.zeros(8, np.float32)
    for code in (-1, len(native.ACTIVATION_CODES)):
        assert native_lib._lib.optcli_activation_f32(x.ctypes.data, x.ctypes.data, 8, code, 0.0, 0.0) == -1  # EINVAL


@pytest.mark.parametrize("shape, axes", [((1, 1, 1, 1), (2, 3)), ((1, 240, 28, 28), (2, 3)), ((2, 7, 13, 3), (2, 3)),
                                         ((3, 5, 1009), (2,)), ((2, 3, 4), (1, 2)), ((1, 2, 300, 300), (2, 3)),
                                         ((4, 6), (0, 1))], ids=str)
def test_mean_over_trailing_axes_matches_numpy_and_onnxruntime(shape, axes, threads, calls):
    x = _x(shape) + 1.0
    kernels = {k.variant: k.fn for k in kernels_for("ReduceMean", "")}
    got = kernels["default"]([x, np.array(axes, np.int64)], {"keepdims": 1})[0]
    assert calls["row_mean"] == 1 and got.shape == tuple(1 if i in axes else d for i, d in enumerate(shape))
    assert_close(got, x.astype(np.float64).mean(axis=axes, keepdims=True), what=f"ReduceMean {shape} {axes}")
    model = single_node_model("ReduceMean", {"x": x}, initializers={"axes": np.array(axes, np.int64)}, opset=18)
    assert_close(got, run_ort(model, {"x": x})[0], what="vs onnxruntime")
    if len(shape) >= 3 and axes == tuple(range(2, len(shape))):
        gap = global_average_pool([x], {})[0]
        assert calls["row_mean"] == 2
        assert_close(gap, got, what="GlobalAveragePool")


def test_mean_keeps_digits_on_long_rows_and_leaves_other_axes_to_numpy(calls):
    x = (1000.0 + RNG.standard_normal((2, 1 << 20))).astype(np.float32)  # float32 lanes alone drift here
    got = native.row_mean(x, 1 << 20)
    assert np.allclose(got, x.astype(np.float64).mean(axis=1), rtol=2e-7, atol=0)
    kernels = {k.variant: k.fn for k in kernels_for("ReduceMean", "")}
    y = _x((4, 5, 6))
    for axes in ((0,), (1,), (0, 2)):  # not the trailing axes
        assert_close(kernels["default"]([y, np.array(axes, np.int64)], {})[0], y.mean(axis=axes, keepdims=True))
    assert_close(kernels["default"]([y[:, ::2], np.array([2], np.int64)], {})[0], y[:, ::2].mean(axis=2, keepdims=True))
    assert calls["row_mean"] == 1


# (x shape as stored, axis, whether x is the channels-last view of the stored NCHW array)
LN_CASES = [((1, 1), -1, False), ((3, 17), -1, False), ((4, 1000), -1, False), ((2, 5, 13), 1, False),
            ((5, 8), -1, False), ((2, 7, 3, 5), -1, True), ((1, 13, 37, 41), -1, True), ((2, 40, 8, 8), -1, True),
            ((1, 3, 1, 1), -1, True), ((2, 6, 29), -1, True),
            ((300, 1000), -1, False), ((1, 64, 64, 65), -1, True)]  # the last two: over 1 MiB, on the pool


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("shape, axis, channels_last", LN_CASES, ids=str)
def test_layer_norm_matches_numpy_and_onnxruntime(shape, axis, channels_last, bias, threads, calls):
    stored = _x(shape) + 2.0  # a mean that does not cancel
    x = np.moveaxis(stored, 1, -1) if channels_last else stored
    norm = x.shape[axis:] if axis != -1 else x.shape[-1:]
    scale, b = _x(norm, 1.0), (_x(norm, 1.0) if bias else None)
    attrs = {"axis": axis, "epsilon": 1e-5}
    inputs = [x, scale] + ([b] if bias else [])
    got = layer_normalization(inputs, attrs)
    assert calls["layer_norm"] == 1
    if channels_last:
        assert np.moveaxis(got[0], -1, 1).flags.c_contiguous, "the result is the same view: no transposing copy"
    for g, w, what in zip(got, numpy_kernel(layer_normalization, inputs, attrs), ("Y", "Mean", "InvStdDev")):
        assert_close(g, w, what=f"{what} vs the numpy kernel")
    feeds = {"x": np.ascontiguousarray(x)}
    inits = {"scale": scale, **({"b": b} if bias else {})}
    model = single_node_model("LayerNormalization", feeds, n_outputs=3, attrs=attrs, initializers=inits, opset=17)
    for g, w, what in zip(got, run_ort(model, feeds), ("Y", "Mean", "InvStdDev")):
        assert_close(g, w, what=f"{what} vs onnxruntime")


def test_layer_norm_outside_the_native_scope_stays_in_numpy(calls):
    x = _x((3, 8))
    for scale, eps in ((_x((1,)), 1e-5), (_x((8,)), 0.0)):  # a broadcast scale; eps the library refuses
        got = layer_normalization([x, scale], {"epsilon": eps})
        assert calls["layer_norm"] == 0
        assert_close(got[0], numpy_kernel(layer_normalization, [x, scale], {"epsilon": eps})[0])


@pytest.mark.parametrize("activation", [None, "swish", "gelu", "hard_swish", "relu"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7, 1, 1), (2, 13, 5, 3), (1, 240, 28, 28)], ids=str)
def test_channel_affine_matches_numpy(shape, activation, threads, calls):
    x, s, t = _x(shape), _x(shape[1], 1.0), _x(shape[1], 1.0)
    attrs = {"activation": activation} if activation else {}
    got = channel_affine([x, s, t], attrs)[0]
    assert calls["channel_affine"] == 1
    assert_close(got, numpy_kernel(channel_affine, [x, s, t], attrs)[0], what=f"ChannelAffine {activation}")


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 13, 5, 3), (1, 96, 56, 56)], ids=str)
def test_batch_norm_matches_onnxruntime(shape, threads, calls):
    c = shape[1]
    x, s, b, m, v = _x(shape), _x(c, 1.0), _x(c, 1.0), _x(c, 1.0), np.abs(_x(c, 1.0)) + 0.1
    got = batch_normalization([x, s, b, m, v], {"epsilon": 1e-3})[0]
    assert calls["channel_affine"] == 1
    inits = {"s": s, "b": b, "m": m, "v": v}
    ort = run_ort(single_node_model("BatchNormalization", {"x": x}, attrs={"epsilon": 1e-3}, initializers=inits),
                  {"x": x})[0]
    assert_close(got, ort, what="BatchNormalization vs onnxruntime")


def convnext_block(c: int = 24, hw: int = 14) -> onnx.ModelProto:
    """Conv -> Transpose -> LayerNorm -> Transpose -> 1x1 Conv -> Gelu -> 1x1 Conv, then a
    BatchNormalization + Sigmoid the passes cannot fold into a conv: ConvNeXt's and MixNet's host ops."""
    r = np.random.default_rng(3)
    shapes = {"w0": (c, 3, 3, 3), "ln_s": (c,), "ln_b": (c,), "w1": (4 * c, c, 1, 1), "w2": (c, 4 * c, 1, 1),
              "bn_s": (c,), "bn_b": (c,), "bn_m": (c,), "bn_v": (c,)}
    arrays = {k: (r.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32) for k, s in shapes.items()}
    arrays["bn_v"] = np.abs(arrays["bn_v"]) + 0.5
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c0"], ["t0"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t0", "ln_s", "ln_b"], ["l0"], epsilon=1e-6),
        helper.make_node("Transpose", ["l0"], ["t1"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t1", "w1"], ["c1"]),
        helper.make_node("Gelu", ["c1"], ["g1"]),
        helper.make_node("Conv", ["g1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "c0"], ["a2"]),
        helper.make_node("BatchNormalization", ["a2", "bn_s", "bn_b", "bn_m", "bn_v"], ["n2"]),
        helper.make_node("Sigmoid", ["n2"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "convnext_block",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, c, hw, hw])],
                              [numpy_helper.from_array(v, k) for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_model_same_with_and_without_the_library(native_lib, calls):
    model = convnext_block()
    x = _x((1, 3, 14, 14), 1.0)
    ref = run_ort(model, {"x": x})[0]
    data = optcli.optimize(model=model, valid_targets="arm").data
    got = optcli.load(data, threads=2).run({"x": x})["y"]
    assert calls["layer_norm"] and calls["channel_affine"]
    with mock.patch.object(native.library, "_lib", None):
        without = optcli.load(data, threads=2).run({"x": x})["y"]
    assert_close(got, ref, what="native kernels vs onnxruntime")
    assert_close(without, ref, what="numpy kernels vs onnxruntime")


ADD_SHAPES = [(1, 16384), (1, 28, 64, 64), (2, 3, 61, 97), (1, 160, 56, 56)]  # chunk edges, primes, large


@pytest.mark.parametrize("shape", ADD_SHAPES, ids=str)
@pytest.mark.parametrize("activation, attrs", [(None, {}), ("relu", {}), ("clip", {"activation_alpha": 0.0,
                                                                                    "activation_beta": 6.0}),
                                               ("hard_swish", {"activation_alpha": 1 / 6, "activation_beta": 0.5})])
def test_add_with_activation_matches_numpy_and_onnxruntime(shape, activation, attrs, threads, calls):
    a, b = _x(shape), _x(shape)
    a.flat[::977] = np.nan  # NaNs flow through the sum and the activation as in numpy
    fused = {**attrs, "activation": activation} if activation else {}
    got = add([a, b], fused)[0]
    assert calls["add"] == 1
    assert_close(got, numpy_kernel(add, [a, b], fused)[0], what=f"add + {activation}")
    if activation is None:
        assert_close(got, run_ort(single_node_model("Add", {"a": a, "b": b}), {"a": a, "b": b})[0], what="vs ort")


def test_add_outside_the_native_scope_stays_in_numpy(calls):
    small = _x((1, 8, 4, 4))
    big = _x((1, 64, 32, 32))
    add([small, small], {})  # too small to be worth a call
    add([big, big[:, :, :1]], {})  # broadcast along an inner axis: not a repeated row
    add([big, big.astype(np.float64)], {})  # mixed dtypes
    add([big[:, :, :, ::-1], big], {})  # a strided view
    add([_x((4, 1, 32)), _x((3, 32))], {})  # the result has more rows than either operand
    add([_x((64,)), _x((1, 1, 64))], {})  # the row has more dims: the result is not the big one's shape
    add([big, big[:, :1, :, ::-1]], {})  # a repeated block, but strided
    assert calls["add"] == 0 and calls["add_period"] == 0


@pytest.mark.parametrize("big, row", [((1, 64, 96), (1, 1, 96)), ((2, 16, 128), (1, 16, 128)), ((64, 96), (96,)),
                                      ((3, 5, 7), ()), ((2, 3, 7), (1, 1, 1)), ((9000, 3), (3,)), ((1, 2), (2,)),
                                      ((4, 8193), (8193,)), ((1, 16, 56, 56), (56, 56))], ids=str)
@pytest.mark.parametrize("activation", [None, "sigmoid", "relu"])
@pytest.mark.parametrize("swap", [False, True], ids=["row second", "row first"])
def test_add_of_a_repeated_row_is_one_native_pass(big, row, activation, swap, threads, calls):
    """A row broadcast along the other operand's leading dims (a bias [C], a decoder's [1, 1, H] query
    over [1, T, H]) and the fused activation: one native call, as numpy's broadcast add and the
    activation give it, either operand the row."""
    a, b = _x(big), np.asarray(_x(row), np.float32)
    inputs = [b, a] if swap else [a, b]
    fused = {"activation": activation} if activation else {}
    got = add(inputs, fused)[0]
    want = numpy_kernel(add, inputs, fused)[0]
    assert got.shape == want.shape == big
    assert_close(got, want, what=f"{row} over {big} + {activation}")
    assert calls["add_period"] == (1 if a.size >= (64 if activation else 16384) else 0)
