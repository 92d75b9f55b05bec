"""The float islands of a QDQ model in integers (issue 26): ``passes/fuse_qdq_lookup.py`` (optcli.QLookup, a byte
table of a float subgraph of one quantized tensor) and ``passes/fuse_qdq_se.py`` (optcli.QMul, the squeeze-excite
multiply by a per-channel gate, and optcli.QGlobalAveragePool), on small hand-built QDQ graphs: the plans'
steps, their outputs against the plan without these passes (the float island it ran) and against onnxruntime
running the graph as written; the native kernels against their numpy references; crafted tables and
parameters refused at load."""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError
from optcli.frontend.onnx_reader import read_model
from optcli.native import library, qelementwise
from optcli.ops import qlookup, qmul
from optcli.passes import fuse_qdq_lookup, fuse_qdq_se, pipeline
from optcli.passes.base import PassContext
from optcli.targets import parse_targets
from tests.helpers import run_ort
from tests.quant.quantized_models import ort_run
from tests.reliability.nbfuzz import parts, rebuild

DTYPES = {"u8": np.uint8, "s8": np.int8}


class QdqGraph:
    """A QDQ graph written node by node, as onnxruntime's quantizer writes them."""

    def __init__(self, dtype: str = "u8") -> None:
        self.dtype = DTYPES[dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.count = 0

    def _name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, value) -> str:
        name = self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def input(self, shape) -> str:
        name = self._name("in")
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def op(self, op: str, *inputs: str, **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def q(self, x: str, scale: float, zp: int) -> str:
        return self.op("QuantizeLinear", x, self.const(np.float32(scale)), self.const(self.dtype(zp)))

    def dq(self, xq: str, scale: float, zp: int) -> str:
        return self.op("DequantizeLinear", xq, self.const(np.float32(scale)), self.const(self.dtype(zp)))

    def qdq(self, x: str, scale: float, zp: int) -> str:
        return self.dq(self.q(x, scale, zp), scale, zp)

    def model(self, *outputs: str) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "islands", self.inputs, outs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _zp(dtype: str, value: int) -> int:
    return value - 128 if dtype == "s8" else value


def _plans(model: onnx.ModelProto):
    """The plan with the island passes and without them (the float islands as the plan ran them before)."""
    new = optcli.optimize(model=model, valid_targets="arm")
    keep = list(pipeline.PASSES)
    pipeline.PASSES[:] = [p for p in keep if p not in (fuse_qdq_lookup, fuse_qdq_se)]
    try:
        old = optcli.optimize(model=model, valid_targets="arm")
    finally:
        pipeline.PASSES[:] = keep
    return new, old


def _kinds(result) -> list[str]:
    return [s.op_type for s in result.plan.steps]


def _feeds(model: onnx.ModelProto, seed: int = 0, spread: float = 3.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * spread)
            .astype(np.float32) for i in model.graph.input}


def _within_a_step(ours: np.ndarray, theirs: np.ndarray, step: float) -> None:
    assert np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max() <= step * 1.0001


def _check_against_float_and_onnxruntime(model: onnx.ModelProto, new, old, out_step: float, seeds=range(3)) -> None:
    """The table is exact: the bytes of the float island the plan ran before (compared after the same final
    DequantizeLinear, so equal floats), and within a quantization step of onnxruntime on the graph as written."""
    p_new, p_old = optcli.load(new.data), optcli.load(old.data)
    for seed in seeds:
        feeds = _feeds(model, seed)
        ours, before = p_new.run(feeds), p_old.run(feeds)
        theirs = ort_run(model, feeds)
        for k, (name, value) in enumerate(ours.items()):
            np.testing.assert_array_equal(value, before[name])
            _within_a_step(value, theirs[k], out_step)


def hard_swish(g: QdqGraph, a: str, s_in: float, dtype: str) -> str:
    """onnxruntime's quantized HardSwish (opset < 14 exports): DQ(a) -> HardSigmoid -> Q/DQ -> Mul(DQ(a), .) -> Q."""
    x = g.dq(a, s_in, _zp(dtype, 100))
    hs = g.qdq(g.op("HardSigmoid", x, alpha=1 / 6, beta=0.5), 1 / 255, _zp(dtype, 0))
    return g.q(g.op("Mul", x, hs), 0.03, _zp(dtype, 20))


