"""MatMul of two run-time operands (attention's Q·Kᵀ and P·V) on the GPU against the numpy
reference, fp32 and fp16: ranks 2-4, batch broadcasting, sizes that are not multiples of 4, and
which variant the target picks (the constant-weight kernel keeps the nodes it applies to)."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import get_gpu_kernel
from optcli.targets.gpu import OPENCL
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(5)
PRECISIONS = ["fp32", "fp16"]
HEADS, BATCHED = "gpu.onnx.MatMul.heads", "gpu.onnx.MatMul.batched"

# (A shape, B shape): module constant, reused by the Metal shim cases
CASES = [
    ((1, 3, 13, 8), (1, 3, 8, 13)),  # Q.K^T of 3 heads (ViT-tiny-like: heads < 4, odd T)
    ((1, 3, 13, 13), (1, 3, 13, 8)),  # P.V
    ((2, 5, 6, 7), (2, 5, 7, 9)),  # 5 heads: two channel slices, the second padded
    ((1, 5, 6, 7), (2, 5, 7, 3)),  # batch axis 0 broadcast (left)
    ((2, 4, 3, 5), (1, 4, 5, 6)),  # batch axis 0 broadcast (right), heads a multiple of 4
    ((2, 1, 5, 7), (2, 6, 7, 9)),  # broadcast head axis
    ((3, 5, 7), (3, 7, 6)),  # rank 3 (batched matrices: rows in the lanes)
    ((3, 5, 7), (1, 7, 6)),  # rank 3, batch broadcast
    ((5, 7), (7, 6)),  # rank 2
    ((1, 9), (9, 1)),  # a dot product
    ((2, 3, 5, 7), (7, 6)),  # rank 4 by a run-time matrix
    ((5, 7), (2, 3, 7, 6)),  # a matrix by rank 4
    ((3, 5, 7), (2, 1, 7, 6)),  # rank 3 by rank 4, both batch axes broadcast
    ((6, 5, 7), (7, 6)),  # rank 3 by rank 2
]


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _graph(a_shape, b_shape, const_a=False, const_b=False):
    a, b = rand(*a_shape), rand(*b_shape)
    inputs = {k: v for k, v, const in (("a", a, const_a), ("b", b, const_b)) if not const}
    consts = {k: v for k, v, const in (("a", a, const_a), ("b", b, const_b)) if const}
    graph, node = one_node_graph("MatMul", inputs, consts, input_names=["a", "b"])
    return graph, node, inputs


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("a_shape, b_shape", CASES)
def test_matmul_two_runtime_operands(a_shape, b_shape, precision):
    graph, node, inputs = _graph(a_shape, b_shape)
    kid = OPENCL.select_kernel(node, graph)
    rank4_same_heads = len(a_shape) == len(b_shape) == 4 and a_shape[1] == b_shape[1]
    assert kid == (HEADS if rank4_same_heads else BATCHED)
    check_gpu(graph, node, inputs, precision, kernel_id=kid)
    if kid == HEADS:  # the general variant takes these too
        check_gpu(graph, node, inputs, precision, kernel_id=BATCHED)


@pytest.mark.parametrize("const_a, b_shape", [(True, (7, 6)), (False, (3, 7, 6)), (True, (2, 3, 7, 6))])
def test_constant_operands_the_weight_kernel_refuses(const_a, b_shape):
    """A constant left operand, or a batched constant right one, is uploaded packed and read by
    the run-time variants."""
    graph, node, inputs = _graph((2, 3, 5, 7), b_shape, const_a=const_a, const_b=not const_a)
    kid = OPENCL.select_kernel(node, graph)
    assert kid != "gpu.onnx.MatMul.default"
    check_gpu(graph, node, inputs, "fp32", kernel_id=kid)


def test_the_constant_weight_kernel_keeps_priority():
    for a_shape in [(5, 7), (2, 5, 7), (2, 3, 5, 7)]:
        graph, node, _ = _graph(a_shape, (7, 6), const_b=True)
        assert OPENCL.select_kernel(node, graph) == "gpu.onnx.MatMul.default"
        assert get_gpu_kernel(BATCHED).check(node, graph) is None  # both fit: the cost decides


def test_checks_reject():
    def reasons(a_shape, b_shape):
        graph, node, _ = _graph(a_shape, b_shape)
        return [get_gpu_kernel(k).check(node, graph) for k in (HEADS, BATCHED)]

    heads, batched = reasons((7,), (7, 3))
    assert batched and "rank 1" in batched and heads and "rank 1" in heads
    heads, batched = reasons((3, 5, 7), (3, 7, 6))
    assert batched is None and "rank 3 and 3" in heads
    heads, batched = reasons((2, 1, 5, 7), (2, 6, 7, 9))
    assert batched is None and "axis 1 differs" in heads
    graph, node, _ = _graph((7,), (2, 7, 3))
    ok, why = OPENCL.can_run(node, graph)  # the reason of the most general variant
    assert not ok and "rank 1" in why, why
