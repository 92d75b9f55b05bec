"""Integer dense layers in host plans of quantized models (issue 26): ``fuse_qdq_matmul`` turns the QDQ MatMul and
Gemm chains of onnxruntime's quantize_static output into ``optcli.QMatMul`` steps; the native kernel gives the
numpy reference's integers exactly on every dot-product path; the plans match onnxruntime within one
quantization step; what the step cannot take is left to fold_qdq; a `.nb` with tampered QMatMul scales, zero
points or constants is refused at load."""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError
from optcli.frontend.onnx_reader import read_model
from optcli.native import qgemm
from optcli.ops import qmatmul
from optcli.passes import fuse_qdq_matmul
from optcli.passes.base import PassContext
from optcli.targets import parse_targets
from tests.native.test_qgemm import path, threads  # noqa: F401  (fixtures: every dot-product path, 1 and 2 threads)
from tests.quant.quantized_models import dense_net, feeds, ort_run, quantized, residual_cnn
from tests.quant.test_qconv import crafted_quant_attrs, output_step
from tests.reliability.nbfuzz import parts, rebuild


def qmatmul_steps(plan) -> int:
    return sum(s.domain == "optcli" and s.op_type == "QMatMul" for s in plan.steps)


# ---- the kernel: native == numpy reference, exactly ----

# (leading dims of x, K, M): one row (a classifier head: blocks of 1 row by 4 tiles of 16 columns) and many
# (blocks of 4 rows by 4 tiles, 2 by 2, rows by 1), K of every remainder mod 4 (a last partial quad of x), K
# and M of 1, primes, M not a multiple of 16 and below one tile, a band of rows past 16
SHAPES = [((1,), 1, 1), ((1,), 7, 1), ((3,), 1, 5), ((1,), 1280, 13), ((17,), 31, 29), ((2, 5), 16, 12),
          ((67,), 97, 53), ((4, 33), 64, 96), ((), 13, 7), ((1,), 130, 1000), ((2,), 6, 40), ((5,), 2, 67)]


def _case(rng, lead, k, m, x_signed, y_signed, big_weights, xzp=None):
    """x, w, bias and attributes spanning what real layers hold: per-column scales from 1e-4 to 1e2, zero points
    anywhere in their dtype, bias and output scale sized so outputs fill the range and saturate at both ends."""
    info = np.iinfo(np.int8 if x_signed else np.uint8)
    x = rng.integers(info.min, info.max + 1, (*lead, k)).astype(info.dtype)
    w = (rng.integers(-128, 128, (k, m)) if big_weights else rng.integers(-40, 41, (k, m))).astype(np.int8)
    w_scale = np.geomspace(1e-4, 1e2, m) if m > 1 else np.array([0.02])
    lo, hi = (-128, 127) if y_signed else (0, 255)
    typical = math.sqrt(k) * 70.0 * (2.5 if big_weights else 1.0)
    b = rng.integers(-3 * typical, 3 * typical + 1, m).astype(np.int32)
    attrs = dict(x_scale=0.02, x_zero_point=int(rng.integers(info.min, info.max + 1)) if xzp is None else xzp,
                 w_scale=[float(v) for v in w_scale], y_scale=float(0.02 * np.median(w_scale) * typical / 40.0),
                 y_zero_point=int(rng.integers(lo, hi + 1)), qmin=lo, qmax=hi, x_signed=x_signed, y_signed=y_signed)
    return x, w, b, attrs


def _native(x, w, b, attrs):
    call = qmatmul._native_call(x, w, b, attrs)
    assert call is not None  # the native path, not the reference again
    return call(np.ascontiguousarray(x))


@pytest.mark.parametrize("lead, k, m", SHAPES, ids=[f"{'x'.join(map(str, s[0])) or 'vec'}-k{s[1]}-m{s[2]}"
                                                      for s in SHAPES])
