"""fold_constants_before_qdq: a QDQ model whose pads are computed at run time from a Shape, through float
arithmetic that onnxruntime's quantizer wrapped in Q/DQ pairs too (timm's TF-"same" convs quantized by
quantize_static), must still become integer steps: the pad arithmetic folds, shapes become static, the Pad
runs on bytes and the residual Add is a QAdd; onnxruntime's output, to the bit."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import optcli
from tests.quant.quantized_models import ort_run


def _model() -> onnx.ModelProto:
    c = 4
    rng = np.random.default_rng(0)
    inits = {
        # scales off round numbers: an exact integer sum then never lands on a rounding tie, where the
        # float Conv of the graph as written may round either way
        "s": np.array(0.0537, np.float32), "z": np.array(128, np.uint8),
        "s1": np.array(1.0, np.float32), "z1": np.array(0, np.uint8),
        "w1": rng.integers(-60, 60, (c, 3, 1, 1)).astype(np.int8),
        "w2": rng.integers(-60, 60, (c, c, 3, 3)).astype(np.int8),
        "ws": np.full(c, 0.0113, np.float32), "wz": np.zeros(c, np.int8),
        "begin": np.array([0, 0, 1, 1], np.float32), "zero": np.array(0.0, np.float32),
        "pad_value": np.array(130, np.uint8),  # the Pad's value, quantized too: 2 steps above 0
    }
    n = helper.make_node
    nodes = [
        n("QuantizeLinear", ["x", "s", "z"], ["xq"]), n("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        n("DequantizeLinear", ["w1", "ws", "wz"], ["w1d"], axis=0),
        n("DequantizeLinear", ["w2", "ws", "wz"], ["w2d"], axis=0),
        n("Conv", ["xd", "w1d"], ["c1"]), n("QuantizeLinear", ["c1", "s", "z"], ["c1q"]),
        n("DequantizeLinear", ["c1q", "s", "z"], ["a"]), n("DequantizeLinear", ["c1q", "s", "z"], ["a2"]),
        # pads = [0, 0, 1, 1, 0, 0, 1, 1] from Shape(a), through float arithmetic in Q/DQ pairs
        n("Shape", ["a"], ["shape"]), n("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        n("Mul", ["shape_f", "zero"], ["zeros"]), n("QuantizeLinear", ["zeros", "s1", "z1"], ["zq"]),
        n("DequantizeLinear", ["zq", "s1", "z1"], ["zd"]), n("Add", ["zd", "begin"], ["pb"]),
        n("Concat", ["pb", "pb"], ["pads_f"], axis=0), n("Cast", ["pads_f"], ["pads"], to=TensorProto.INT64),
        n("DequantizeLinear", ["pad_value", "s", "z"], ["pad_value_f"]),
        n("Pad", ["a", "pads", "pad_value_f"], ["p"]), n("QuantizeLinear", ["p", "s", "z"], ["pq"]),
        n("DequantizeLinear", ["pq", "s", "z"], ["pd"]),
        n("Conv", ["pd", "w2d"], ["c2"]), n("QuantizeLinear", ["c2", "s", "z"], ["c2q"]),
        n("DequantizeLinear", ["c2q", "s", "z"], ["c2d"]),
        n("Add", ["c2d", "a2"], ["sum"]), n("QuantizeLinear", ["sum", "s", "z"], ["yq"]),
        n("DequantizeLinear", ["yq", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "runtime_pads",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def test_runtime_pads_fold_and_the_chain_runs_in_integers():
    model = _model()
    result = optcli.optimize(model=model, valid_targets="arm")
    kinds = [s.op_type for s in result.plan.steps]
    assert kinds == ["QuantizeLinear", "QConv", "Pad", "QConv", "QAdd", "DequantizeLinear"], kinds
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((1, 3, 8, 8)) * 3).astype(np.float32)
        np.testing.assert_array_equal(predictor.run({"x": x})["y"], ort_run(model, {"x": x})[0])


def test_without_it_the_add_stays_float():
    """What the pass is for: disabled, the Pad's output has no static shape when fuse_qdq_add looks.  (The Pad
    itself still runs on bytes: fuse_qdq_movement reads its value through the DequantizeLinear.)"""
    model = _model()
    result = optcli.optimize(model=model, valid_targets="arm", disabled_passes={"fold_constants_before_qdq"})
    steps = result.plan.steps
    assert "QAdd" not in [s.op_type for s in steps], [s.op_type for s in steps]
    pad = next(s for s in steps if s.op_type == "Pad")
    assert next(s for s in steps if pad.inputs[0] in s.outputs).op_type == "QConv"
    x = (np.random.default_rng(5).standard_normal((1, 3, 8, 8)) * 3).astype(np.float32)
    np.testing.assert_array_equal(optcli.load(result.data).run({"x": x})["y"], ort_run(model, {"x": x})[0])


def test_float_models_are_left_to_the_usual_folding():
    graph_ops = [helper.make_node("Relu", ["x"], ["y"])]
    graph = helper.make_graph(graph_ops, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    result = optcli.optimize(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    record = next(p for p in result.report["passes"] if p["name"] == "fold_constants_before_qdq")
    assert record["changed"] == {}
