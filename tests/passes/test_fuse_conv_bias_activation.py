"""fuse_conv_bias_activation: per-channel bias Add and one activation folded into the epilogue."""

import math
from dataclasses import dataclass

import numpy as np
import pytest

from optcli.passes import (
    batchnorm_to_affine,
    fuse_activation_patterns,
    fuse_conv_bias_activation,
    fuse_matmul_add,
)
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, model, node, ops, run_pass, to_graph

RNG = np.random.default_rng(4)
CONV_INITS = {
    "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
    "bias": RNG.standard_normal((4, 1, 1)).astype(np.float32),
    "lo": np.array(-0.5, np.float32),
    "hi": np.array(0.75, np.float32),
}

ACTIVATIONS = {
    "relu": (node("Relu", ["a"], ["y"]), 0.0, 0.0),
    "clip": (node("Clip", ["a", "lo", "hi"], ["y"]), -0.5, 0.75),
    "clip_min_only": (node("Clip", ["a", "lo"], ["y"]), -0.5, math.inf),
    "leaky_relu": (node("LeakyRelu", ["a"], ["y"], alpha=0.2), 0.2, 0.0),
    "sigmoid": (node("Sigmoid", ["a"], ["y"]), 0.0, 0.0),
    "tanh": (node("Tanh", ["a"], ["y"]), 0.0, 0.0),
    "hard_sigmoid": (node("HardSigmoid", ["a"], ["y"], alpha=0.3, beta=0.4), 0.3, 0.4),
    "hard_swish": (node("HardSwish", ["a"], ["y"]), 0.0, 0.0),
}


@dataclass(frozen=True)
class FakeTarget:
    fused_activations: frozenset