@pytest.mark.parametrize("big_weights", [False, True], ids=["small-w", "full-range-w"])
@pytest.mark.usefixtures("path", "threads")
def test_native_equals_the_reference(lead, k, m, big_weights):
    rng = np.random.default_rng(k * 1000 + m)
    for x_signed, y_signed in ((0, 0), (1, 0), (0, 1), (1, 1)):
        x, w, b, attrs = _case(rng, lead, k, m, x_signed, y_signed, big_weights)
        want = qmatmul.reference(x, w, b, attrs)
        assert want.shape == (*lead, m)
        np.testing.assert_array_equal(_native(x, w, b, attrs), want)
        np.testing.assert_array_equal(_native(x, w, None, attrs), qmatmul.reference(x, w, None, attrs))
    x, w, b, attrs = _case(rng, lead, k, m, 0, 0, big_weights)
    outs = qmatmul.reference(x, w, b, attrs)
    assert outs.size < 8 or (outs.min() == 0 and outs.max() == 255)  # outputs saturate at both ends


@pytest.mark.parametrize("xzp", [0, 255])
@pytest.mark.usefixtures("path", "threads")
def test_zero_points_at_the_ends_and_saturating_sums(xzp):
    """x at 255 and 0 against weights at -128 / 127: the largest sums a K of 4099 makes (about 1.3e8, past
    int16 and float32's exact integers), and a narrowed clamp (a fused Relu6)."""
    rng = np.random.default_rng(xzp)
    k, m = 4099, 9
    x = np.where(rng.random((3, k)) < 0.9, 255 - xzp, xzp).astype(np.uint8)
    w = np.where(rng.random((k, m)) < 0.9, -128, 127).astype(np.int8)
    w[:, 0], w[:, 1] = -128, 127
    attrs = dict(x_scale=0.5, x_zero_point=xzp, w_scale=[1e-4] * m, y_scale=1.0, y_zero_point=10, qmin=10,
                 qmax=200, x_signed=0, y_signed=0)
    seen = set()
    for scale in (1e-4, 1e2 / 255 / 128 / k):
        attrs["w_scale"] = [scale] * m
        want = qmatmul.reference(x, w, None, attrs)
        np.testing.assert_array_equal(_native(x, w, None, attrs), want)
        seen.update(int(v) for v in np.unique(want))
    assert {10, 200} <= seen and len(seen) > 2  # clamped at both ends, and values between


@pytest.mark.parametrize("packed_for, run_on", [(4, 2), (2, 4), (2, 1), (4, 1), (5, 3)])
def test_weights_packed_for_another_path_still_give_the_reference(native_lib, packed_for, run_on):
    """Weights are packed for the path in use when a step is prepared: whole for the VNNI paths, split for
    vpmaddubsw.  Run on another path (the tests switch paths; nothing else does) they still give the same
    integers: an AVX2 path given whole weights runs plain C, a VNNI path adds the split's residual."""
    x, w, b, attrs = _case(np.random.default_rng(5), (9,), 150, 70, 0, 0, True)
    want = qmatmul.reference(x, w, b, attrs)
    if qgemm.variant(packed_for) != packed_for:
        pytest.skip(f"this CPU has no dot-product path {packed_for}")
    try:
        call = qmatmul._native_call(x, w, b, attrs)
        if qgemm.variant(run_on) != run_on:
            pytest.skip(f"this CPU has no dot-product path {run_on}")
        np.testing.assert_array_equal(call(x), want)
    finally:
        qgemm.variant(0)


def test_the_kernel_step_matches_the_reference_with_and_without_the_library(native_lib, monkeypatch):
    """The registered kernel (memoized call included) gives the reference's bytes; with no library
    (OPTCLI_NATIVE=0 builds) it runs the reference."""
    from optcli import native
    from optcli.ops.registry import StepAttrs

    x, w, b, attrs = _case(np.random.default_rng(9), (6,), 40, 24, 0, 0, True)
    step = StepAttrs(attrs)
    want = qmatmul.reference(x, w, b, attrs)
    for _ in range(2):
        np.testing.assert_array_equal(qmatmul.qmatmul([x, w, b], step)[0], want)
    assert step.memo.get("qmatmul") is not None
    monkeypatch.setattr(native, "available", lambda: False)
    monkeypatch.setattr(native, "note_unavailable", lambda: None)
    np.testing.assert_array_equal(qmatmul.qmatmul([x, w, b], attrs)[0], want)


def test_a_qmatmul_fed_another_dtype_is_the_plans_fault():
    attrs = dict(x_scale=0.1, x_zero_point=0, w_scale=[0.1], y_scale=0.1, y_zero_point=0, qmin=0, qmax=255)
    w = np.ones((3, 2), np.int8)
    for x in (np.zeros((2, 3), np.float32), np.zeros((2, 4), np.uint8)):
        with pytest.raises(NbFormatError, match="corrupted or crafted"):
            qmatmul.qmatmul([x, w, None], attrs)


