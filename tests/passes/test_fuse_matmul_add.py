"""fuse_matmul_add: MatMul(+Add) and Gemm with constant weights -> optcli.FullyConnected."""

import numpy as np

from optcli.passes import fuse_matmul_add
from tests.passes.ir_build import model, node, ops, run_pass

RNG = np.random.default_rng(3)
W = RNG.standard_normal((8, 5)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)


def test_matmul_add_becomes_fc_with_bias():
    m = model(
        [node("MatMul", ["x", "w"], ["m"]), node("Add", ["b", "m"], ["y"])],
        {"x": [3, 8]},
        initializers={"w": W, "b": B},
    )
    graph, counts = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected"] and counts["matmul_add"] == 1
    fc = graph.nodes[0]
    assert fc.domain == "optcli" and fc.outputs == ["y"] and len(fc.inputs) == 3


def test_rank3_input_and_row_bias():
    m = model(
        [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])],
        {"x": [2, 3, 8]},
        initializers={"w": W, "b": B.reshape(1, 1, 5)},
    )
    graph, _ = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected"]


def test_lone_matmul_becomes_fc_without_bias():
    m = model([node("MatMul", ["x", "w"], ["y"])], {"x": [3, 8]}, initializers={"w": W})
    graph, counts = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected"] and len(graph.nodes[0].inputs) == 2 and counts["matmul"] == 1


def test_gemm_transposed_with_alpha_beta():
    m = model(
        [node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)],
        {"x": [3, 8]},
        initializers={"w": W.T.copy(), "c": B.reshape(1, 5)},
    )
    graph, counts = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected"] and counts["gemm"] == 1
    np.testing.assert_allclose(graph.initializers[graph.nodes[0].inputs[1]], 0.5 * W)


def test_add_that_is_not_a_bias_stays():
    # [3, 5] varies along the rows: not a per-column bias.
    m = model(
        [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "c"], ["y"])],
        {"x": [3, 8]},
        initializers={"w": W, "c": RNG.standard_normal((3, 5)).astype(np.float32)},
    )
    graph, _ = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected", "Add"] and len(graph.nodes[0].inputs) == 2


def test_matmul_output_with_two_readers_keeps_add():
    m = model(
        [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "b"], ["y"])],
        {"x": [3, 8]},
        outputs=["y", "m"],
        initializers={"w": W, "b": B},
    )
    graph, _ = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["FullyConnected", "Add"]


def test_runtime_weight_and_transposed_a_stay():
    m = model(
        [
            node("MatMul", ["x", "w"], ["m"]),
            node("Gemm", ["xt", "v"], ["g"], transA=1),
            node("Add", ["m", "g"], ["y"]),
        ],
        {"x": [3, 8], "w": [8, 5], "xt": [8, 3]},
        initializers={"v": W},
    )
    graph, counts = run_pass(m, fuse_matmul_add)
    assert ops(graph) == ["MatMul", "Gemm", "Add"] and sum(counts.values()) == 0