@pytest.mark.parametrize("dtype", ["u8", "s8"])
def test_hard_swish_becomes_one_lookup(dtype):
    g = QdqGraph(dtype)
    a = g.q(g.input([1, 8, 6, 7]), 0.05, _zp(dtype, 100))
    y = g.dq(hard_swish(g, a, 0.05, dtype), 0.03, _zp(dtype, 20))
    model = g.model(y)
    new, old = _plans(model)
    assert _kinds(new) == ["QuantizeLinear", "QLookup", "DequantizeLinear"]
    assert "HardSigmoid" in _kinds(old) and "QLookup" not in _kinds(old)
    table = new.plan.weights[new.plan.steps[1].inputs[1]]
    assert table.shape == (256,) and table.dtype == DTYPES[dtype]
    _check_against_float_and_onnxruntime(model, new, old, 0.03)


@pytest.mark.parametrize("dtype", ["u8", "s8"])
def test_torchs_hard_swish_becomes_one_lookup(dtype):
    """x * clip(x + 3, 0, 6) / 6 as torch exports it and onnxruntime quantizes it: the 3 a quantized constant
    (DequantizeLinear of an initializer), the Clip folded into the Q/DQ after the Add, the 6 a float."""
    g = QdqGraph(dtype)
    a = g.q(g.input([1, 5, 9, 4]), 0.04, _zp(dtype, 120))
    x = g.dq(a, 0.04, _zp(dtype, 120))
    three = g.dq(g.const(DTYPES[dtype](_zp(dtype, 255))), 3 / 255 if dtype == "u8" else 3 / 127,
                 _zp(dtype, 0 if dtype == "u8" else 128))
    clip = g.qdq(g.op("Add", x, three), 6 / 255, _zp(dtype, 0))
    mul = g.qdq(g.op("Mul", x, clip), 0.2, _zp(dtype, 10))
    y = g.dq(g.q(g.op("Div", mul, g.const(np.float32(6))), 0.035, _zp(dtype, 10)), 0.035, _zp(dtype, 10))
    model = g.model(y)
    new, old = _plans(model)
    assert _kinds(new) == ["QuantizeLinear", "QLookup", "DequantizeLinear"]
    assert {"Add", "Mul", "Div"} <= set(_kinds(old))
    _check_against_float_and_onnxruntime(model, new, old, 0.035)


def test_an_island_read_twice_gives_one_table_to_both_readers():
    """The hard-swish bytes feed a squeeze-excite pool and its Mul (and the model's output): one table."""
    g = QdqGraph()
    a = g.q(g.input([1, 6, 5, 5]), 0.05, 100)
    hsq = hard_swish(g, a, 0.05, "u8")
    feature = g.dq(hsq, 0.03, 20)
    pooled = g.dq(g.q(g.op("GlobalAveragePool", feature), 0.02, 30), 0.02, 30)
    y = g.dq(g.q(g.op("Mul", feature, pooled), 0.01, 5), 0.01, 5)
    model = g.model(y, feature)
    new, old = _plans(model)
    kinds = _kinds(new)
    assert kinds.count("QLookup") == 1 and "HardSigmoid" not in kinds and "Mul" not in kinds
    assert kinds.count("QMul") == 1 and kinds.count("QGlobalAveragePool") == 1
    p_new, p_old = optcli.load(new.data), optcli.load(old.data)
    for seed in range(3):
        feeds = _feeds(model, seed)
        ours, before, theirs = p_new.run(feeds), p_old.run(feeds), ort_run(model, feeds)
        np.testing.assert_array_equal(ours[feature], before[feature])  # the table's bytes
        _within_a_step(ours[y], theirs[0], 0.01)  # the pool and Mul in integers: within a step
        _within_a_step(ours[feature], theirs[1], 0.03)


def test_a_float_value_the_island_shares_stays_float():
    """A value inside the island that something outside reads as floats (here the graph's output) keeps the
    float ops that make it; the quantized exit still becomes a table."""
    g = QdqGraph()
    a = g.q(g.input([1, 4, 3, 5]), 0.05, 128)
    s = g.op("Sigmoid", g.dq(a, 0.05, 128))
    y = g.dq(g.q(g.op("Mul", s, g.const(np.float32(2.0))), 1 / 128, 0), 1 / 128, 0)
    model = g.model(y, s)
    new, old = _plans(model)
    kinds = _kinds(new)
    assert kinds.count("QLookup") == 1 and "Sigmoid" in kinds and "Mul" not in kinds
    _check_against_float_and_onnxruntime(model, new, old, 1 / 128)


