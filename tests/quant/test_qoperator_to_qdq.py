"""QOperator models: their quantized shape arithmetic folds with onnxruntime's rounding, their ops
become the float view for GPU target sets (weights dequantized along the right axis, QGemm's
transposed per-channel B included) and stay integer, and exact, on the host alone."""

from __future__ import annotations

import numpy as np
import pytest

import optcli
from optcli.frontend.onnx_reader import read_model
from optcli.passes import qoperator_to_qdq
from optcli.passes.base import PassContext
from optcli.targets import parse_targets
from optcli.tolerance import RELATIVE, max_error
from tests.passes.ir_build import run_ir
from tests.passes.tf_same_padding import tf_same_padding_model
from tests.quant.quantized_models import feeds, ort_extended_nodes, ort_run, quantized, residual_cnn

WHOLE_GPU = {"keep_small_islands_on_host"}


@pytest.fixture(scope="module")
def qop(tmp_path_factory):
    return quantized(residual_cnn(), "qoperator", tmp_path_factory.mktemp("qop"))


def test_qgemm_transposed_per_channel_weight_is_dequantized_along_its_rows(qop):
    """QGemm's B is [N, K] with transB=1 and one scale per output column N: DequantizeLinear's
    default axis 1 would broadcast N scales against K (the KernelError of the corpus model)."""
    graph = read_model(model=qop)
    qoperator_to_qdq.run(graph, PassContext(targets=parse_targets("opencl,arm")))
    ops = [n.op_type for n in graph.nodes]
    assert not {"QGemm", "QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool"} & set(ops)
    gemm = next(n for n in graph.nodes if n.op_type == "Gemm")
    weight_dq = next(n for n in graph.nodes if n.outputs[0] == gemm.inputs[1])
    assert weight_dq.attrs["axis"] == 0 and graph.const(weight_dq.inputs[1]).shape == (10,)
    x = feeds(residual_cnn(), 2)
    err, scale = max_error(run_ir(graph, x)[0], ort_run(qop, x)[0])
    assert err / scale <= RELATIVE["int8"]


def test_on_the_host_alone_the_integer_ops_stay_and_are_exact(qop):
    graph = read_model(model=qop)
    assert qoperator_to_qdq.run(graph, PassContext(targets=parse_targets("arm"))) == {"rewritten": 0}
    x = feeds(residual_cnn(), 3)
    assert np.array_equal(run_ir(graph, x)[0], ort_run(qop, x)[0])


@pytest.mark.parametrize("kind", ["qoperator", "qdq"])
@pytest.mark.parametrize("targets", ["arm", "opencl,arm"])
def test_quantized_same_padding_folds_away(kind, targets, tmp_path):
    """TensorFlow 'same' padding computed at run time, quantized with the rest (QLinearMul,
    QLinearAdd... or QDQ pairs around Sub/Mul/Add on the pad sizes): it folds with the integer
    kernels, so the pads are onnxruntime's, the Pads fold into the convs, and only convs remain."""
    model = tf_same_padding_model(15)
    q = quantized(model, kind, tmp_path)
    result = optcli.optimize(model=q, valid_targets=targets, disabled_passes=WHOLE_GPU)
    ops = result.report["ops_after"]
    assert not {"Shape", "Gather", "Ceil", "Concat", "QLinearAdd", "QLinearMul"} & set(ops)
    steps = [s for s in result.report["steps"] if s["op"] not in ("Upload", "Download", "Pack", "Unpack")]
    assert len(steps) <= ort_extended_nodes(q, tmp_path) // 10
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = feeds(model, seed)
        got, expected = predictor.run(x)["y"], ort_run(q, x)[0]
        if targets == "arm":  # the host: integer kernels (QOperator), or the same float ops (QDQ)
            assert np.array_equal(got, expected)
        else:
            err, scale = max_error(got, expected)
            assert err / scale <= RELATIVE["int8"]


def test_quantized_arithmetic_over_constants_folds_with_onnxruntime_rounding():
    """QLinearMul(3, 44) with these scales is 180 in onnxruntime's integer arithmetic and 181 in
    the float view (dequantize, multiply, quantize): a pad size one step off.  Constants fold
    before any op becomes the float view."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {"a": np.array([3], np.uint8), "as": np.float32(0.02), "az": np.uint8(128),
              "b": np.array([44], np.uint8), "bs": np.float32(0.03), "bz": np.uint8(128),
              "cs": np.float32(0.12), "cz": np.uint8(128)}
    nodes = [helper.make_node("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["m_q"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["m_q", "cs", "cz"], ["m"]),
             helper.make_node("Add", ["x", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    x = {"x": np.zeros(1, np.float32)}
    ir = read_model(model=model)
    qoperator_to_qdq.run(ir, PassContext(targets=parse_targets("opencl,arm")))
    assert [n.op_type for n in ir.nodes] == ["Add"]
    assert np.array_equal(run_ir(ir, x)[0], ort_run(model, x)[0])
