"""The host's quantized kernels give onnxruntime's results to the bit, ties included.

onnxruntime rounds in float32 (MLAS): ``x / scale`` for QuantizeLinear, ``float(acc) *
(x_scale * w_scale / y_scale)`` for the requantization of QLinearConv / QLinearMatMul, scale
ratios folded into one multiply-add for QLinearAdd.  A float64 evaluation of the same formulas
lands on the other side of a .5 tie now and then, and in a quantized shape computation (run-time
'same' padding) one step is a different pad size.  Each case is built to hit ties.

Where the CPU has AVX2 but no VNNI, onnxruntime multiplies u8 x s8 with vpmaddubsw, whose pairs of
products saturate at int16: its integer sums are wrong there (QLinearMatMul differed in 7 of 15
values on a 2-core AMD EPYC).  Its u8 x u8 products are exact on every CPU, so there onnxruntime
gets the same real weights as uint8 (``w + 128``, zero point ``+ 128``: the same integers
``w - zero point``) and must still agree with ours, on the s8 weights, to the bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from optcli.ir import Node
from optcli.ops.evaluate import evaluate_node

MS = "com.microsoft"
RNG = np.random.default_rng(5)


def _tensor(name: str, dtype: np.dtype, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def _ort(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], out_dtypes: list,
         domain: str = "", **attrs) -> list[np.ndarray]:
    """One node in onnxruntime; outputs declared with the dtypes ours produce (a mismatch fails)."""
    names = [*inputs, *consts]
    outs = [f"y{i}" for i in range(len(out_dtypes))]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [_tensor(k, v.dtype, v.shape) for k, v in inputs.items()],
        [_tensor(o, d) for o, d in zip(outs, out_dtypes)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def _ours(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], n_outputs: int = 1,
          domain: str = "", **attrs) -> list[np.ndarray]:
    node = Node(op, [*inputs, *consts], [f"y{i}" for i in range(n_outputs)], attrs, "n", domain)
    return [np.asarray(v) for v in evaluate_node(node, [*inputs.values(), *consts.values()], {"": 19})]


def _s8_products_exact() -> bool:
    """Whether onnxruntime's u8 x s8 products are exact here: VNNI, or no AVX2 path at all (x86 Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return bool({"avx512_vnni", "avx_vnni"} & flags) or "avx2" not in flags


def _as_u8(consts: dict, weight: str, zero_point: str) -> dict:
    """``consts`` with the int8 weight and its zero point as uint8 holding the same integer differences,
    for onnxruntime where its u8 x s8 products saturate (see the module docstring)."""
    if _s8_products_exact():
        return consts
    shift = lambda a: (np.asarray(a, np.int16) + 128).astype(np.uint8)  # noqa: E731
    return {**consts, weight: shift(consts[weight]), zero_point: shift(consts[zero_point])}


def _same(op: str, inputs: dict, consts: dict, n_outputs: int = 1, domain: str = "", ort_consts: dict | None = None,
          **attrs) -> None:
    """Ours and onnxruntime's outputs equal to the bit; ``ort_consts`` (the same values in other
    integer types) replace ``consts`` on onnxruntime's side."""
    got = _ours(op, inputs, consts, n_outputs, domain, **attrs)
    expected = _ort(op, inputs, ort_consts or consts, [g.dtype for g in got], domain, **attrs)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert np.array_equal(g, e), f"{op}: {int((g != e).sum())} of {e.size} differ"


def _u8(*shape) -> np.ndarray:
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _s(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def test_quantize_linear_rounds_like_onnxruntime_on_ties():
    scale = np.float32(0.0117)
    # (k + 0.5) * scale in float32: the float32 quotient is often exactly k + 0.5, the float64 one not
    x = ((np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)) * scale).reshape(2, 3, 10, 10)
    _same("QuantizeLinear", {"x": x}, {"s": _s(scale), "z": np.array(128, np.uint8)})
    _same("QuantizeLinear", {"x": x}, {"s": _s(scale), "z": np.array(3, np.int8)})


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_quantize_linear(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((4, 33)) * rng.uniform(0.1, 30) + rng.uniform(-3, 3)).astype(np.float32)
    if seed == 4:
        x = np.abs(x)  # range starts at 0: zero point 0
    _same("DynamicQuantizeLinear", {"x": x}, {}, n_outputs=3)


def test_qlinear_conv_per_channel_with_bias():
    x, w = _u8(1, 8, 9, 9), RNG.integers(-127, 128, (6, 8, 3, 3)).astype(np.int8)
    consts = {"xs": _s(0.021), "xz": np.array(131, np.uint8), "w": w,
              "ws": RNG.uniform(0.001, 0.01, 6).astype(np.float32), "wz": np.zeros(6, np.int8),
              "ys": _s(0.37), "yz": np.array(119, np.uint8), "b": RNG.integers(-5000, 5000, 6).astype(np.int32)}
    _same("QLinearConv", {"x": x}, consts, ort_consts=_as_u8(consts, "w", "wz"), pads=[1, 1, 1, 1])
    dw = RNG.integers(-127, 128, (8, 1, 3, 3)).astype(np.int8)  # depthwise: the float32 path
    _same("QLinearConv", {"x": x}, {**consts, "w": dw, "ws": consts["ws"].repeat(2)[:8], "wz": np.zeros(8, np.int8),
                                    "b": RNG.integers(-5000, 5000, 8).astype(np.int32)}, group=8, strides=[2, 2])


