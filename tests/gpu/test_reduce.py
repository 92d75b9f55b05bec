"""Reduce GPU kernel against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(6)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum", "ReduceMin"])
@pytest.mark.parametrize("shape, axes, keepdims", [
    ((2, 6, 3, 4), [2, 3], 1), ((2, 6, 3, 4), [2, 3], 0), ((2, 5, 3, 4), [1], 1), ((2, 5, 3, 4), [1], 0),
    ((2, 5, 3, 4), [0, 3], 0), ((2, 7), [-1], 0), ((2, 5, 6), [2], 0), ((2, 3, 3, 4), None, 0),
])
def test_reduce(shape, axes, keepdims, op, precision):
    x = RNG.standard_normal(shape).astype(np.float32)
    attrs = {"keepdims": keepdims}
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    graph, node = one_node_graph(op, {"x": x}, consts, attrs, opset=18)
    check_gpu(graph, node, {"x": x}, precision)


def test_reduce_axes_attribute():
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    graph, node = one_node_graph("ReduceMean", {"x": x}, attrs={"axes": [1, 2], "keepdims": 1}, opset=13)
    check_gpu(graph, node, {"x": x})


def test_rejects():
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    graph, node = one_node_graph("ReduceMean", {"x": x, "axes": np.array([1], np.int64)}, opset=18)
    assert "constant" in gpu_kernels_for("ReduceMean")[0].check(node, graph)
    graph, node = one_node_graph("ReduceSum", {"x": x}, attrs={"noop_with_empty_axes": 1}, opset=18)
    assert "noop_with_empty_axes" in gpu_kernels_for("ReduceSum")[0].check(node, graph)
