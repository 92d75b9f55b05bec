"""Element-wise kernels against onnxruntime on one-node models: broadcasting, dtypes, attributes."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from optcli.ops import kernels_for
from optcli.ops.erf import erf
from tests.helpers import OPSET, assert_close, run_ort, single_node_model

RNG = np.random.default_rng(0)


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs; untyped graph outputs, since ORT rejects the UNDEFINED element type."""
    for o in model.graph.output:
        if o.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            o.ClearField("type")
    return run_ort(model, feeds)


def check(op: str, inputs: dict, attrs: dict | None = None, opset: int = OPSET, n_outputs: int = 1,
          initializers: dict | None = None, precision: str = "fp32") -> list[np.ndarray]:
    """Run ``op`` in onnxruntime and through our kernel; outputs must agree in dtype, shape, value."""
    model = single_node_model(op, inputs, n_outputs, attrs, initializers, opset)
    expected = ort_outputs(model, inputs)
    args = [np.asarray(v) for v in {**inputs, **(initializers or {})}.values()]
    for a in args:
        a.setflags(write=False)  # kernels must never write into their inputs
    got = kernels_for(op)[0].fn(args, {**(attrs or {}), "_opset": opset})
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g)
        assert g.dtype == e.dtype, f"{op}: dtype {g.dtype} != {e.dtype}"
        if e.dtype.kind == "f":
            assert_close(g, e, precision, what=op)
        else:
            assert g.shape == e.shape, f"{op}: shape {g.shape} != {e.shape}"
            np.testing.assert_array_equal(g, e, err_msg=op)
    return got


def rand(shape, dtype=np.float32, lo=-3.0, hi=3.0) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(lo) * 3, int(hi) * 3 + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((1, 3), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary_arithmetic(op, dtype, shapes):
    a, b = rand(shapes[0], dtype), rand(shapes[1], dtype)
    if op == "Div" and np.dtype(dtype).kind == "i":
        b = np.where(b == 0, 3, b).astype(dtype)  # mixed signs exercise truncation toward zero
    check(op, {"a": a, "b": b})


def test_integer_div_truncates():
    a = np.array([7, -7, 7, -7, 6, -6, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3, 4, -5], np.int64)
    got = check("Div", {"a": a, "b": b})[0]
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 2, -1, 0])


@pytest.mark.parametrize("base,exp", [
    (np.float32, np.float32), (np.float32, np.int64), (np.int64, np.int64), (np.int32, np.float32),
    (np.float32, np.int32),
])
def test_pow(base, exp):
    x = rand((3, 4), base, 0.5, 3.0)
    p = rand((4,), exp, 0, 2) if np.dtype(exp).kind == "i" else rand((4,), exp, -2.0, 2.0)
    if np.dtype(base).kind == "i":
        x = np.abs(x) + 1
    if np.dtype(exp).kind == "i":
        p = np.abs(p)
    check("Pow", {"x": x, "p": p}, opset=15)


@pytest.mark.parametrize("fmod,dtype", [(0, np.int64), (1, np.int64), (0, np.int32), (1, np.float32)])
def test_mod(fmod, dtype):
    a = rand((3, 4), dtype, -5, 5)
    b = rand((4,), dtype, -3, 3)
    b = np.where(b == 0, 2, b).astype(dtype)
    check("Mod", {"a": a, "b": b}, {"fmod": fmod})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("opset", [8, 13])
def test_variadic(op, n, opset):
    shapes = [(2, 3, 4), (3, 1), (4,)][:n]
    check(op, {f"x{i}": rand(s) for i, s in enumerate(shapes)}, opset=opset)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_variadic_int(op):
    check(op, {"a": rand((2, 3), np.int64), "b": rand((3,), np.int64)}, opset=13)


UNARY = {
    "Exp": {}, "Log": {"lo": 0.01}, "Sqrt": {"lo": 0.0}, "Erf": {}, "Neg": {}, "Abs": {},
    "Reciprocal": {"lo": 0.5}, "Floor": {}, "Ceil": {}, "Sign": {}, "Sin": {}, "Cos": {}, "Softplus": {},
    "Softsign": {}, "Elu": {"alpha": 0.7}, "Selu": {"alpha": 1.5, "gamma": 1.1}, "Celu": {"alpha": 1.3},
    "ThresholdedRelu": {"alpha": 0.5},
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op):
    spec = dict(UNARY[op])
    x = rand((3, 4, 5), np.float32, spec.pop("lo", -4.0), 4.0)
    check(op, {"x": x}, spec or None, opset=13 if op != "Celu" else 12)