@pytest.mark.parametrize("k", [40, 4000])  # 4000: partial sums can pass 2**24, the float64 path
def test_qlinear_matmul(k):
    a, b = _u8(3, k), RNG.integers(-127, 128, (k, 5)).astype(np.int8)
    consts = {"as": _s(0.02), "az": np.array(127, np.uint8), "b": b, "bs": _s(0.003), "bz": np.array(0, np.int8),
              "ys": _s(0.5 if k > 100 else 0.05), "yz": np.array(128, np.uint8)}
    _same("QLinearMatMul", {"a": a}, consts, ort_consts=_as_u8(consts, "b", "bz"))
    integer = {"b": b, "az": np.array(127, np.uint8), "bz": np.array(0, np.int8)}
    _same("MatMulInteger", {"a": a}, integer, ort_consts=_as_u8(integer, "b", "bz"))


# every (a, b) pair of uint8 values: the formulas are checked on the whole grid
_GRID_A = np.repeat(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)
_GRID_B = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(256, 256)


@pytest.mark.parametrize("scales", [(0.0235, 0.0117, 0.0312), (0.02, 0.03, 0.04), (0.0117, 0.0234, 0.0351)])
def test_qlinear_add_and_mul(scales):
    sa, sb, sc = scales
    consts = {"as": _s(sa), "az": np.array(120, np.uint8), "b": _GRID_B, "bs": _s(sb),
              "bz": np.array(3, np.uint8), "cs": _s(sc), "cz": np.array(100, np.uint8)}
    _same("QLinearAdd", {"a": _GRID_A}, consts, domain=MS)
    _same("QLinearMul", {"a": _GRID_A}, {**consts, "cs": _s(3 * sc)}, domain=MS)
    for k in (0, 77, 255):  # a scalar B
        _same("QLinearAdd", {"a": _GRID_A}, {**consts, "b": np.array([k], np.uint8)}, domain=MS)
        _same("QLinearMul", {"a": _GRID_A}, {**consts, "b": np.array([k], np.uint8)}, domain=MS)


def test_qlinear_concat_requantizes_like_onnxruntime():
    inputs = {"a": _u8(1, 3, 4), "b": np.arange(256, dtype=np.uint8).reshape(1, 64, 4)}
    consts = {"ys": _s(0.0234), "yz": np.array(0, np.uint8)}
    node_inputs = ["ys", "yz", "a", "as", "az", "b", "bs", "bz"]
    values = {**consts, **inputs, "as": _s(0.0234), "az": np.array(0, np.uint8),  # a: copied as is
              "bs": _s(0.0117), "bz": np.array(3, np.uint8)}  # b: every value requantized
    node = helper.make_node("QLinearConcat", node_inputs, ["y"], domain=MS, axis=1)
    graph = helper.make_graph(
        [node], "g", [_tensor(k, np.uint8, v.shape) for k, v in inputs.items()], [_tensor("y", np.uint8)],
        [numpy_helper.from_array(np.asarray(values[k]), k) for k in node_inputs if k not in inputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(MS, 1)])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    got = evaluate_node(Node("QLinearConcat", node_inputs, ["y"], {"axis": 1}, "n", MS),
                        [values[k] for k in node_inputs], {"": 19})[0]
    assert np.array_equal(got, expected)


def test_qlinear_global_average_pool():
    consts = {"xs": _s(0.0191), "xz": np.array(12, np.uint8), "ys": _s(0.0077), "yz": np.array(5, np.uint8)}
    _same("QLinearGlobalAveragePool", {"x": _u8(2, 16, 7, 7)}, consts, domain=MS, channels_last=0)


def test_qgemm_transposed_per_channel_weight():
    """B [N, K] with transB and one scale / zero point per output column (N): the zero points
    run along B's rows before the transpose."""
    a, b = _u8(4, 12), _u8(5, 12)
    consts = {"as": _s(0.02), "az": np.array(128, np.uint8), "b": b,
              "bs": RNG.uniform(0.001, 0.01, 5).astype(np.float32), "bz": RNG.integers(100, 150, 5).astype(np.uint8),
              "c": RNG.integers(-900, 900, 5).astype(np.int32), "ys": _s(0.03), "yz": np.array(120, np.uint8)}
    _same("QGemm", {"a": a}, consts, domain=MS, transB=1)
    _same("QGemm", {"a": a}, {**consts, "b": np.ascontiguousarray(b.T)}, domain=MS)  # B [K, N]
