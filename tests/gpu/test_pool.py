"""1-D and 2-D pooling GPU kernels against the numpy reference (1-D: rank 3, packed as H = 1)."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

X = np.random.default_rng(2).standard_normal((2, 5, 7, 6)).astype(np.float32)

CASES = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [0, 1, 0, 1],
                     "count_include_pad": 1}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op, attrs", CASES)
def test_pool(op, attrs, precision):
    graph, node = one_node_graph(op, {"x": X}, attrs=attrs, opset=19 if "dilations" in attrs else 17)
    check_gpu(graph, node, {"x": X}, precision)


X1 = np.random.default_rng(4).standard_normal((2, 7, 13)).astype(np.float32)
CASES_1D = [
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ("MaxPool", {"kernel_shape": [2], "strides": [2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3], "dilations": [2], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", {"kernel_shape": [3], "strides": [2], "pads": [1, 0], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    ("AveragePool", {"kernel_shape": [2], "strides": [2], "ceil_mode": 1, "pads": [0, 1], "count_include_pad": 1}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op, attrs", CASES_1D)
def test_pool_1d(op, attrs, precision):
    graph, node = one_node_graph(op, {"x": X1}, attrs=attrs, opset=19 if "dilations" in attrs else 17)
    check_gpu(graph, node, {"x": X1}, precision)


def test_rejects():
    x5 = X[:, :, :, :, None].copy()
    graph, node = one_node_graph("MaxPool", {"x": x5}, attrs={"kernel_shape": [2, 2, 1]})
    assert "rank 5" in gpu_kernels_for("MaxPool")[0].check(node, graph)
    graph, node = one_node_graph("MaxPool", {"x": X}, attrs={"kernel_shape": [2, 2]}, n_outputs=2)
    assert "Indices" in gpu_kernels_for("MaxPool")[0].check(node, graph)
