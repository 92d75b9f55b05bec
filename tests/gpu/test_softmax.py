"""Softmax / LogSoftmax GPU kernels against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis", [
    ((2, 10), -1), ((2, 7), 0), ((2, 5, 6), 1), ((2, 5, 6), -1), ((2, 5, 6), 0),
    ((2, 6, 3, 4), 1), ((2, 5, 3, 4), 2), ((2, 5, 3, 4), 3), ((2, 3, 3, 4), 0), ((7,), 0),
])
def test_softmax(shape, axis, op, precision):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    graph, node = one_node_graph(op, {"x": x}, attrs={"axis": axis})
    check_gpu(graph, node, {"x": x}, precision)


def test_softmax_opset11():
    x = RNG.standard_normal((2, 9)).astype(np.float32)
    graph, node = one_node_graph("Softmax", {"x": x}, opset=11)
    check_gpu(graph, node, {"x": x})
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    graph, node = one_node_graph("Softmax", {"x": x}, attrs={"axis": 1}, opset=11)
    assert "coerced" in gpu_kernels_for("Softmax")[0].check(node, graph)
