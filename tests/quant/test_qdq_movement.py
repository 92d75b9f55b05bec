"""fuse_qdq_movement: ops that only move or select values between a DequantizeLinear and a QuantizeLinear of
the same parameters run on the 8-bit tensor.  Each op in a hand-built QDQ graph (what onnxruntime's
quantize_static writes around them): the plan must run it on bytes (no DequantizeLinear before it) and
give exactly onnxruntime's output for the graph as written; where the parameters differ, a Pad's value is
off the quantization grid, or the plan has a GPU target, the op stays float."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from tests.quant.quantized_models import ort_run

SHAPE = [1, 3, 9, 11]


def qdq_model(op: str, attrs: dict, extra: dict[str, np.ndarray], dtype=np.uint8, out_scale=0.05, out_zp=None,
              two_inputs=False, out_shape=None) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv -> Q -> DQ -> op (extra constant inputs after the data) -> Q -> DQ -> y, as
    quantize_static writes it; the 1x1 conv (identity weights, int8 1 at scale 1: exact in float too) makes
    the op's input an integer step's output, as in a real plan.  With ``two_inputs`` the op reads its input
    twice (Concat)."""
    zp = 7 if dtype == np.uint8 else -5
    out_zp = zp if out_zp is None else out_zp
    c = SHAPE[1]
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(zp, dtype), "z"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "so"),
             numpy_helper.from_array(np.array(out_zp, dtype), "zo"),
             numpy_helper.from_array(np.eye(c, dtype=np.int8).reshape(c, c, 1, 1), "wq"),
             numpy_helper.from_array(np.ones(c, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz")]
    inits += [numpy_helper.from_array(v, k) for k, v in extra.items()]
    data = ["d2", "d2"] if two_inputs else ["d2"]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["d", "w"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d2"]),
             helper.make_node(op, data + list(extra), ["o"], **attrs),
             helper.make_node("QuantizeLinear", ["o", "so", "zo"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "movement", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


OPS = {
    "MaxPool 3x3 s2 pads": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, {}),
    "MaxPool ceil mode": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, {}),
    "Pad zero": ("Pad", {}, {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}),
    "Pad on-grid value": ("Pad", {}, {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                                      "v": np.array(0.25, np.float32)}),
    "Pad reflect": ("Pad", {"mode": "reflect"}, {"pads": np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64)}),
    "Reshape": ("Reshape", {}, {"shape": np.array([1, 3, -1], np.int64)}),
    "Transpose": ("Transpose", {"perm": [0, 2, 3, 1]}, {}),
    "Flatten": ("Flatten", {"axis": 2}, {}),
    "Resize nearest x2": ("Resize", {"mode": "nearest"}, {"roi": np.zeros(0, np.float32),
                                                        "scales": np.array([1, 1, 2, 2], np.float32)}),
    "Slice": ("Slice", {}, {"starts": np.array([1, 2], np.int64), "ends": np.array([8, 10], np.int64),
                            "axes": np.array([2, 3], np.int64), "steps": np.array([2, 3], np.int64)}),
    "Concat": ("Concat", {"axis": 1}, {}),
}


def compile_plan(model, targets="arm"):
    result = optcli.optimize(model=model, valid_targets=targets)
    return result, [(s.op_type, [str(i) for i in s.inputs]) for s in result.plan.steps]


def _x(seed=0):
    # values beyond the quantized range too: saturation happens before the op, as in the graph
    return (np.random.default_rng(seed).standard_normal(SHAPE) * 6).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("name", list(OPS))
def test_runs_on_bytes_and_equals_onnxruntime(name, dtype):
    op, attrs, extra = OPS[name]
    model = qdq_model(op, attrs, extra, dtype, two_inputs=op == "Concat")
    result, steps = compile_plan(model)
    kinds = [k for k, _ in steps]
    assert kinds == ["QuantizeLinear", "QConv", op, "DequantizeLinear"], kinds  # no float view around the op
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = _x(seed)
        np.testing.assert_array_equal(predictor.run({"x": x})["y"], ort_run(model, {"x": x})[0], err_msg=name)


@pytest.mark.parametrize("case", ["other scale", "other zero point", "Pad off the grid", "MaxPool with Indices",
                                  "Pad-2 (value as an attribute)"])
def test_stays_float_where_it_would_not_be_a_copy(case):
    op, attrs, extra = OPS["MaxPool 3x3 s2 pads"]
    kw = {}
    if case == "other scale":
        kw = {"out_scale": 0.07}
    elif case == "other zero point":
        kw = {"out_zp": 9}
    elif case == "Pad off the grid":
        op, attrs, extra = "Pad", {}, {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
                                       "v": np.array(0.26, np.float32)}
    elif case == "Pad-2 (value as an attribute)":
        op, attrs, extra = "Pad", {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "value": 0.3}, {}
    model = qdq_model(op, attrs, extra, **kw)
    if case == "Pad-2 (value as an attribute)":
        model.opset_import[0].version = 10
    if case == "MaxPool with Indices":
        model.graph.node[6].output.append("indices")
    _, steps = compile_plan(model)
    kinds = [k for k, _ in steps]
    assert kinds[:3] == ["QuantizeLinear", "QConv", "DequantizeLinear"], kinds  # the op reads floats
    if case == "Pad-2 (value as an attribute)":
        return  # (onnxruntime refuses opset 10's per-channel DequantizeLinear: no reference run)
    result = optcli.optimize(model=model, valid_targets="arm")
    x = _x(4)
    np.testing.assert_allclose(optcli.load(result.data).run({"x": x})["y"], ort_run(model, {"x": x})[0],
                               atol=0.07 + 1e-6)


def test_plans_with_a_gpu_target_keep_the_float_view():
    """The GPU runs the float view of a quantized model (fold_qdq): the pass leaves the graph alone when a GPU
    target is in the plan, and fires on the same graph for the host alone (so the GPU case is not vacuous)."""
    from optcli.passes import fuse_qdq_movement
    from optcli.passes.base import PassContext
    from optcli.targets import get_target
    from tests.passes.ir_build import to_graph

    op, attrs, extra = OPS["MaxPool 3x3 s2 pads"]
    model = qdq_model(op, attrs, extra)
    host = PassContext(targets=[get_target("arm")])
    gpu = PassContext(targets=[get_target("opencl"), get_target("arm")])
    assert fuse_qdq_movement.run(to_graph(model), gpu)["fused"] == 0
    assert fuse_qdq_movement.run(to_graph(model), host)["fused"] == 1
    kinds = [s.op_type for s in optcli.optimize(model=model, valid_targets="opencl,arm").plan.steps]
    assert "MaxPool" in kinds and "QConv" not in kinds and "QuantizeLinear" not in kinds, kinds


def _split_model(second_scale: float = 0.05) -> onnx.ModelProto:
    """qdq_model's chain with a two-output Split (YOLOv8's C2f blocks): each output quantized by its own
    QuantizeLinear, of the input's parameters unless ``second_scale`` differs."""
    model = qdq_model("Split", {"axis": 1}, {"split": np.array([1, 2], np.int64)}, out_shape=[1, 1, 9, 11])
    g = model.graph
    g.node[6].output.append("o2")
    g.initializer.append(numpy_helper.from_array(np.array(second_scale, np.float32), "s2"))
    g.node.extend([helper.make_node("QuantizeLinear", ["o2", "s2", "z"], ["q3"]),
                   helper.make_node("DequantizeLinear", ["q3", "s2", "z"], ["y2"])])
    g.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 2, 9, 11]))
    return model


