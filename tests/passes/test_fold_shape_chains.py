"""fold_shape_chains: Transpose chains composed, size-1 Transposes to Reshape, reshape chains merged."""

import numpy as np

from optcli.passes import fold_shape_chains
from tests.passes.ir_build import feeds_for, model, node, ops, run_pass


def test_inverse_transposes_vanish():
    m = model(
        [
            node("Relu", ["x"], ["r"]),
            node("Transpose", ["r"], ["t1"], perm=[0, 2, 3, 1]),
            node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
            node("Neg", ["t2"], ["y"]),
        ],
        {"x": [1, 2, 3, 4]},
    )
    graph, counts = run_pass(m, fold_shape_chains)
    assert ops(graph) == ["Relu", "Neg"] and counts["transposes"] == 1


def test_transposes_compose():
    m = model(
        [node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]), node("Transpose", ["t1"], ["y"], perm=[1, 0, 2])],
        {"x": [2, 3, 4]},
    )
    graph, _ = run_pass(m, fold_shape_chains)
    assert ops(graph) == ["Transpose"] and graph.nodes[0].attrs["perm"] == [2, 0, 1]


def test_transpose_of_unit_dims_becomes_reshape():
    m = model([node("Transpose", ["x"], ["y"], perm=[1, 0, 3, 2])], {"x": ["N", 1, 4, 1]})
    graph, counts = run_pass(m, fold_shape_chains, feeds=feeds_for(m, dims={"N": 3}))
    assert ops(graph) == ["Reshape"] and counts["transpose_to_reshape"] == 1
    assert graph.initializers[graph.nodes[0].inputs[1]].tolist() == [1, -1, 1, 4]


def test_real_transpose_stays():
    m = model([node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], {"x": [2, 3, 4]})
    graph, _ = run_pass(m, fold_shape_chains)
    assert ops(graph) == ["Transpose"]


def test_static_reshape_chain_becomes_one_reshape():
    m = model(
        [
            node("Flatten", ["x"], ["f"], axis=1),
            node("Unsqueeze", ["f", "ax"], ["u"]),
            node("Reshape", ["u", "shape"], ["r"]),
            node("Squeeze", ["r", "ax"], ["y"]),
        ],
        {"x": [2, 3, 4]},
        initializers={"ax": np.array([0], np.int64), "shape": np.array([1, 4, 6], np.int64)},
    )
    graph, counts = run_pass(m, fold_shape_chains)
    assert ops(graph) == ["Reshape"] and counts["reshapes"] == 3
    assert graph.initializers[graph.nodes[0].inputs[1]].tolist() == [4, 6]


def test_dynamic_batch_uses_copy_dim():
    m = model(
        [node("Flatten", ["x"], ["f"], axis=1), node("Unsqueeze", ["f", "ax"], ["y"])],
        {"x": ["N", 3, 4]},
        initializers={"ax": np.array([2], np.int64)},
    )
    graph, _ = run_pass(m, fold_shape_chains, feeds=feeds_for(m, dims={"N": 5}))
    assert ops(graph) == ["Reshape"]
    assert graph.initializers[graph.nodes[0].inputs[1]].tolist() == [0, 12, 1]


def test_two_unknown_dims_in_new_places_stay():
    m = model(
        [node("Unsqueeze", ["x", "a2"], ["u"]), node("Unsqueeze", ["u", "a0"], ["y"])],
        {"x": ["N", "M"]},
        initializers={"a2": np.array([2], np.int64), "a0": np.array([0], np.int64)},
    )
    graph, _ = run_pass(m, fold_shape_chains, feeds=feeds_for(m, dims={"N": 2, "M": 3}))
    assert ops(graph) == ["Unsqueeze", "Unsqueeze"]


def test_intermediate_with_other_reader_stays():
    m = model(
        [node("Flatten", ["x"], ["f"], axis=1), node("Unsqueeze", ["f", "ax"], ["y"])],
        {"x": [2, 3, 4]},
        outputs=["y", "f"],
        initializers={"ax": np.array([0], np.int64)},
    )
    graph, _ = run_pass(m, fold_shape_chains)
    assert ops(graph) == ["Flatten", "Unsqueeze"]
