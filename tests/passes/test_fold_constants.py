"""fold_constants: constant subgraphs, Constant nodes and static Shape/Size become initializers."""

import numpy as np
from onnx import helper

from optcli.passes import fold_constants
from tests.passes.ir_build import const, model, node, ops, run_pass, to_graph


def test_folds_constant_subgraph_and_constant_nodes():
    m = model(
        [
            const("c", [1.0, 2.0, 3.0]),
            node("Add", ["a", "c"], ["s"]),
            node("Mul", ["s", "s"], ["w"]),
            node("Mul", ["x", "w"], ["y"]),
        ],
        {"x": [2, 3]},
        initializers={"a": np.array([0.5, -1.0, 2.0], np.float32)},
    )
    graph, counts = run_pass(m, fold_constants)
    assert ops(graph) == ["Mul"]
    assert counts == {"folded": 2, "constants": 1, "shapes": 0}
    np.testing.assert_allclose(graph.initializers["w"], [2.25, 1.0, 25.0])
    assert set(graph.initializers) == {"w"}


def test_folds_static_shape_and_size():
    m = model(
        [
            node("Shape", ["x"], ["s"]),
            node("Size", ["x"], ["n"]),
            node("Reshape", ["x", "flat"], ["f"]),
            node("Reshape", ["f", "s"], ["r"]),
            node("Cast", ["n"], ["nf"], to=helper.np_dtype_to_tensor_dtype(np.dtype(np.float32))),
            node("Add", ["r", "nf"], ["y"]),
        ],
        {"x": [2, 3, 4]},
        initializers={"flat": np.array([-1], np.int64)},
    )
    graph, counts = run_pass(m, fold_constants)
    assert counts["shapes"] == 2 and counts["folded"] == 1
    assert ops(graph) == ["Reshape", "Reshape", "Add"]
    assert graph.initializers["s"].tolist() == [2, 3, 4]
    assert float(graph.initializers["nf"]) == 24.0


def test_leaves_dynamic_shape_random_and_graph_outputs():
    m = model(
        [
            node("Shape", ["x"], ["s"]),
            node("Cast", ["s"], ["sf"], to=1),
            node("RandomNormal", [], ["r"], shape=[2]),
            node("Add", ["sf", "r"], ["y"]),
            node("Neg", ["a"], ["z"]),
        ],
        {"x": ["N", 3]},
        outputs=["y", "z"],
        initializers={"a": np.ones(3, np.float32)},
    )
    graph = to_graph(m)
    counts = fold_constants.run(graph, None)
    assert ops(graph) == ["Shape", "Cast", "RandomNormal", "Add", "Neg"]
    assert sum(counts.values()) == 0


def test_does_not_materialise_huge_results():
    m = model(
        [
            node("ConstantOfShape", ["shape"], ["big"]),
            node("ReduceSum", ["big"], ["s"], keepdims=0),
            node("Add", ["x", "s"], ["y"]),
        ],
        {"x": [1]},
        initializers={"shape": np.array([5000, 5000], np.int64)},
    )
    graph = to_graph(m)
    fold_constants.run(graph, None)
    assert ops(graph)[:2] == ["ConstantOfShape", "ReduceSum"]


def test_nodes_with_subgraphs_stay():
    out = helper.make_tensor_value_info("t", 1, [3])
    then = helper.make_graph([const("t", [1.0, 2.0, 3.0])], "then", [], [out])
    other = helper.make_graph([const("t", [0.0, 0.0, 0.0])], "else", [], [out])
    m = model(
        [node("If", ["cond"], ["r"], then_branch=then, else_branch=other), node("Add", ["x", "r"], ["y"])],
        {"x": [3]},
        initializers={"cond": np.array(True)},
    )
    graph, counts = run_pass(m, fold_constants)
    assert ops(graph) == ["If", "Add"] and counts["folded"] == 0
