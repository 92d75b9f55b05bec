"""fuse_conv_bn: BatchNormalization folded into Conv / ConvTranspose weights and bias."""

import numpy as np
import pytest

from optcli.passes import fuse_conv_bn
from tests.passes.ir_build import model, node, ops, run_pass

RNG = np.random.default_rng(1)


def _bn_params(c: int) -> dict[str, np.ndarray]:
    return {
        "gamma": RNG.uniform(0.5, 1.5, c).astype(np.float32),
        "beta": RNG.standard_normal(c).astype(np.float32),
        "mean": RNG.standard_normal(c).astype(np.float32),
        "var": RNG.uniform(0.5, 2.0, c).astype(np.float32),
    }


def _conv_bn(op: str, c_in: int, c_out: int, group: int, bias: bool, **extra) -> tuple:
    w_shape = [c_out, c_in // group, 3, 3] if op == "Conv" else [c_in, c_out // group, 3, 3]
    inits = {"w": RNG.standard_normal(w_shape).astype(np.float32), **_bn_params(c_out)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(c_out).astype(np.float32)
        conv_inputs.append("b")
    nodes = [
        node(op, conv_inputs, ["c"], group=group, pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-3),
    ]
    return nodes, inits


@pytest.mark.parametrize(
    "op,c_in,c_out,group,bias",
    [
        ("Conv", 3, 4, 1, True),
        ("Conv", 4, 6, 2, False),
        ("Conv", 4, 4, 4, True),  # depthwise
        ("ConvTranspose", 4, 6, 1, True),
        ("ConvTranspose", 4, 6, 2, False),
    ],
)
def test_folds_bn(op, c_in, c_out, group, bias):
    nodes, inits = _conv_bn(op, c_in, c_out, group, bias)
    graph, counts = run_pass(model(nodes, {"x": [1, c_in, 5, 5]}, initializers=inits), fuse_conv_bn)
    assert ops(graph) == [op] and counts == {"fused": 1}
    assert graph.nodes[0].outputs == ["y"] and len(graph.nodes[0].inputs) == 3


def test_shared_weight_is_not_modified_for_other_reader():
    nodes, inits = _conv_bn("Conv", 3, 4, 1, True)
    nodes.append(node("Conv", ["x", "w", "b"], ["z"], pads=[1, 1, 1, 1]))
    graph, _ = run_pass(model(nodes, {"x": [1, 3, 5, 5]}, ["y", "z"], inits), fuse_conv_bn)
    assert ops(graph) == ["Conv", "Conv"]
    assert graph.nodes[1].inputs == ["x", "w", "b"]


def test_not_folded_when_conv_output_has_two_readers():
    nodes, inits = _conv_bn("Conv", 3, 4, 1, True)
    nodes.append(node("Relu", ["c"], ["z"]))
    graph, counts = run_pass(model(nodes, {"x": [1, 3, 5, 5]}, ["y", "z"], inits), fuse_conv_bn)
    assert ops(graph) == ["Conv", "BatchNormalization", "Relu"] and counts["fused"] == 0


def test_not_folded_with_runtime_weight_or_params():
    nodes, inits = _conv_bn("Conv", 3, 4, 1, False)
    del inits["w"]
    m = model(nodes, {"x": [1, 3, 5, 5], "w": [4, 3, 3, 3]}, initializers=inits)
    graph, counts = run_pass(m, fuse_conv_bn)
    assert counts["fused"] == 0
    nodes, inits = _conv_bn("Conv", 3, 4, 1, False)
    del inits["mean"]
    m = model(nodes, {"x": [1, 3, 5, 5], "mean": [4]}, initializers=inits)
    graph, counts = run_pass(m, fuse_conv_bn)
    assert ops(graph) == ["Conv", "BatchNormalization"] and counts["fused"] == 0
