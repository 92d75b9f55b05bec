"""eliminate_common_subexpressions: repeated nodes merge, whole repeated chains in one sweep;
random ops, graph outputs and values read by subgraphs stay apart."""

import numpy as np
from onnx import TensorProto, helper

from optcli.passes import eliminate_common_subexpressions as cse
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, feeds_for, model, node, ops, run_pass, to_graph

I64 = np.int64


def test_repeated_shape_chains_collapse():
    # Two copies of Shape -> Gather -> Unsqueeze -> Concat -> Reshape, their constants under
    # different names: everything but the final Add merges.
    inits = {"i0": np.array(0, I64), "i0b": np.array(0, I64), "ax": np.array([0], I64),
             "axb": np.array([0], I64), "rest": np.array([-1], I64)}
    nodes = [
        node("Shape", ["x"], ["s1"]), node("Shape", ["x"], ["s2"]),
        node("Gather", ["s1", "i0"], ["g1"]), node("Gather", ["s2", "i0b"], ["g2"]),
        node("Unsqueeze", ["g1", "ax"], ["u1"]), node("Unsqueeze", ["g2", "axb"], ["u2"]),
        node("Concat", ["u1", "rest"], ["t1"], axis=0), node("Concat", ["u2", "rest"], ["t2"], axis=0),
        node("Reshape", ["x", "t1"], ["r1"]), node("Reshape", ["x", "t2"], ["r2"]),
        node("Add", ["r1", "r2"], ["y"]),
    ]
    m = model(nodes, {"x": ["N", 3, 4]}, initializers=inits)
    graph, counts = run_pass(m, cse, feeds=feeds_for(m, dims={"N": 5}))
    assert ops(graph) == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Add"]
    assert counts == {"merged": 5}
    assert graph.nodes[-1].inputs == ["r1", "r1"]


def test_commutative_operands_match_in_either_order_but_not_sub():
    nodes = [
        node("Add", ["a", "b"], ["s1"]), node("Add", ["b", "a"], ["s2"]),
        node("Sub", ["a", "b"], ["d1"]), node("Sub", ["b", "a"], ["d2"]),
        node("Concat", ["s1", "s2", "d1", "d2"], ["y"], axis=0),
    ]
    m = model(nodes, {"a": [2, 3], "b": [2, 3]})
    graph, counts = run_pass(m, cse)
    assert ops(graph) == ["Add", "Sub", "Sub", "Concat"] and counts["merged"] == 1


def test_different_attributes_stay_apart():
    nodes = [
        node("Transpose", ["x"], ["t1"], perm=[1, 0, 2]), node("Transpose", ["x"], ["t2"], perm=[0, 2, 1]),
        node("Transpose", ["x"], ["t3"], perm=[1, 0, 2]),
        node("Concat", ["t1", "t2", "t3"], ["y"], axis=0),
    ]
    m = model(nodes, {"x": [3, 3, 3]})
    graph, counts = run_pass(m, cse)
    assert ops(graph) == ["Transpose", "Transpose", "Concat"] and counts["merged"] == 1


def test_graph_outputs_keep_their_producers():
    m = model([node("Relu", ["x"], ["y1"]), node("Relu", ["x"], ["y2"])], {"x": [4]}, outputs=["y1", "y2"])
    graph, counts = run_pass(m, cse)
    assert ops(graph) == ["Relu", "Relu"] and counts["merged"] == 0


def test_random_ops_are_never_merged():
    nodes = [node("RandomNormalLike", ["x"], ["r1"]), node("RandomNormalLike", ["x"], ["r2"]),
             node("Sub", ["r1", "r2"], ["y"])]
    graph = to_graph(model(nodes, {"x": [8]}))
    assert cse.run(graph, PassContext()) == {"merged": 0}
    assert ops(graph) == ["RandomNormalLike", "RandomNormalLike", "Sub"]


def test_value_read_by_a_subgraph_is_not_renamed():
    # 'b' duplicates 'a', but the If's branch reads 'b' by name: merging would break it.
    then_g = helper.make_graph([node("Neg", ["b"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([node("Abs", ["a"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [3])])
    nodes = [
        node("Relu", ["x"], ["a"]), node("Relu", ["x"], ["b"]),
        node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    m = model(nodes, {"x": [3]})
    m.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    graph = to_graph(m)
    assert cse.run(graph, PassContext()) == {"merged": 0}
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    for c in (True, False):
        check_same(m, graph, {"x": x, "c": np.array(c)})


def test_reader_through_the_reference_fallback_sees_the_new_name():
    # Unique has no native kernel: it runs from its kept NodeProto, whose inputs must follow.
    nodes = [node("Relu", ["x"], ["a"]), node("Relu", ["x"], ["b"]),
             node("Unique", ["b"], ["u"], sorted=1), node("Concat", ["a", "u"], ["y"], axis=0)]
    m = model(nodes, {"x": [6]})
    feeds = {"x": np.array([1, -2, 1, 3, 3, 0], np.float32)}
    graph, counts = run_pass(m, cse, feeds=feeds)
    assert counts["merged"] == 1 and graph.nodes[1].inputs == ["a"]
