"""Stand-alone activations on the GPU against the numpy reference, fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest

import optcli.gpu.ops  # noqa: F401  (registers the kernels)
from tests.gpu.harness import check_gpu, one_node_graph

X = np.random.default_rng(0).standard_normal((2, 6, 5, 7)).astype(np.float32) * 3


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("op, attrs, consts", [
    ("Relu", {}, {}), ("Sigmoid", {}, {}), ("Tanh", {}, {}), ("HardSwish", {}, {}),
    ("LeakyRelu", {"alpha": 0.1}, {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {}),
    ("Clip", {}, {"lo": np.array(-1.0, np.float32), "hi": np.array(6.0, np.float32)}),
])
def test_activation(op, attrs, consts, precision):
    graph, node = one_node_graph(op, {"x": X}, consts, attrs)
    check_gpu(graph, node, {"x": X}, precision)


def test_swish_and_low_rank():
    x = X.reshape(2, 30, 7)[:, :, 0].copy()  # rank 2: packed as N, C
    graph, node = one_node_graph("Swish", {"x": x}, domain="optcli")
    check_gpu(graph, node, {"x": x})