# ---- whole models against onnxruntime ----

def gemm_net(trans_b: int) -> onnx.ModelProto:
    """x [3, 24] -> Gemm (bias) -> Relu -> Gemm: a dense head, B transposed or not."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((24, 20)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((20, 11)) * 0.3).astype(np.float32)
    inits = {"w1": w1.T.copy() if trans_b else w1, "b1": (rng.standard_normal(20) * 0.3).astype(np.float32),
             "w2": w2.T.copy() if trans_b else w2, "b2": (rng.standard_normal(11) * 0.3).astype(np.float32)}
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w1", "b1"], ["g1"], transB=trans_b), n("Relu", ["g1"], ["r"]),
             n("Gemm", ["r", "w2", "b2"], ["y"], transB=trans_b)]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 11])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ort_fused(model: onnx.ModelProto, x: dict) -> np.ndarray:
    """onnxruntime with its QDQ fusions (QLinearMatMul, QGemm: integer kernels, their requantization)."""
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("model_fn, steps", [(dense_net, 3), (lambda: gemm_net(1), 2), (lambda: gemm_net(0), 2),
                                             (residual_cnn, 1)], ids=["matmul-N>1", "gemm-transB", "gemm", "cnn-head"])
def test_quantized_dense_layers_become_integer_steps_and_match_onnxruntime(tmp_path, model_fn, steps, per_channel):
    model = model_fn()
    qdq = quantized(model, "qdq", tmp_path, per_channel=per_channel)
    result = optcli.optimize(model=qdq, valid_targets="arm")
    assert qmatmul_steps(result.plan) == steps
    kinds = collections.Counter(s.op_type for s in result.plan.steps)
    assert kinds["MatMul"] == kinds["Gemm"] == kinds["FullyConnected"] == 0
    predictor = optcli.load(result.data)
    step = output_step(qdq)
    for seed in range(3):
        x = feeds(model, seed)
        ours = predictor.run(x)[model.graph.output[0].name]
        assert np.abs(ours - ort_run(qdq, x)[0]).max() <= step * 1.01
        assert np.abs(ours - _ort_fused(qdq, x)).max() <= step * 1.01


@pytest.mark.parametrize("model_fn, op, steps", [(dense_net, "QLinearMatMul", 3), (lambda: gemm_net(1), "QGemm", 2),
                                                 (lambda: gemm_net(0), "QGemm", 2)],
                         ids=["qlinearmatmul", "qgemm-transB", "qgemm"])
def test_qoperator_dense_layers_run_in_integers(tmp_path, model_fn, op, steps):
    """QLinearMatMul and onnxruntime's QGemm, which qoperator_to_qdq leaves as they are on host-only plans,
    become QMatMul steps with the same integers (their numpy kernels are onnxruntime's arithmetic)."""
    model = model_fn()
    qop = quantized(model, "qoperator", tmp_path)
    assert sum(n.op_type == op for n in qop.graph.node) == steps
    result = optcli.optimize(model=qop, valid_targets="arm")
    assert qmatmul_steps(result.plan) == steps
    predictor = optcli.load(result.data)
    unfused = optcli.load(optcli.optimize(model=qop, valid_targets="arm", disabled_passes=["fuse_qdq_matmul"]).data)
    for seed in range(3):
        x = feeds(model, seed)
        ours = predictor.run(x)["y"]
        np.testing.assert_array_equal(ours, unfused.run(x)["y"])
        assert np.abs(ours - ort_run(qop, x)[0]).max() <= output_step(qop) * 1.01


# ---- what the pass leaves to fold_qdq ----

def qdq_matmul(w_dtype=TensorProto.INT8, w_zp=0, w_axis=1, w_scales=1, op="MatMul", trans_a=0, alpha=1.0,
               extra_reader=False, quantize_out=True, w_rank=2, bias_shape=None, k=6, act=None) -> onnx.ModelProto:
    """x -> Q -> DQ -> MatMul/Gemm(DQ(W)) [-> Add bias] [-> Relu / Clip] -> Q -> DQ -> y, with knobs for each
    thing the pass must refuse."""
    m = 4
    rng = np.random.default_rng(0)
    w_np = rng.integers(-100, 100, ([2] if w_rank == 3 else []) + [k, m])
    w_np = w_np.astype(np.uint8 if w_dtype == TensorProto.UINT8 else np.int8)
    t = numpy_helper.from_array
    inits = [t(np.array(0.05, np.float32), "xs"), t(np.array(128, np.uint8), "xz"), t(w_np, "w"),
             t(np.full(w_scales, 0.01, np.float32) if w_scales > 1 else np.array(0.01, np.float32), "ws"),
             t((np.full(w_scales, w_zp) if w_scales > 1 else np.array(w_zp)).astype(w_np.dtype), "wz"),
             t(np.array(0.1, np.float32), "ys"), t(np.array(128, np.uint8), "yz")]
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), n("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             n("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=w_axis)]
    a = ["xd", "wd"]
    if op == "Gemm":
        nodes.append(n("Gemm", a, ["mm"], transA=trans_a, alpha=alpha))
    else:
        nodes.append(n("MatMul", a, ["mm"]))
    out = "mm"
    if bias_shape is not None:
        inits.append(t(np.ones(bias_shape, np.float32), "b"))
        nodes.append(n("Add", ["mm", "b"], ["mb"]))
        out = "mb"
    if act == "Relu":
        nodes.append(n("Relu", [out], ["act"]))
        out = "act"
    elif act == "Clip":
        inits += [t(np.array(-0.5, np.float32), "lo"), t(np.array(3.0, np.float32), "hi")]
        nodes.append(n("Clip", [out, "lo", "hi"], ["act"]))
        out = "act"
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if quantize_out:
        nodes += [n("QuantizeLinear", [out, "ys", "yz"], ["yq"]), n("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    else:
        nodes.append(n("Identity", [out], ["y"]))
    if extra_reader:
        nodes.append(n("Relu", [out], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    x_shape = [k, 3] if trans_a else [3, k]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _fused(model: onnx.ModelProto, targets: str = "arm") -> int:
    return fuse_qdq_matmul.run(read_model(model=model), PassContext(targets=parse_targets(targets)))["fused"]


def test_the_plain_chain_is_taken_and_runs_as_onnxruntime():
    assert _fused(qdq_matmul()) == 1
    assert _fused(qdq_matmul(op="Gemm")) == 1
    assert _fused(qdq_matmul(bias_shape=[4])) == 1
    assert _fused(qdq_matmul(w_scales=4)) == 1


@pytest.mark.parametrize("act", [None, "Relu", "Clip"])
def test_the_chain_with_bias_and_clamp_runs_as_onnxruntime(act):
    """A float bias Add and a Relu / Clip(-0.5, 3) before an output zero point of 128: the clamp [qmin, qmax]
    is what keeps the negative half out."""
    model = qdq_matmul(w_scales=4, bias_shape=[4], act=act)
    result = optcli.optimize(model=model, valid_targets="arm")
    assert qmatmul_steps(result.plan) == 1
    x = {"x": np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32) * 4}
    ours, theirs = optcli.load(result.data).run(x)["y"], ort_run(model, x)[0]
    assert np.abs(ours - theirs).max() <= 0.1 * 1.01
    lowest = {"Relu": 0.0, "Clip": -0.5}.get(act)
    assert theirs.min() == np.float32(lowest) if act else theirs.min() < -0.5  # the clamp is reached


@pytest.mark.parametrize("knobs", [
    dict(w_dtype=TensorProto.UINT8),  # not int8 weights
    dict(w_zp=3),  # asymmetric weights
    dict(w_scales=4, w_axis=0, k=4),  # per-channel along K
    dict(op="Gemm", trans_a=1),
    dict(op="Gemm", alpha=2.0),
    dict(extra_reader=True),  # the MatMul's output read by another op too
    dict(quantize_out=False),  # a float output
    dict(w_rank=3),  # batched weights
    dict(bias_shape=[3, 4]),  # a bias that is not one per output column
], ids=["u8-weights", "weight-zero-point", "per-k-scales", "transA", "alpha", "second-reader", "float-output",
        "3-d-weights", "2-d-bias"])
def test_what_the_step_cannot_take_is_left_to_fold_qdq(knobs):
    model = qdq_matmul(**knobs)
    graph = read_model(model=model)
    before = collections.Counter(n.op_type for n in graph.nodes)
    assert fuse_qdq_matmul.run(graph, PassContext(targets=parse_targets("arm")))["fused"] == 0
    assert collections.Counter(n.op_type for n in graph.nodes) == before
    result = optcli.optimize(model=model, valid_targets="arm")
    assert qmatmul_steps(result.plan) == 0


def test_plans_with_a_gpu_target_keep_the_float_view():
    assert _fused(qdq_matmul(), "opencl,arm") == 0
    assert _fused(qdq_matmul(), "arm") == 1


# ---- crafted files ----

@pytest.fixture(scope="module")
def qmatmul_nb(tmp_path_factory):
    qdq = quantized(gemm_net(1), "qdq", tmp_path_factory.mktemp("qdq"))
    return optcli.optimize(model=qdq, valid_targets="arm").data


def _tamper(data: bytes, **attrs) -> bytes:
    body, blob = parts(data)
    step = next(s for s in body["steps"] if s["op"] == "QMatMul")
    step["attrs"].update(attrs)
    return rebuild(body, blob)


@pytest.mark.parametrize("attrs, message", crafted_quant_attrs(20))
def test_crafted_scales_and_zero_points_are_refused_at_load(qmatmul_nb, attrs, message):
    optcli.load(qmatmul_nb)  # the untouched file loads
    with pytest.raises(NbFormatError, match=message):
        optcli.load(_tamper(qmatmul_nb, **attrs))


def test_a_missing_scale_is_refused_at_load(qmatmul_nb):
    body, blob = parts(qmatmul_nb)
    del next(s for s in body["steps"] if s["op"] == "QMatMul")["attrs"]["y_scale"]
    with pytest.raises(NbFormatError, match="required attribute 'y_scale'"):
        optcli.load(rebuild(body, blob))


@pytest.mark.parametrize("which, dtype", [(1, "uint8"), (1, "bool"), (2, "uint32"), (2, "float32")])
def test_crafted_weight_and_bias_dtypes_are_refused_at_load(qmatmul_nb, which, dtype):
    body, blob = parts(qmatmul_nb)
    name = next(s for s in body["steps"] if s["op"] == "QMatMul")["inputs"][which]
    for entry in body["weights"]:
        if entry["name"] == name:
            entry["dtype"] = dtype
    with pytest.raises(NbFormatError, match="weight must be a constant int8" if which == 1 else "bias must be"):
        optcli.load(rebuild(body, blob))


def test_the_c_entry_point_refuses_what_makes_no_call(native_lib):
    """optcli_qmatmul_rows validates what it is given: residual starts that run backwards or entries naming a quad
    past K (offsets it would read at), sizes out of range, zero points and clamps outside their dtypes, a split
    flag other than 0 / 1: OPT_EINVAL, never a read out of bounds."""
    x, w, b, attrs = _case(np.random.default_rng(3), (3,), 13, 20, 0, 0, True)
    weights, aux = qgemm.pack_columns(w, b, split=True)
    mult = qmatmul.multiplier(attrs, 20)
    y = np.empty((3, 20), np.uint8)
    fn = native_lib.function("optcli_qmatmul_rows")
    dims, qp = np.array([3, 13, 20, 1], np.int64), np.array([7, 0, 0, 255, 0, 0], np.int32)
    assert fn(x, weights, aux, mult, y, dims, qp) == 0
    starts = 2 * 20  # after the column sums and the bias: 2 tiles' starts, then the entries
    assert aux[starts + 2] > 1  # the case has residual entries to corrupt
    backwards, past = aux.copy(), aux.copy()
    backwards[starts + 1] = aux[starts + 2] + 1
    past[starts + 3] = 4  # quad 4 of K = 13 (quads 0-3)
    for bad in (backwards, past):
        assert fn(x, weights, bad, mult, y, dims, qp) == -1
    for d in ([3, 0, 20, 1], [3, 65537, 20, 1], [3, 13, 0, 1], [-1, 13, 20, 1], [3, 13, 20, 2]):
        assert fn(x, weights, aux, mult, y, np.array(d, np.int64), qp) == -1
    for q in ([256, 0, 0, 255, 0, 0], [7, 0, 10, 5, 0, 0], [7, -1, 0, 255, 0, 0], [7, 0, 0, 255, 2, 0],
              [-129, 0, -128, 127, 1, 1], [7, 0, 0, 200, 0, 1]):
        assert fn(x, weights, aux, mult, y, dims, np.array(q, np.int32)) == -1