@pytest.mark.parametrize("size", [7, 96, 3000])
def test_sigmoid_tails(size):
    """Sigmoid agrees with onnxruntime and with float64 over the whole range, relatively down to
    the subnormals: the tails (where a naive exp(-x) overflows or 1 - tiny cancels), signed zeros."""
    x = rand((size,), np.float32, -30.0, 30.0)
    x[:6] = [-100.0, 100.0, -0.0, 0.0, -88.5, 88.5]
    got = check("Sigmoid", {"x": x})[0]
    with np.errstate(over="ignore"):
        exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, exact, rtol=2e-7, atol=1.2e-38)


@pytest.mark.parametrize("op", ["Elu", "Selu", "ThresholdedRelu"])
def test_unary_default_attrs(op):
    check(op, {"x": rand((2, 5))}, opset=10)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
def test_unary_int(op):
    check(op, {"x": rand((3, 4), np.int64)})


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, 2.6, -2.6, 0.0], np.float32)
    got = check("Round", {"x": x})[0]
    np.testing.assert_array_equal(got, [0, 2, 2, -0, -2, -2, 2, 3, -3, 0])


def test_erf_accuracy():
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-40, 1, 500), [0.46875, 4.0, 30.0, -np.inf]])
    ref = np.array([math.erf(v) for v in x])
    got = erf(x)
    assert np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300)) < 1e-14
    x32 = x.astype(np.float32)
    got32 = kernels_for("Erf")[0].fn([x32], {"_opset": 13})[0]
    assert got32.dtype == np.float32
    ref32 = np.array([math.erf(float(v)) for v in x32]).astype(np.float32)
    np.testing.assert_array_equal(got32, ref32)  # correctly rounded from float64
    assert np.isnan(erf(np.array([np.nan]))[0])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check("Gelu", {"x": rand((4, 16), lo=-6, hi=6)}, {"approximate": approximate}, opset=20)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons(op, dtype):
    a = rand((2, 3, 4), dtype, -2, 2).round()
    b = rand((3, 1), dtype, -2, 2).round()
    check(op, {"a": a.astype(dtype), "b": b.astype(dtype)}, opset=16)


def test_equal_bool():
    check("Equal", {"a": rand((3, 4), np.bool_), "b": rand((4,), np.bool_)}, opset=13)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, {"a": rand((2, 3, 4), np.bool_), "b": rand((3, 1), np.bool_)})


def test_not():
    check("Not", {"x": rand((3, 4), np.bool_)})


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_where(dtype):
    check("Where", {"c": rand((2, 1, 4), np.bool_), "x": rand((3, 4), dtype), "y": rand((), dtype)})


def test_isnan_isinf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.0], np.float32)
    check("IsNaN", {"x": x})
    for pos, neg in [(1, 1), (1, 0), (0, 1)]:
        check("IsInf", {"x": x}, {"detect_positive": pos, "detect_negative": neg})


def test_swish_fused():
    x = rand((3, 7), lo=-30, hi=30)
    got = kernels_for("Swish", "optcli")[0].fn([x], {"_opset": OPSET})[0]
    ref = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))
    assert got.dtype == np.float32
    assert_close(got, ref, what="Swish")


def test_keeps_float16():
    x = rand((4, 5), np.float16)
    for op in ["Exp", "Erf", "Softplus", "Sqrt"]:
        assert kernels_for(op)[0].fn([np.abs(x)], {"_opset": OPSET})[0].dtype == np.float16
    assert kernels_for("Add")[0].fn([x, x], {"_opset": OPSET})[0].dtype == np.float16


@pytest.mark.parametrize("slopes", ["below 1", "above 1", "mixed", "scalar", "nan", "per width"])
def test_prelu_takes_max_or_min_and_matches_where(slopes):
    """PRelu runs as max(x, slope * x) where every slope is <= 1 (min where >= 1), as np.where
    elsewhere: the same values, NaN and infinities included, with the same slopes seen again (the
    step's memo) and a new slope array of the other side."""
    from optcli.ops.activation import prelu
    from optcli.ops.registry import StepAttrs

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 6, 5, 7)).astype(np.float32)
    x[0, 0, 0, :4] = [np.nan, -np.inf, np.inf, -0.0]
    slope = {"below 1": rng.uniform(-2, 1, (6, 1, 1)), "above 1": rng.uniform(1, 3, (6, 1, 1)),
             "mixed": rng.uniform(0, 2, (6, 1, 1)), "scalar": np.array(0.1), "nan": np.array([np.nan]),
             "per width": rng.uniform(0, 0.3, (7,))}[slopes].astype(np.float32)
    attrs = StepAttrs({})
    for k, s in enumerate((slope, slope, slope + np.float32(2.5))):  # the memo's hit, then other slopes
        want = np.where(x >= 0, x, x * s)
        got = prelu([x, s], attrs)[0]
        assert got.dtype == np.float32 and got.shape == x.shape and got is not x
        np.testing.assert_array_equal(got, want)
        if k == 0:
            expected = {"below 1": -1, "above 1": 1, "mixed": None, "scalar": -1, "nan": None, "per width": -1}
            assert attrs.memo["prelu side"][1] == expected[slopes]
