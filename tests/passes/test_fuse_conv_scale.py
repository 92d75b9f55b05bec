"""fuse_conv_scale: Conv -> Mul(per-channel constant) folds into the conv's weights and bias."""

import numpy as np
import pytest

from optcli.passes import fuse_conv_scale
from tests.passes.ir_build import model, node, ops, run_pass

F = np.float32
RNG = np.random.default_rng(11)


def _conv_mul(gamma: np.ndarray, bias: bool = True, flip: bool = False, out: tuple = ("y",)) -> tuple:
    inits = {"w": RNG.standard_normal((6, 3, 3, 3)).astype(F), "g": gamma.astype(F)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(6).astype(F)
        conv_inputs.append("b")
    nodes = [node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
             node("Mul", ["g", "c"] if flip else ["c", "g"], ["y"])]
    return model(nodes, {"x": [1, 3, 5, 5]}, outputs=list(out), initializers=inits), inits


@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (6, 1, 1), ()])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_scale_folds(shape, bias):
    m, inits = _conv_mul(RNG.uniform(0.1, 2.0, shape), bias=bias, flip=shape == ())
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv"] and counts == {"fused": 1}
    conv = graph.nodes[0]
    assert conv.outputs == ["y"] and len(conv.inputs) == 3
    np.testing.assert_array_equal(graph.initializers["w"], inits["w"])  # left as it was, for other readers


def test_conv_transpose_with_groups():
    inits = {"w": RNG.standard_normal((4, 3, 2, 2)).astype(F), "g": RNG.uniform(0.1, 2, (1, 6, 1, 1)).astype(F)}
    nodes = [node("ConvTranspose", ["x", "w"], ["c"], group=2, strides=[2, 2]), node("Mul", ["c", "g"], ["y"])]
    m = model(nodes, {"x": [1, 4, 3, 3]}, initializers=inits)
    graph, _ = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["ConvTranspose"]


def test_scale_varying_along_space_stays():
    m, _ = _conv_mul(RNG.uniform(0.1, 2.0, (1, 1, 5, 1)))
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"] and counts["fused"] == 0


def test_conv_output_read_elsewhere_stays():
    m, _ = _conv_mul(RNG.uniform(0.1, 2.0, (1, 6, 1, 1)), out=("y", "c"))
    graph, counts = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"] and counts["fused"] == 0


def test_runtime_scale_stays():
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Mul", ["c", "s"], ["y"])]
    w = RNG.standard_normal((6, 3, 1, 1)).astype(F)
    m = model(nodes, {"x": [1, 3, 4, 4], "s": [1, 6, 1, 1]}, initializers={"w": w})
    graph, _ = run_pass(m, fuse_conv_scale)
    assert ops(graph) == ["Conv", "Mul"]
