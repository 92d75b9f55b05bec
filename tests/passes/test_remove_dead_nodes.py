"""remove_dead_nodes: unreachable nodes and unused initializers go, live ones stay."""

import numpy as np

from optcli.passes import remove_dead_nodes
from tests.passes.ir_build import model, node, ops, run_pass


def test_removes_branch_not_reaching_output():
    m = model(
        [node("Relu", ["x"], ["y"]), node("Mul", ["x", "w"], ["dead"]), node("Sigmoid", ["dead"], ["dead2"])],
        {"x": [2, 3]},
        initializers={"w": np.ones((2, 3), np.float32), "unused": np.zeros(4, np.float32)},
    )
    graph, counts = run_pass(m, remove_dead_nodes)
    assert ops(graph) == ["Relu"]
    assert counts == {"nodes": 2, "initializers": 2}
    assert graph.initializers == {}


def test_keeps_everything_live():
    m = model(
        [node("Relu", ["x"], ["a"]), node("Add", ["a", "x"], ["y"]), node("Neg", ["a"], ["z"])],
        {"x": [4]},
        outputs=["y", "z"],
    )
    graph, counts = run_pass(m, remove_dead_nodes)
    assert ops(graph) == ["Relu", "Add", "Neg"]
    assert counts["nodes"] == 0