@pytest.mark.parametrize("dtype", ["u8", "s8"])
def test_an_island_of_two_dynamic_inputs_stays_float(dtype):
    """Mul(DQ(a), DQ(b)) of two tensors of one shape is no function of one byte: no table, no QMul."""
    g = QdqGraph(dtype)
    a = g.dq(g.q(g.input([1, 4, 6, 6]), 0.05, _zp(dtype, 128)), 0.05, _zp(dtype, 128))
    b = g.dq(g.q(g.input([1, 4, 6, 6]), 0.04, _zp(dtype, 128)), 0.04, _zp(dtype, 128))
    y = g.dq(g.q(g.op("Mul", g.op("HardSigmoid", a), b), 0.02, _zp(dtype, 128)), 0.02, _zp(dtype, 128))
    new, _ = _plans(g.model(y))
    kinds = _kinds(new)
    assert "QLookup" not in kinds and "QMul" not in kinds and "Mul" in kinds and "HardSigmoid" in kinds


def test_a_per_channel_constant_stays_float():
    """A constant of more than one value differs by channel: the island is no function of the byte alone."""
    g = QdqGraph()
    a = g.dq(g.q(g.input([1, 3, 4, 4]), 0.05, 128), 0.05, 128)
    scale = g.const(np.array([1.0, 2.0, 3.0], np.float32).reshape(1, 3, 1, 1))
    y = g.dq(g.q(g.op("Relu", g.op("Mul", a, scale)), 0.05, 0), 0.05, 0)
    new, _ = _plans(g.model(y))
    assert "QLookup" not in _kinds(new)


@pytest.mark.parametrize("dtype", ["u8", "s8"])
def test_squeeze_excite_pool_and_multiply_in_integers(dtype):
    """DQ -> GlobalAveragePool -> Q and Mul(DQ(feature map), DQ(gate [N, C, 1, 1])) -> Q: within one
    quantization step of the float island (onnxruntime running the QDQ graph as written)."""
    g = QdqGraph(dtype)
    a = g.q(g.input([2, 6, 7, 9]), 0.05, _zp(dtype, 110))
    gate = g.q(g.input([2, 6, 1, 1]), 0.01, _zp(dtype, 0))
    feature = g.dq(a, 0.05, _zp(dtype, 110))
    pooled = g.dq(g.q(g.op("GlobalAveragePool", feature), 0.004, _zp(dtype, 100)), 0.004, _zp(dtype, 100))
    y = g.dq(g.q(g.op("Mul", g.dq(gate, 0.01, _zp(dtype, 0)), feature), 0.03, _zp(dtype, 90)), 0.03,
             _zp(dtype, 90))
    model = g.model(y, pooled)
    new, old = _plans(model)
    kinds = _kinds(new)
    assert kinds.count("QMul") == 1 and kinds.count("QGlobalAveragePool") == 1
    assert "Mul" not in kinds and "GlobalAveragePool" not in kinds
    predictor = optcli.load(new.data)
    for seed in range(4):
        feeds = _feeds(model, seed, spread=2.0)
        ours, theirs = predictor.run(feeds), ort_run(model, feeds)
        _within_a_step(ours[y], theirs[0], 0.03)
        _within_a_step(ours[pooled], theirs[1], 0.004)


def test_gpu_plans_keep_the_float_islands():
    g = QdqGraph()
    a = g.q(g.input([1, 8, 6, 7]), 0.05, 100)
    feature = g.dq(hard_swish(g, a, 0.05, "u8"), 0.03, 20)
    pooled = g.dq(g.q(g.op("GlobalAveragePool", feature), 0.02, 30), 0.02, 30)
    graph = read_model(model=g.model(g.dq(g.q(g.op("Mul", feature, pooled), 0.01, 5), 0.01, 5)))
    before = collections.Counter(n.op_type for n in graph.nodes)
    gpu = PassContext(targets=parse_targets("opencl,arm"))
    assert fuse_qdq_lookup.run(graph, gpu) == {"tables": 0} and fuse_qdq_se.run(graph, gpu) == {"pools": 0, "muls": 0}
    assert collections.Counter(n.op_type for n in graph.nodes) == before
    host = PassContext(targets=parse_targets("arm"))
    assert fuse_qdq_lookup.run(graph, host) == {"tables": 1} and fuse_qdq_se.run(graph, host) == {"pools": 1, "muls": 1}


