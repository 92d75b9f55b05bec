"""eliminate_identity: no-op nodes go, nodes that do work (or whose removal would rename an output) stay."""

import numpy as np
from onnx import TensorProto

from optcli.passes import eliminate_identity
from tests.passes.ir_build import model, node, ops, run_pass


def test_removes_chain_of_noops():
    m = model(
        [
            node("Identity", ["x"], ["a"]),
            node("Dropout", ["a"], ["b"]),
            node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
            node("Transpose", ["c"], ["d"], perm=[0, 1, 2]),
            node("Reshape", ["d", "shape"], ["e"]),
            node("Pad", ["e", "zeros"], ["f"]),
            node("Concat", ["f"], ["g"], axis=0),
            node("Slice", ["g", "starts", "ends"], ["h"]),
            node("Mul", ["one", "h"], ["i"]),
            node("Add", ["i", "zero"], ["j"]),
            node("Expand", ["j", "shape"], ["k"]),
            node("Relu", ["k"], ["y"]),
        ],
        {"x": [2, 3, 4]},
        initializers={
            "shape": np.array([2, 3, 4], np.int64),
            "zeros": np.zeros(6, np.int64),
            "starts": np.array([0, 0], np.int64),
            "ends": np.array([100, 3], np.int64),
            "one": np.ones((1, 4), np.float32),
            "zero": np.zeros((), np.float32),
        },
    )
    graph, counts = run_pass(m, eliminate_identity)
    assert ops(graph) == ["Relu"]
    assert sum(counts.values()) == 11
    assert graph.nodes[0].inputs == ["x"]


def test_graph_output_keeps_its_name():
    m = model([node("Relu", ["x"], ["a"]), node("Identity", ["a"], ["y"])], {"x": [3]})
    graph, _ = run_pass(m, eliminate_identity)
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs == ["y"]


def test_identity_from_input_to_output_stays():
    m = model([node("Identity", ["x"], ["y"])], {"x": [3]})
    graph, _ = run_pass(m, eliminate_identity)
    assert ops(graph) == ["Identity"]


def test_keeps_nodes_that_do_work():
    m = model(
        [
            node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
            node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
            node("Mul", ["d", "ones"], ["e"]),  # [3] * [3, 1] broadcasts to [3, 3]
            node("Transpose", ["e"], ["f"], perm=[1, 0]),
            node("Dropout", ["f"], ["y", "mask"]),
        ],
        {"x": [3]},
        outputs=["y", "mask"],
        initializers={"ones": np.ones((3, 1), np.float32)},
    )
    graph, counts = run_pass(m, eliminate_identity)
    assert ops(graph) == ["Cast", "Cast", "Mul", "Transpose", "Dropout"]
    assert not counts
