"""fuse_conv_scale: constant Mul/Div/Add/Sub chains after a Conv, ConvTranspose or FullyConnected
(a positive scale also through Relu/LeakyRelu/PRelu) fold into its weights and bias."""

import numpy as np
import onnx
import pytest

from optcli.passes import fuse_conv_bias_activation, fuse_conv_scale, fuse_matmul_add
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, model, node, ops, run_pass, to_graph

F = np.float32
RNG = np.random.default_rng(11)
C = 6  # the convs' output channels


def _conv_chain(tail: list, consts: dict, bias: bool = True, out: tuple = ("y",)) -> tuple:
    """Conv(x) then ``tail``: (op, constant name or None, constant first?) steps, each reading the
    step before; a step with no constant is an activation; the last writes ``y``."""
    inits = {"w": RNG.standard_normal((C, 3, 3, 3)).astype(F), **{k: np.asarray(v, F) for k, v in consts.items()}}
    conv_inputs = ["x", "w"]
    if bias:
        inits["cb"] = RNG.standard_normal(C).astype(F)
        conv_inputs.append("cb")
    nodes = [node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1])]
    prev = "c"
    for i, (op, const, flip) in enumerate(tail):
        name = "y" if i == len(tail) - 1 else f"t{i}"
        inputs = [prev] if const is None else [const, prev] if flip else [prev, const]
        nodes.append(node(op, inputs, [name]))
        prev = name
    return model(nodes, {"x": [1, 3, 5, 5]}, outputs=list(out), initializers=inits), inits


def _pos(shape):
    return RNG.uniform(0.5, 2.0, shape)