# ----------------------------------------------------------------------------- the kernels

SIZES = [0, 1, 3, 63, 64, 65, 127, 129, 1000, 16384 * 2 + 5]


@pytest.mark.parametrize("path", [1, 0])
@pytest.mark.parametrize("x_dtype, t_dtype", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8),
                                              (np.int8, np.int8)])
def test_native_lookup_equals_numpy(native_lib, path, x_dtype, t_dtype):
    """Both paths (1 the portable loop; 0 by the CPU: AVX-512 VBMI where there is, its masked tail included) on
    sizes around its 64-byte steps and the 16384-element work items."""
    rng = np.random.default_rng(path)
    table = rng.integers(0, 256, 256).astype(np.uint8).view(t_dtype)
    before = qelementwise.lookup_variant(-1)
    try:
        assert qelementwise.lookup_variant(path) in (1, 2)
        for n in SIZES:
            x = rng.integers(0, 256, n).astype(np.uint8).view(x_dtype)
            got = qlookup.qlookup([x, table], {})[0]
            np.testing.assert_array_equal(got, qlookup.reference(x, table))
            np.testing.assert_array_equal(got.view(np.uint8), table.view(np.uint8)[x.view(np.uint8)])
    finally:
        qelementwise.lookup_variant(0 if before == 2 else before)


def test_lookup_of_a_strided_tensor_and_without_the_library(monkeypatch):
    rng = np.random.default_rng(7)
    table = rng.integers(0, 256, 256).astype(np.uint8)
    x = rng.integers(0, 256, (2, 3, 9, 10)).astype(np.uint8)[:, :, ::2]
    want = table[x]
    np.testing.assert_array_equal(qlookup.qlookup([x, table], {})[0], want)
    monkeypatch.setattr(library, "_lib", None)
    np.testing.assert_array_equal(qlookup.qlookup([x, table], {})[0], want)


def _se_attrs(rng, x_signed=0, g_signed=0, y_signed=0, zps=None):
    def zp(signed):
        return int(rng.integers(-128, 128)) if signed else int(rng.integers(0, 256))

    xz, gz, yz = zps if zps else (zp(x_signed), zp(g_signed), zp(y_signed))
    lo, hi = (-128, 127) if y_signed else (0, 255)
    xs, gs = float(10 ** rng.uniform(-3, 0)), float(10 ** rng.uniform(-3, -1))
    return {"x_scale": xs, "x_zero_point": xz, "x_signed": x_signed, "g_scale": gs, "g_zero_point": gz,
            "g_signed": g_signed, "y_scale": xs * gs * float(rng.uniform(40, 200)), "y_zero_point": yz,
            "y_signed": y_signed, "qmin": lo, "qmax": hi}


def _pool_attrs(attrs: dict, rng) -> dict:
    """The attributes of a QGlobalAveragePool of QMul's input: a mean keeps the input's range."""
    out = {k: v for k, v in attrs.items() if not k.startswith("g_")}
    out["y_scale"] = attrs["x_scale"] * float(rng.uniform(2.5, 4))  # |mean - x_zp| < 256: inside the range
    out["y_zero_point"] = 0 if attrs["y_signed"] else 128
    return out


def _bytes(rng, shape, signed):
    return rng.integers(0, 256, shape).astype(np.uint8).view(np.int8 if signed else np.uint8)


SE_SHAPES = [(1, 3, 5, 7), (2, 5, 1, 1), (1, 16, 14, 14), (1, 1, 130, 131), (3, 2, 4), (1, 0, 3, 3)]


@pytest.mark.parametrize("signs", [(0, 0, 0), (1, 1, 1), (0, 1, 0), (1, 0, 1)])
def test_native_qmul_and_qpool_equal_their_references(native_lib, signs):
    rng = np.random.default_rng(sum(signs))
    for shape in SE_SHAPES:
        attrs = _se_attrs(rng, *signs)
        x = _bytes(rng, shape, signs[0])
        gate = _bytes(rng, (*shape[:2], *([1] * (len(shape) - 2))), signs[1])
        got = qmul.qmul([x, gate], attrs)[0]
        np.testing.assert_array_equal(got, qmul.mul_reference(x, gate, attrs))
        pool_attrs = _pool_attrs(attrs, rng)
        pooled = qmul.qglobal_average_pool([x], pool_attrs)[0]
        np.testing.assert_array_equal(pooled, qmul.gap_reference(x, pool_attrs))
        if x.size > 100:  # (the parameters give outputs inside the range, not all saturated)
            assert np.any((got != attrs["qmin"]) & (got != attrs["qmax"]))
            assert np.any((pooled != attrs["qmin"]) & (pooled != attrs["qmax"]))