@pytest.mark.parametrize("second_scale", [0.05, 0.07], ids=["one scale", "other scale"])
def test_split_runs_on_bytes_when_every_output_keeps_the_scale(second_scale):
    model = _split_model(second_scale)
    result, steps = compile_plan(model)
    kinds = [k for k, _ in steps]
    if second_scale == 0.05:
        assert kinds == ["QuantizeLinear", "QConv", "Split", "DequantizeLinear", "DequantizeLinear"], kinds
    else:
        assert kinds[:3] == ["QuantizeLinear", "QConv", "DequantizeLinear"], kinds  # a requantization: float
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = _x(seed)
        got, want = predictor.run({"x": x}), ort_run(model, {"x": x})
        np.testing.assert_array_equal(got["y"], want[0])
        np.testing.assert_array_equal(got["y2"], want[1])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_concat_of_other_scales_requantizes_its_inputs_with_byte_tables(dtype):
    """onnxruntime's quantizer gives a Concat's inputs their own scales (YOLOv8's necks): each input of other
    parameters than the output's goes through a QLookup (Q(DQ(byte)), the float view's own arithmetic) and
    the Concat runs on bytes; onnxruntime's output for the graph as written, to the bit."""
    model = qdq_model("Concat", {"axis": 1}, {}, dtype, out_scale=0.07, out_zp=3 if dtype == np.uint8 else -9,
                      two_inputs=True, out_shape=[1, 6, 9, 11])
    g = model.graph
    g.node[6].input[1] = "x2d"  # the second input: straight from the graph input, at a third scale
    g.initializer.append(numpy_helper.from_array(np.array(0.031, np.float32), "s3"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s3", "z"], ["x2q"]),
             helper.make_node("DequantizeLinear", ["x2q", "s3", "z"], ["x2d"]), *g.node]
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(model)
    result, steps = compile_plan(model)
    kinds = [k for k, _ in steps]
    assert kinds.count("QLookup") == 2 and "Concat" in kinds and kinds.count("DequantizeLinear") == 1, kinds
    concat = next(s for s in result.plan.steps if s.op_type == "Concat")
    assert all(i in {o for s in result.plan.steps if s.op_type == "QLookup" for o in s.outputs} for i in concat.inputs)
    predictor = optcli.load(result.data)
    for seed in range(3):
        x = _x(seed)
        np.testing.assert_array_equal(predictor.run({"x": x})["y"], ort_run(model, {"x": x})[0])
