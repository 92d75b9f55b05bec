"""optcli.QAdd, the integer residual Add (optcli/ops/qadd.py, kernels/host/qelementwise.c, passes/fuse_qdq_add.py):
the native kernel equals the numpy reference byte for byte, both equal onnxruntime's QLinearAdd, the pass
makes one of a QDQ residual block, and crafted parameters are refused at load."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import optcli
from optcli.errors import NbFormatError
from optcli.native import library
from optcli.ops.qadd import qadd, reference
from tests.helpers import run_ort, single_node_model
from tests.quant.quantized_models import feeds, ort_run, quantized, residual_cnn
from tests.reliability.nbfuzz import parts, rebuild


def make(seed: int, shape=(2, 7, 5, 3), a_signed=0, b_signed=0, y_signed=0, zps=None):
    rng = np.random.default_rng(seed)
    dt = {0: np.uint8, 1: np.int8}
    a = rng.integers(np.iinfo(dt[a_signed]).min, np.iinfo(dt[a_signed]).max + 1, shape).astype(dt[a_signed])
    b = rng.integers(np.iinfo(dt[b_signed]).min, np.iinfo(dt[b_signed]).max + 1, shape).astype(dt[b_signed])
    lo, hi = (-128, 127) if y_signed else (0, 255)
    za, zb, zy = zps if zps else (int(rng.integers(np.iinfo(dt[s]).min, np.iinfo(dt[s]).max + 1))
                                  for s in (a_signed, b_signed, y_signed))
    attrs = {"a_scale": float(10 ** rng.uniform(-4, 2)), "b_scale": 0.0, "y_scale": 0.0, "a_zero_point": za,
             "b_zero_point": zb, "y_zero_point": zy, "qmin": lo, "qmax": hi, "a_signed": a_signed,
             "b_signed": b_signed, "y_signed": y_signed}
    attrs["b_scale"] = attrs["a_scale"] * float(rng.uniform(0.3, 3))
    attrs["y_scale"] = (attrs["a_scale"] + attrs["b_scale"]) * float(rng.uniform(0.6, 1.5))
    return a, b, attrs


@pytest.mark.parametrize("signs", [(0, 0, 0), (1, 1, 1), (0, 1, 0), (1, 0, 1)])
def test_native_equals_the_reference(native_lib, signs):
    for seed in range(4):
        a, b, attrs = make(seed, a_signed=signs[0], b_signed=signs[1], y_signed=signs[2])
        got, want = qadd([a, b], attrs)[0], reference(a, b, attrs)
        np.testing.assert_array_equal(got, want)
        assert np.any((want != attrs["qmin"]) & (want != attrs["qmax"]))


@pytest.mark.parametrize("zps", [(0, 0, 0), (255, 255, 255), (0, 255, 128)])
def test_extreme_zero_points_and_a_relu_clamp(native_lib, zps):
    a, b, attrs = make(9, shape=(1, 3, 70, 70), zps=zps)
    attrs.update(qmin=zps[2])  # a fused Relu: the output's zero point is its floor
    got = qadd([a, b], attrs)[0]
    np.testing.assert_array_equal(got, reference(a, b, attrs))
    assert got.min() >= zps[2]


def test_without_the_library_the_reference_runs(monkeypatch):
    a, b, attrs = make(3)
    monkeypatch.setattr(library, "_lib", None)
    np.testing.assert_array_equal(qadd([a, b], attrs)[0], reference(a, b, attrs))


def test_equals_onnxruntime_qlinearadd():
    for seed in range(4):
        a, b, attrs = make(seed, shape=(1, 16, 9, 9))
        inits = {"sa": np.float32(attrs["a_scale"]), "za": np.uint8(attrs["a_zero_point"]),
                 "sb": np.float32(attrs["b_scale"]), "zb": np.uint8(attrs["b_zero_point"]),
                 "sy": np.float32(attrs["y_scale"]), "zy": np.uint8(attrs["y_zero_point"])}
        model = single_node_model("QLinearAdd", {"a": a, "b": b}, initializers=inits,
                                  input_names=["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])
        model.graph.node[0].domain = "com.microsoft"
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        theirs = run_ort(model, {"a": a, "b": b})[0]
        assert np.abs(qadd([a, b], attrs)[0].astype(int) - theirs.astype(int)).max() <= 1


@pytest.fixture(scope="module")
def qdq_cnn(tmp_path_factory):
    return quantized(residual_cnn(), "qdq", tmp_path_factory.mktemp("qadd"))


def test_the_residual_add_of_a_qdq_model_becomes_one_integer_step(qdq_cnn):
    result = optcli.optimize(model=qdq_cnn, valid_targets="arm")
    kinds = [s.op_type for s in result.plan.steps]
    assert kinds.count("QAdd") == 1 and "Add" not in kinds
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = feeds(residual_cnn(), seed)
        ours, theirs = predictor.run(x)["y"], ort_run(qdq_cnn, x)[0]
        scale = np.abs(theirs).max()
        assert np.abs(ours - theirs).max() <= 0.05 * scale


@pytest.mark.parametrize("attrs, message", [
    ({"a_scale": 0.0}, "positive finite scales"),
    ({"b_scale": -1.0}, "positive finite scales"),
    ({"y_scale": math.nan}, "positive finite scales"),
    ({"a_scale": 1e300}, "positive finite scales"),
    ({"a_scale": 1e30, "y_scale": 1e-30}, "multiplier"),
    ({"a_zero_point": 300}, "'a_zero_point' 300 is outside"),
    ({"b_signed": 0, "b_zero_point": -4}, "'b_zero_point' -4 is outside"),
    ({"qmin": 9, "qmax": 2}, "qmin and qmax"),
    ({"y_signed": 3}, "'y_signed' must be 0 or 1"),
])
def test_crafted_parameters_are_refused_at_load(qdq_cnn, attrs, message):
    data = optcli.optimize(model=qdq_cnn, valid_targets="arm").data
    body, blob = parts(data)
    next(s for s in body["steps"] if s["op"] == "QAdd")["attrs"].update(attrs)
    with pytest.raises(NbFormatError, match=message):
        optcli.load(rebuild(body, blob))


def test_a_step_prepares_its_call_once(native_lib):
    from optcli.ops.registry import StepAttrs

    a, b, attrs = make(4, shape=(1, 8, 9, 9))
    step = StepAttrs(attrs)
    first = qadd([a, b], step)[0]
    assert "qadd" in step.memo
    np.testing.assert_array_equal(qadd([a, b], step)[0], first)
    np.testing.assert_array_equal(first, reference(a, b, attrs))
    a2, b2, _ = make(5, shape=(1, 8, 9, 9))
    np.testing.assert_array_equal(qadd([a2, b2], step)[0], reference(a2, b2, attrs))  # the prepared path


@pytest.mark.parametrize("path", [0, 1], ids=["by-CPU", "portable"])
@pytest.mark.parametrize("dtype, zp", [(np.uint8, 0), (np.uint8, 255), (np.uint8, 131), (np.int8, -128), (np.int8, 5)])
def test_native_quantize_linear_equals_numpy(native_lib, dtype, zp, path):
    """The input's QuantizeLinear of an integer plan (kernels/host/qelementwise.c), on the CPU's path (AVX-512
    where it has it) and the portable loop: the numpy kernel's bytes, .5 ties (rounded half to even after a
    float32 division), NaN, infinities and saturation included, and a length that leaves a partial vector."""
    from optcli.native import qelementwise
    from optcli.ops.quant import quantize

    scale = np.float32(0.037)
    rng = np.random.default_rng(zp & 0xFF)
    x = (rng.standard_normal(40_001) * 6).astype(np.float32)
    x[:2000] = (np.arange(-1000, 1000) + 0.5).astype(np.float32) * scale  # ties after the division
    x[2000:2006] = [np.nan, np.inf, -np.inf, 3e38, -3e38, -0.0]
    x[-3:] = [np.nan, 1e9, -7.5 * scale]  # in the last, partial vector
    before = qelementwise.lookup_variant(-1)
    qelementwise.lookup_variant(path)
    try:
        got = qelementwise.quantize(x.reshape(13, 3077), scale, zp, np.dtype(dtype))
    finally:
        qelementwise.lookup_variant(0 if before == 2 else before)
    np.testing.assert_array_equal(got.reshape(-1), quantize(x, scale, dtype(zp), np.dtype(dtype)))


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 0), (np.uint8, 255), (np.uint8, 131), (np.int8, -128), (np.int8, 127),
                                      (np.int8, 3)])
def test_native_dequantize_linear_equals_numpy(native_lib, dtype, zp):
    """The output's DequantizeLinear of an integer plan (kernels/host/qelementwise.c) through the op's kernel:
    the numpy kernel's bits (a float64 product cast to float32) for every byte, and scales whose products
    round (an odd mantissa), are tiny or huge."""
    from optcli.ops import quant

    x = np.tile(np.arange(256, dtype=np.uint8).view(dtype), 40).reshape(4, 10, 256)
    for scale in (np.float32(0.037), np.float32(1.0000001), np.float32(3e-39), np.float32(1e30)):
        inputs = [x, np.asarray(scale), np.asarray(zp, dtype)]
        assert quant._native_dequantize(*inputs), "the native path did not take the case"
        got = quant.dequantize_linear(inputs, {})[0]
        want = ((x.astype(np.float64) - zp) * scale).astype(np.float32)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_array_equal(got, want)