@pytest.mark.parametrize("zps", [(0, 0, 0), (255, 255, 255), (0, 255, 128)])
def test_extreme_zero_points_and_a_relu_clamp(native_lib, zps):
    rng = np.random.default_rng(11)
    attrs = _se_attrs(rng, zps=zps)
    attrs["qmin"] = zps[2]
    x, gate = _bytes(rng, (1, 8, 20, 21), 0), _bytes(rng, (1, 8, 1, 1), 0)
    got = qmul.qmul([x, gate], attrs)[0]
    np.testing.assert_array_equal(got, qmul.mul_reference(x, gate, attrs))
    assert got.min() >= zps[2]


def test_without_the_library_the_references_run(monkeypatch):
    rng = np.random.default_rng(5)
    attrs = _se_attrs(rng)
    x, gate = _bytes(rng, (1, 4, 5, 6), 0), _bytes(rng, (1, 4, 1, 1), 0)
    monkeypatch.setattr(library, "_lib", None)
    np.testing.assert_array_equal(qmul.qmul([x, gate], attrs)[0], qmul.mul_reference(x, gate, attrs))
    pool_attrs = _pool_attrs(attrs, rng)
    np.testing.assert_array_equal(qmul.qglobal_average_pool([x], pool_attrs)[0], qmul.gap_reference(x, pool_attrs))


def test_a_step_prepares_its_calls_once(native_lib):
    from optcli.ops.registry import StepAttrs

    rng = np.random.default_rng(9)
    attrs = _se_attrs(rng)
    pool_attrs = StepAttrs(_pool_attrs(attrs, rng))
    mul_attrs, lookup_attrs = StepAttrs(attrs), StepAttrs({})
    table = rng.integers(0, 256, 256).astype(np.uint8)
    for seed in range(2):  # the first call prepares, the second takes the prepared path
        x, gate = _bytes(np.random.default_rng(seed), (1, 4, 5, 6), 0), _bytes(rng, (1, 4, 1, 1), 0)
        np.testing.assert_array_equal(qmul.qmul([x, gate], mul_attrs)[0], qmul.mul_reference(x, gate, attrs))
        np.testing.assert_array_equal(qmul.qglobal_average_pool([x], pool_attrs)[0],
                                      qmul.gap_reference(x, pool_attrs))
        np.testing.assert_array_equal(qlookup.qlookup([x, table], lookup_attrs)[0], table[x])
    assert "qmul" in mul_attrs.memo and "qgap" in pool_attrs.memo and "qlookup" in lookup_attrs.memo


def test_equal_onnxruntime_qlinearmul_and_qlinearglobalaveragepool_within_a_step():
    rng = np.random.default_rng(2)
    for _ in range(4):
        attrs = _se_attrs(rng)
        x, gate = _bytes(rng, (1, 16, 9, 9), 0), _bytes(rng, (1, 16, 1, 1), 0)
        pool_attrs = _pool_attrs(attrs, rng)
        f32, u8 = np.float32, np.uint8
        inits = {"sx": f32(attrs["x_scale"]), "zx": u8(attrs["x_zero_point"]), "sg": f32(attrs["g_scale"]),
                 "zg": u8(attrs["g_zero_point"]), "sy": f32(attrs["y_scale"]), "zy": u8(attrs["y_zero_point"])}
        for op, names, feeds, ours in [
            ("QLinearMul", ["x", "sx", "zx", "g", "sg", "zg", "sy", "zy"], {"x": x, "g": gate},
             qmul.qmul([x, gate], attrs)[0]),
            ("QLinearGlobalAveragePool", ["x", "sx", "zx", "sp", "zp"], {"x": x},
             qmul.qglobal_average_pool([x], pool_attrs)[0])]:
            inits.update(sp=f32(pool_attrs["y_scale"]), zp=u8(pool_attrs["y_zero_point"]))
            model = _contrib_model(op, names, feeds, {k: v for k, v in inits.items() if k in names})
            theirs = run_ort(model, feeds)[0]
            assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1, op