def _conv_add(act) -> list:
    return [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Add", ["c", "bias"], ["a"]), act]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_conv_bias_activation(name):
    act, alpha, beta = ACTIVATIONS[name]
    m = model(_conv_add(act), {"x": [1, 3, 6, 6]}, initializers=CONV_INITS)
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Conv"] and counts == {"bias": 1, "activation": 1}
    conv = graph.nodes[0]
    expected = "clip" if name.startswith("clip") else name
    assert conv.attrs["activation"] == expected and conv.outputs == ["y"]
    assert conv.attrs["activation_alpha"] == pytest.approx(alpha)
    assert conv.attrs["activation_beta"] == pytest.approx(beta)
    np.testing.assert_allclose(graph.initializers[conv.inputs[2]], CONV_INITS["bias"].reshape(-1))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_fuses_into_conv_and_residual_add(approximate):
    """Gelu (opset 20, either form) becomes the conv's epilogue, or an Add's, and the outputs stay onnxruntime's."""
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    m = model(_conv_add(node("Gelu", ["a"], ["y"], approximate=approximate)), {"x": [1, 3, 6, 6]},
              initializers=CONV_INITS, opset=20)
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Conv"] and counts == {"bias": 1, "activation": 1}
    assert graph.nodes[0].attrs["activation"] == name
    m = model([node("Add", ["x", "z"], ["a"]), node("Gelu", ["a"], ["y"], approximate=approximate)],
              {"x": [1, 3, 6, 6], "z": [1, 3, 6, 6]}, opset=20)
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Add"] and graph.nodes[0].attrs["activation"] == name


def test_swish_after_pattern_fusion():
    m = model(
        [node("Conv", ["x", "w"], ["c"]), node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
        {"x": [1, 3, 6, 6]},
        initializers={"w": CONV_INITS["w"]},
    )
    graph = to_graph(m)
    fuse_activation_patterns.run(graph, PassContext())
    fuse_conv_bias_activation.run(graph, PassContext())
    assert ops(graph) == ["Conv"] and graph.nodes[0].attrs["activation"] == "swish"
    check_same(m, graph)


def test_fc_and_channel_affine_and_gemm():
    m = model(
        [
            node("MatMul", ["x", "w"], ["m"]),
            node("Add", ["m", "b"], ["f"]),
            node("Relu", ["f"], ["r"]),
            node("BatchNormalization", ["r", "g", "be", "mu", "v"], ["n"]),
            node("Tanh", ["n"], ["t"]),
            node("Gemm", ["t", "z"], ["gm"]),
            node("Add", ["gm", "b2"], ["ga"]),
            node("Sigmoid", ["ga"], ["y"]),
        ],
        {"x": [2, 6], "z": [5, 3]},
        initializers={
            "w": RNG.standard_normal((6, 5)).astype(np.float32),
            "b": RNG.standard_normal(5).astype(np.float32),
            "g": RNG.uniform(0.5, 1.5, 5).astype(np.float32),
            "be": RNG.standard_normal(5).astype(np.float32),
            "mu": RNG.standard_normal(5).astype(np.float32),
            "v": RNG.uniform(0.5, 1.5, 5).astype(np.float32),
            "b2": RNG.standard_normal(3).astype(np.float32),
        },
    )
    graph = to_graph(m)
    for p in (fuse_matmul_add, batchnorm_to_affine, fuse_conv_bias_activation):
        p.run(graph, PassContext())
    assert ops(graph) == ["FullyConnected", "ChannelAffine", "Gemm"]
    assert [n.attrs.get("activation") for n in graph.nodes] == ["relu", "tanh", "sigmoid"]
    check_same(m, graph)


def test_not_fused_when_output_has_two_readers():
    m = model(_conv_add(node("Relu", ["a"], ["y"])), {"x": [1, 3, 6, 6]}, ["y", "a"], CONV_INITS)
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Conv", "Relu"] and counts == {"bias": 1, "activation": 0}


def test_activation_not_supported_by_a_target_is_not_fused():
    ctx = PassContext(targets=[FakeTarget(frozenset({"relu", "sigmoid"})), FakeTarget(frozenset({"relu"}))])
    m = model(_conv_add(node("Sigmoid", ["a"], ["y"])), {"x": [1, 3, 6, 6]}, initializers=CONV_INITS)
    graph, counts = run_pass(m, fuse_conv_bias_activation, ctx)
    assert ops(graph) == ["Conv", "Sigmoid"] and counts["activation"] == 0
    m = model(_conv_add(node("Relu", ["a"], ["y"])), {"x": [1, 3, 6, 6]}, initializers=CONV_INITS)
    graph, counts = run_pass(m, fuse_conv_bias_activation, ctx)
    assert ops(graph) == ["Conv"]


def test_only_one_epilogue_and_no_spatial_bias():
    inits = {**CONV_INITS, "bias": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)}
    m = model(
        [
            node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            node("Add", ["c", "bias"], ["a"]),
            node("Relu", ["a"], ["r"]),
            node("Sigmoid", ["r"], ["y"]),
        ],
        {"x": [1, 3, 6, 6]},
        initializers=inits,
    )
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    # The spatial bias stays an Add (it is not per-channel); the Add then takes the Relu.
    assert ops(graph) == ["Conv", "Add", "Sigmoid"] and counts == {"bias": 0, "activation": 1}
    assert "activation" not in graph.nodes[0].attrs and graph.nodes[1].attrs["activation"] == "relu"
    m = model(
        [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]), node("Sigmoid", ["r"], ["y"])],
        {"x": [1, 3, 6, 6]},
        initializers=CONV_INITS,
    )
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Conv", "Sigmoid"] and graph.nodes[0].attrs["activation"] == "relu"


def test_residual_add_takes_the_relu():
    from optcli.passes import fuse_conv_bias_activation
    from tests.passes.ir_build import model, node, ops, run_pass

    m = model([node("Add", ["a", "b"], ["s"]), node("Relu", ["s"], ["y"])], {"a": [1, 4, 3, 3], "b": [1, 4, 3, 3]})
    graph, counts = run_pass(m, fuse_conv_bias_activation)
    assert ops(graph) == ["Add"] and graph.nodes[0].attrs["activation"] == "relu"
    assert counts["activation"] == 1


def test_integer_add_keeps_its_relu():
    from onnx import TensorProto, helper

    from optcli.frontend.onnx_reader import read_model
    from optcli.passes import fuse_conv_bias_activation
    from optcli.passes.base import PassContext

    g = helper.make_graph([helper.make_node("Add", ["a", "a"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.INT32, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [2])])
    graph = read_model(model=helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    fuse_conv_bias_activation.run(graph, PassContext())
    assert [n.op_type for n in graph.nodes] == ["Add", "Relu"]