FOLDS = {
    "mul_scalar": ([("Mul", "a", False)], {"a": 1.5}),
    "mul_one_element": ([("Mul", "a", False)], {"a": [1.5]}),
    "mul_1111_first": ([("Mul", "a", True)], {"a": np.full((1, 1, 1, 1), -1.5)}),
    "mul_c11": ([("Mul", "a", False)], {"a": _pos((C, 1, 1))}),
    "mul_1c11_first": ([("Mul", "a", True)], {"a": _pos((1, C, 1, 1))}),
    "div_scalar": ([("Div", "a", False)], {"a": [0.7]}),
    "div_per_channel": ([("Div", "a", False)], {"a": -_pos((1, C, 1, 1))}),
    "add_scalar_first": ([("Add", "b", True)], {"b": [0.3]}),
    "sub_scalar": ([("Sub", "b", False)], {"b": [0.3]}),
    "sub_from_constant": ([("Sub", "b", True)], {"b": [0.3]}),
    "sub_per_channel_from_constant": ([("Sub", "b", True)], {"b": _pos((C, 1, 1))}),
    "x*a+b": ([("Mul", "a", True), ("Add", "b", False)], {"a": [1.5], "b": [0.2]}),
    "(x+b)*a": ([("Add", "b", False), ("Mul", "a", False)], {"a": [1.5], "b": _pos((C, 1, 1))}),
    "x/a-b": ([("Div", "a", False), ("Sub", "b", False)], {"a": [1.5], "b": [0.2]}),
    "b-x*a": ([("Mul", "a", False), ("Sub", "b", True)], {"a": _pos((1, C, 1, 1)), "b": [0.2]}),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", sorted(FOLDS))
def test_affine_chain_folds(case, bias):
    tail, consts = FOLDS[case]
    m, inits = _conv_chain(tail, consts, bias=bias)
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv"] and counts == {"fused": len(tail), "through_activation": 0}
    assert graph.nodes[0].outputs == ["y"] and len(graph.nodes[0].inputs) == 3
    np.testing.assert_array_equal(graph.initializers["w"], inits["w"])  # left as it was, for other readers


def test_shift_alone_keeps_the_weight():
    m, _ = _conv_chain([("Add", "b", False), ("Sub", "s", False)], {"b": [0.3], "s": _pos((C, 1, 1))})
    graph, _ = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv"] and graph.nodes[0].inputs[1] == "w"


THROUGH = {
    "relu*a": ([("Relu", None, False), ("Mul", "a", False)], {"a": [1.5]}),
    "relu/a_per_channel": ([("Relu", None, False), ("Div", "a", False)], {"a": _pos((C, 1, 1))}),
    "leaky_relu*a_first": ([("LeakyRelu", None, False), ("Mul", "a", True)], {"a": _pos((1, C, 1, 1))}),
    "(x*a+b)->relu*c": ([("Mul", "a", False), ("Add", "b", False), ("Relu", None, False), ("Mul", "s", False)],
                        {"a": [-1.5], "b": [0.2], "s": [0.5]}),
}


@pytest.mark.parametrize("case", sorted(THROUGH))
def test_positive_scale_moves_through_the_activation(case):
    tail, consts = THROUGH[case]
    m, _ = _conv_chain(tail, consts)
    graph, counts = run_pass(m, fuse_conv_scale)
    act = tail[[t[1] for t in tail].index(None)][0]
    assert ops(graph) == ["Conv", act] and counts == {"fused": len(tail) - 1, "through_activation": 1}
    assert graph.nodes[1].inputs[0] == graph.nodes[0].outputs[0] and graph.nodes[1].outputs == ["y"]


@pytest.mark.parametrize("slope_shape", [(C, 1, 1), (2, 1, 1, 1)])
def test_prelu_any_slope(slope_shape):
    # (2, 1, 1, 1) broadcasts the batch of 1 to 2: the channel scale still meets the same elements.
    inits = {"w": RNG.standard_normal((C, 3, 3, 3)).astype(F), "slope": RNG.uniform(-1, 1, slope_shape).astype(F),
             "a": _pos((1, C, 1, 1)).astype(F)}
    nodes = [node("Conv", ["x", "w"], ["c"]), node("PRelu", ["c", "slope"], ["p"]), node("Mul", ["p", "a"], ["y"])]
    graph, counts = run_pass(model(nodes, {"x": [1, 3, 5, 5]}, initializers=inits), fuse_conv_scale)
    assert ops(graph) == ["Conv", "PRelu"] and counts["through_activation"] == 1


def test_scale_along_channels_a_prelu_made_stays():
    # One conv channel, four after PRelu's slope: a four-channel scale is no vector of the conv's.
    inits = {"w": RNG.standard_normal((1, 3, 3, 3)).astype(F), "slope": RNG.uniform(0, 1, (1, 4, 1, 1)).astype(F),
             "a": _pos((1, 4, 1, 1)).astype(F)}
    nodes = [node("Conv", ["x", "w"], ["c"]), node("PRelu", ["c", "slope"], ["p"]), node("Mul", ["p", "a"], ["y"])]
    graph, counts = run_pass(model(nodes, {"x": [1, 3, 5, 5]}, initializers=inits), fuse_conv_scale)
    assert ops(graph) == ["Conv", "PRelu", "Mul"] and counts["fused"] == 0


def test_shift_after_the_activation_stays():
    m, _ = _conv_chain([("Relu", None, False), ("Mul", "a", False), ("Add", "b", False)], {"a": [1.5], "b": [0.2]})
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Relu", "Add"] and counts["fused"] == 1


@pytest.mark.parametrize("scale", [[-1.5], [0.0], np.r_[_pos(C - 1), -1.0].reshape(C, 1, 1)])
def test_scale_not_positive_stays_behind_the_relu(scale):
    m, _ = _conv_chain([("Relu", None, False), ("Mul", "a", False)], {"a": scale})
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Relu", "Mul"] and counts["fused"] == 0


def test_clip_is_no_way_through():
    inits = {"lo": np.array(0, F), "hi": np.array(6, F)}
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Clip", ["c", "lo", "hi"], ["r"]), node("Mul", ["r", "a"], ["y"])]
    m = model(nodes, {"x": [1, 3, 5, 5]},
              initializers={"w": RNG.standard_normal((C, 3, 1, 1)).astype(F), "a": np.array([2.0], F), **inits})
    graph, _ = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Clip", "Mul"]


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("divisor", [[0.0], np.r_[_pos(C - 1), 0.0].reshape(C, 1, 1), [np.inf], [1e-39]])
def test_divisor_zero_non_finite_or_overflowing_stays(divisor):
    m, _ = _conv_chain([("Div", "a", False)], {"a": divisor})
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Div"] and counts["fused"] == 0


def test_constant_divided_by_the_conv_stays():
    m, _ = _conv_chain([("Div", "a", True)], {"a": [2.0]})
    graph, _ = run_pass(m, fuse_conv_scale, feeds={"x": np.ones((1, 3, 5, 5), F)})
    assert ops(graph) == ["Conv", "Div"]


@pytest.mark.parametrize("shape", [(1, 1, 5, 1), (2, C, 1, 1), (1, 1, 1, 1, 1), (C,)])
def test_constant_varying_elsewhere_or_growing_the_output_stays(shape):
    # (C,) broadcasts along the width (5 != 6: onnx would reject it), so use a width of C there.
    m, _ = _conv_chain([("Mul", "a", False)], {"a": _pos(shape)})
    if shape == (C,):
        m = model(list(m.graph.node), {"x": [1, 3, 5, C]}, initializers={
            i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer})
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"] and counts["fused"] == 0


def test_conv_output_read_elsewhere_stays():
    m, _ = _conv_chain([("Mul", "a", False)], {"a": _pos((1, C, 1, 1))}, out=("y", "c"))
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"] and counts["fused"] == 0


def test_chain_stops_at_a_value_read_elsewhere():
    m, _ = _conv_chain([("Mul", "a", False), ("Add", "b", False)], {"a": [1.5], "b": [0.2]}, out=("y", "t0"))
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Add"] and counts["fused"] == 1


def test_activation_read_elsewhere_stays():
    m, _ = _conv_chain([("Relu", None, False), ("Mul", "a", False)], {"a": [1.5]}, out=("y", "t0"))
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Relu", "Mul"] and counts["fused"] == 0


def test_conv_with_epilogue_stays():
    m, _ = _conv_chain([("Relu", None, False), ("Mul", "a", False)], {"a": [-1.5]})
    graph = to_graph(m)
    fuse_conv_bias_activation.run(graph, PassContext())
    assert graph.nodes[0].attrs.get("activation") == "relu"
    assert fuse_conv_scale.run(graph, PassContext())["fused"] == 0
    assert ops(graph) == ["Conv", "Mul"]
    check_same(m, graph)


def test_runtime_scale_stays():
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Mul", ["c", "s"], ["y"])]
    w = RNG.standard_normal((C, 3, 1, 1)).astype(F)
    m = model(nodes, {"x": [1, 3, 4, 4], "s": [1, C, 1, 1]}, initializers={"w": w})
    graph, _ = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"]


def test_integer_conv_stays():
    inits = {"w": RNG.integers(-3, 3, (C, 3, 1, 1)).astype(np.uint8), "a": np.array([3], np.int32)}
    nodes = [node("ConvInteger", ["x", "w"], ["c"]), node("Mul", ["c", "a"], ["y"])]
    m = model(nodes, {"x": [1, 3, 4, 4]}, initializers=inits)
    m.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.UINT8
    graph, counts = run_pass(m, fuse_conv_scale, feeds={"x": RNG.integers(0, 9, (1, 3, 4, 4)).astype(np.uint8)})
    assert ops(graph) == ["ConvInteger", "Mul"] and counts["fused"] == 0


def test_shared_weight_is_not_changed_for_the_other_conv():
    inits = {"w": RNG.standard_normal((C, 3, 3, 3)).astype(F), "a": np.array([1.5], F), "b": np.array([0.2], F)}
    nodes = [node("Conv", ["x", "w"], ["c1"]), node("Mul", ["c1", "a"], ["y1"]), node("Add", ["y1", "b"], ["y"]),
             node("Conv", ["x", "w"], ["z"])]
    graph, _ = run_pass(model(nodes, {"x": [1, 3, 5, 5]}, outputs=["y", "z"], initializers=inits), fuse_conv_scale)
    assert ops(graph) == ["Conv", "Conv"] and graph.nodes[1].inputs[1] == "w"
    np.testing.assert_array_equal(graph.initializers["w"], inits["w"])


def test_conv_transpose_with_groups():
    inits = {"w": RNG.standard_normal((4, 3, 2, 2)).astype(F), "g": _pos((1, C, 1, 1)).astype(F),
             "b": np.array([0.5], F)}
    nodes = [node("ConvTranspose", ["x", "w"], ["c"], group=2, strides=[2, 2]), node("Sub", ["b", "c"], ["d"]),
             node("Mul", ["d", "g"], ["y"])]
    graph, _ = run_pass(model(nodes, {"x": [1, 4, 3, 3]}, initializers=inits), fuse_conv_scale)
    assert ops(graph) == ["ConvTranspose"]


def _dense(tail: list) -> onnx.ModelProto:
    inits = {"W": RNG.standard_normal((16, 8)).astype(F), "B": RNG.standard_normal(8).astype(F),
             "a": np.array([1.5], F), "n": np.array([-0.5], F), "b": _pos(8).astype(F)}
    nodes, prev = [node("MatMul", ["x", "W"], ["m"])], "m"
    for i, (op, const) in enumerate(tail):
        name = "y" if i == len(tail) - 1 else f"t{i}"
        nodes.append(node(op, [prev] if const is None else [prev, const], [name]))
        prev = name
    return model(nodes, {"x": [2, 3, 16]}, initializers=inits)


@pytest.mark.parametrize("tail, left", [
    ([("Mul", "a"), ("Add", "b")], ["FullyConnected"]),
    ([("Add", "B"), ("Mul", "n"), ("Sub", "b")], ["FullyConnected"]),
    ([("Relu", None), ("Div", "a")], ["FullyConnected", "Relu"]),
    ([("Relu", None), ("Mul", "n")], ["FullyConnected", "Relu", "Mul"]),
])
def test_fully_connected(tail, left):
    m = _dense(tail)
    graph = to_graph(m)
    fuse_matmul_add.run(graph, PassContext())
    fuse_conv_scale.run(graph, PassContext())
    assert ops(graph) == left
    np.testing.assert_array_equal(graph.initializers["W"], onnx.numpy_helper.to_array(m.graph.initializer[0]))
    check_same(m, graph)