def _contrib_model(op: str, names: list[str], feeds: dict, inits: dict) -> onnx.ModelProto:
    node = helper.make_node(op, names, ["y"], domain="com.microsoft", **(
        {"channels_last": 0} if op == "QLinearGlobalAveragePool" else {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, TensorProto.UINT8, v.shape)
                                            for k, v in feeds.items()],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_a_kernel_fed_another_dtype_is_the_plans_fault():
    table = np.zeros(256, np.uint8)
    with pytest.raises(NbFormatError, match="corrupted or crafted"):
        qlookup.qlookup([np.zeros(4, np.float32), table], {})
    with pytest.raises(NbFormatError, match="corrupted or crafted"):
        qlookup.qlookup([np.zeros(4, np.uint8), np.zeros(255, np.uint8)], {})
    attrs = _se_attrs(np.random.default_rng(0))
    with pytest.raises(NbFormatError, match="corrupted or crafted"):
        qmul.qmul([np.zeros((1, 2, 3, 3), np.uint8), np.zeros((1, 2, 3, 3), np.uint8)], attrs)
    with pytest.raises(NbFormatError, match="corrupted or crafted"):
        qmul.qglobal_average_pool([np.zeros((1, 2, 3, 3), np.int8)], attrs)


# ----------------------------------------------------------------------------- crafted files

@pytest.fixture(scope="module")
def se_nb() -> bytes:
    """A plan with a QLookup, a QMul and a QGlobalAveragePool."""
    g = QdqGraph()
    a = g.q(g.input([1, 6, 5, 5]), 0.05, 100)
    feature = g.dq(hard_swish(g, a, 0.05, "u8"), 0.03, 20)
    pooled = g.dq(g.q(g.op("GlobalAveragePool", feature), 0.02, 30), 0.02, 30)
    y = g.dq(g.q(g.op("Mul", feature, pooled), 0.01, 5), 0.01, 5)
    data = optcli.optimize(model=g.model(y), valid_targets="arm").data
    body, _ = parts(data)
    assert {"QLookup", "QMul", "QGlobalAveragePool"} <= {s["op"] for s in body["steps"]}
    return data


@pytest.mark.parametrize("dtype, shape", [("int16", [128]), ("float32", [64]), ("uint8", [2, 128]),
                                          ("bool", [256])])
def test_crafted_tables_are_refused_at_load(se_nb, dtype, shape):
    """The table described with another dtype or shape over the same bytes: refused at load, not read by the
    kernel as 256 bytes (a bool table would pass as bytes)."""
    optcli.load(se_nb)  # the file as written loads
    body, blob = parts(se_nb)
    name = next(s for s in body["steps"] if s["op"] == "QLookup")["inputs"][1]
    entry = next(e for e in body["weights"] if e["name"] == name)
    entry.update(dtype=dtype, shape=shape)
    with pytest.raises(NbFormatError, match="QLookup's table must be a constant uint8 or int8 tensor of 256"):
        optcli.load(rebuild(body, blob))


@pytest.mark.parametrize("op, attrs, message", [
    ("QMul", {"g_scale": 0.0}, "positive finite scales"),
    ("QMul", {"x_scale": math.inf}, "positive finite scales"),
    ("QMul", {"x_scale": 1e30, "g_scale": 1e30, "y_scale": 1e-30}, "positive finite scales|multiplier"),
    ("QMul", {"g_zero_point": 300}, "'g_zero_point' 300 is outside"),
    ("QMul", {"qmin": 9, "qmax": 2}, "qmin and qmax"),
    ("QMul", {"g_signed": 2}, "'g_signed' must be 0 or 1"),
    ("QGlobalAveragePool", {"y_scale": -1.0}, "positive finite scales"),
    ("QGlobalAveragePool", {"x_zero_point": -1}, "'x_zero_point' -1 is outside"),
    ("QGlobalAveragePool", {"qmax": 256}, "qmin and qmax"),
])
def test_crafted_parameters_are_refused_at_load(se_nb, op, attrs, message):
    body, blob = parts(se_nb)
    next(s for s in body["steps"] if s["op"] == op)["attrs"].update(attrs)
    with pytest.raises(NbFormatError, match=message):
        optcli.load(rebuild(body, blob))


def test_a_missing_parameter_is_refused_at_load(se_nb):
    body, blob = parts(se_nb)
    del next(s for s in body["steps"] if s["op"] == "QMul")["attrs"]["g_scale"]
    with pytest.raises(NbFormatError, match="required attribute 'g_scale' is missing"):
        optcli.load(rebuild(body, blob))


# ----------------------------------------------------------------------------- a whole model

class _Calibration:
    def __init__(self, name: str, shape: list[int]):
        rng = np.random.default_rng(0)
        self.feeds = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.feeds, None)


