"""Element-wise GPU kernels (binary with broadcasting, PRelu, unary maths) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import optcli.gpu.ops  # noqa: F401  (registers the kernels)
from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(1)


def _r(*shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


# (a shape, b shape, b constant?)
BROADCASTS = [
    ((2, 5, 3, 4), (2, 5, 3, 4), False),   # same shape
    ((2, 6, 3, 4), (6, 1, 1), True),       # per-channel constant [C,1,1]
    ((2, 6, 3, 4), (1, 6, 1, 1), False),   # per-channel runtime [1,C,1,1]
    ((2, 5, 3, 4), (2, 5, 1, 1), False),   # squeeze-excite gate [N,C,1,1]
    ((2, 3, 3, 4), (), True),              # scalar constant
    ((2, 3, 3, 4), (1,), False),           # size-1 runtime
    ((2, 7), (7,), True),                  # rank 2, [C]
    ((2, 7), (7,), False),
    ((2, 5, 6), (2, 5, 1), False),         # rank 3
    ((2, 5, 3, 4), (1, 1, 3, 4), True),    # spatial-only constant
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("a_shape, b_shape, const", BROADCASTS)
def test_add_broadcast(a_shape, b_shape, const, precision):
    a, b = _r(*a_shape), _r(*b_shape)
    inputs, consts = ({"a": a}, {"b": b}) if const else ({"a": a, "b": b}, {})
    graph, node = one_node_graph("Add", inputs, consts)
    check_gpu(graph, node, inputs, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["Sub", "Mul", "Div", "Max", "Min"])
def test_binary_ops(op, precision):
    a, b = _r(2, 6, 3, 4), _r(2, 6, 1, 1, positive=op == "Div")
    # b first: the broadcast operand may be either one
    graph, node = one_node_graph(op, {"b": b, "a": a})
    check_gpu(graph, node, {"b": b, "a": a}, precision)
    graph, node = one_node_graph(op, {"a": a, "b": b})
    check_gpu(graph, node, {"a": a, "b": b}, precision)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_fused_epilogue(op):
    a, b = _r(2, 5, 3, 3), _r(5, 1, 1)
    graph, node = one_node_graph(op, {"a": a}, {"b": b})
    node.attrs.update(activation="sigmoid")
    check_gpu(graph, node, {"a": a})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("slope_shape", [(5, 1, 1), (1,)])
def test_prelu(slope_shape, precision):
    x, slope = _r(2, 5, 3, 4), _r(*slope_shape)
    graph, node = one_node_graph("PRelu", {"x": x}, {"s": slope})
    check_gpu(graph, node, {"x": x}, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["Exp", "Neg", "Abs", "Sqrt", "Log", "Reciprocal", "Erf", "Softplus", "Floor"])
def test_unary(op, precision):
    if op == "Floor" and precision == "fp16":
        pytest.skip("floor is discontinuous: rounding the input to half moves values across integers")
    x = _r(2, 6, 3, 5, positive=op in ("Sqrt", "Log", "Reciprocal"))
    graph, node = one_node_graph(op, {"x": x})
    check_gpu(graph, node, {"x": x}, precision)


def test_unary_rank2():
    x = _r(2, 7)
    graph, node = one_node_graph("Exp", {"x": x})
    check_gpu(graph, node, {"x": x})


def _check(op, graph, node):
    return gpu_kernels_for(op)[0].check(node, graph)


def test_rejects():
    x = _r(2, 6, 3, 4)
    graph, node = one_node_graph("Add", {"x": x, "b": _r(6, 1, 1)})
    assert "broadcast pattern" in _check("Add", graph, node)
    graph, node = one_node_graph("Max", {"x": x, "y": x, "z": x})
    assert "3 inputs" in _check("Max", graph, node)
    graph, node = one_node_graph("And", {"p": x > 0, "q": x < 1})
    assert "bool tensors stay on the host" in _check("And", graph, node)
    graph, node = one_node_graph("Add", {"x": x.reshape(2, 6, 3, 4, 1), "y": x.reshape(2, 6, 3, 4, 1)})
    assert "rank 5" in _check("Add", graph, node)
