"""LayerNormalization and InstanceNormalization GPU kernels against the numpy reference: rows along
W (sequences [N, T, D], the transformer case) and along H, W; 1-D (rank 3) and 2-D instance norm;
what crosses the packed channel axis is refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(9)


def _r(*shape, scale=1.0, shift=0.0):
    return (RNG.standard_normal(shape) * scale + shift).astype(np.float32)


# (x shape, axis, scale shape, bias shape or None)
LAYER_CASES = [
    ((2, 7, 13), -1, (13,), (13,)),        # [N, T, D]: T on the channel slices, D along W
    ((1, 5, 64), 2, (64,), None),          # Whisper-like width, no bias
    ((2, 6, 3, 5), -1, (5,), (5,)),        # rank 4, along W
    ((2, 5, 3, 4), 2, (3, 4), (1, 4)),     # rank 4, along H and W; a bias broadcast along H
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("x_shape, axis, s_shape, b_shape", LAYER_CASES)
def test_layer_normalization(x_shape, axis, s_shape, b_shape, precision):
    x = _r(*x_shape, scale=2.0, shift=0.5)
    consts = {"s": _r(*s_shape), **({"b": _r(*b_shape)} if b_shape else {})}
    graph, node = one_node_graph("LayerNormalization", {"x": x}, consts, {"axis": axis, "epsilon": 1e-3})
    check_gpu(graph, node, {"x": x}, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("x_shape", [(2, 6, 17), (1, 3, 4, 5), (3, 5)])
def test_instance_normalization(x_shape, precision):
    x = _r(*x_shape, scale=3.0, shift=-1.0)
    c = x_shape[1]
    graph, node = one_node_graph("InstanceNormalization", {"x": x}, {"s": _r(c), "b": _r(c)}, {"epsilon": 1e-4})
    check_gpu(graph, node, {"x": x}, precision)


def _reason(op, graph, node):
    (kern,) = gpu_kernels_for(op)
    return kern.check(node, graph)


def test_rejects():
    x3 = _r(2, 6, 8)
    # across the packed channel axis: [N, D] with axis -1, and [N, T, D] from axis 1
    graph, node = one_node_graph("LayerNormalization", {"x": x3[:, 0]}, {"s": _r(8)}, {"axis": -1})
    assert "channel axis" in _reason("LayerNormalization", graph, node)
    graph, node = one_node_graph("LayerNormalization", {"x": x3}, {"s": _r(6, 8)}, {"axis": 1})
    assert "channel axis" in _reason("LayerNormalization", graph, node)
    # a runtime scale, the statistics outputs
    graph, node = one_node_graph("LayerNormalization", {"x": x3, "s": _r(8)})
    assert "not a constant" in _reason("LayerNormalization", graph, node)
    graph, node = one_node_graph("LayerNormalization", {"x": x3}, {"s": _r(8)}, n_outputs=3)
    assert "InvStdDev" in _reason("LayerNormalization", graph, node)
    # a scale that does not broadcast to the normalised shape, an axis out of range
    graph, node = one_node_graph("LayerNormalization", {"x": x3}, {"s": _r(8)})
    graph.initializers["s"] = _r(3)
    assert "does not broadcast" in _reason("LayerNormalization", graph, node)
    graph, node = one_node_graph("LayerNormalization", {"x": x3}, {"s": _r(8)})
    node.attrs["axis"] = -4
    assert "out of range" in _reason("LayerNormalization", graph, node)
    graph, node = one_node_graph("InstanceNormalization", {"x": x3, "s": _r(6)}, {"b": _r(6)},
                                 input_names=["x", "s", "b"])
    assert "not a constant" in _reason("InstanceNormalization", graph, node)
    graph, node = one_node_graph("InstanceNormalization", {"x": x3}, {"s": _r(6), "b": _r(6)})
    node.inputs[2] = ""
    assert "needs scale and B" in _reason("InstanceNormalization", graph, node)
    x5 = _r(1, 2, 3, 3, 3)
    graph, node = one_node_graph("InstanceNormalization", {"x": x5}, {"s": _r(2), "b": _r(2)})
    assert "rank 5" in _reason("InstanceNormalization", graph, node)