def test_a_quantized_mobilenet_v3_runs_its_islands_in_integers(tmp_path):
    """The zoo's MobileNetV3 (hard-swish, squeeze-excite), pre-processed and quantized as bench_int8 does: no
    float op is left between its QConv steps, and its output is within a quantization step of onnxruntime
    running the QDQ graph as written."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from optcli.zoo import build
    from tests.quant.quantized_models import quiet_quantizer

    model = build("mobilenet_v3", resolution=64, width=0.5)
    onnx.save(model, tmp_path / "raw.onnx")
    quant_pre_process(str(tmp_path / "raw.onnx"), str(tmp_path / "fp32.onnx"), skip_symbolic_shape=True)
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    reader = type("Reader", (_Calibration, CalibrationDataReader), {})(inp.name, shape)
    with quiet_quantizer():
        quantize_static(str(tmp_path / "fp32.onnx"), str(tmp_path / "qdq.onnx"), reader,
                        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
    qdq = onnx.load(str(tmp_path / "qdq.onnx"))
    result = optcli.optimize(model=qdq, valid_targets="arm")
    kinds = collections.Counter(_kinds(result))
    assert kinds["QLookup"] > 0 and kinds["QMul"] > 0 and kinds["QGlobalAveragePool"] > 0
    # (the classifier's Flatten keeps a FakeQuant before its float FullyConnected: no island, a data move)
    assert not {"HardSigmoid", "Mul", "Div", "Add", "GlobalAveragePool"} & set(kinds) and kinds["FakeQuant"] <= 1
    step = float(numpy_helper.to_array(next(i for i in qdq.graph.initializer if i.name == next(
        n for n in reversed(qdq.graph.node) if n.op_type == "DequantizeLinear").input[1])))
    predictor = optcli.load(result.data)
    for seed in range(2):
        x = {inp.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
        ours = predictor.run(x)[qdq.graph.output[0].name]
        _within_a_step(ours, ort_run(qdq, x)[0], step)


def test_ties_round_half_to_even(native_lib):
    """Multipliers of exactly 1/2 make every odd product or sum a tie: onnxruntime rounds them to even."""
    x = np.arange(256, dtype=np.uint8).reshape(1, 2, 8, 16)
    gate = np.array([1, 3], np.uint8).reshape(1, 2, 1, 1)
    attrs = {"x_scale": 1.0, "x_zero_point": 0, "x_signed": 0, "g_scale": 1.0, "g_zero_point": 0, "g_signed": 0,
             "y_scale": 2.0 * 8, "y_zero_point": 0, "y_signed": 0, "qmin": 0, "qmax": 255}
    got = qmul.qmul([x, gate], attrs)[0]
    np.testing.assert_array_equal(got, np.rint(x.astype(np.float64) * gate / 16).clip(0, 255))
    assert np.array_equal(got.reshape(-1)[1:4], [0, 0, 0]) and got.reshape(-1)[24] == 2  # 1/16, ..., 24/16 = 1.5
    pairs = np.arange(2 * 256 * 2, dtype=np.int64).reshape(1, 256, 2, 2) % 251
    x2 = pairs.astype(np.uint8)[..., :1]  # two pixels per channel: the mean of an odd sum is a tie
    pool = {"x_scale": 1.0, "x_zero_point": 0, "x_signed": 0, "y_scale": 1.0, "y_zero_point": 0, "y_signed": 0,
            "qmin": 0, "qmax": 255}
    sums = x2.astype(np.int64).sum(axis=(2, 3))
    np.testing.assert_array_equal(qmul.qglobal_average_pool([np.ascontiguousarray(x2)], pool)[0].reshape(1, -1),
                                  np.rint(sums / 2))
    assert np.any(sums % 2 == 1)
