"""fold_dynamic_reshape_shapes: a Reshape target assembled from run-time dims becomes a constant
with 0 (copy the same-position dim) and -1 (infer one dim), or stays when that cannot be proved."""

import numpy as np

from optcli.passes import fold_dynamic_reshape_shapes as fold
from optcli.passes import remove_dead_nodes
from optcli.passes.base import PassContext
from tests.passes.ir_build import check_same, feeds_for, model, node, ops, to_graph

I64 = np.int64
CONSTS = {"i0": np.array(0, I64), "i1": np.array(1, I64), "ax": np.array([0], I64), "six": np.array([6], I64),
          "two": np.array([2], I64), "four": np.array([4], I64), "m1": np.array([-1], I64),
          "s0": np.array([0], I64), "s2": np.array([2], I64)}


def _dim(src: str, index: str, out: str) -> list:
    """Unsqueeze(Gather(Shape(src), index)), as PyTorch traces ``src.shape[i]``."""
    return [node("Shape", [src], [f"{out}_s"]), node("Gather", [f"{out}_s", index], [f"{out}_g"]),
            node("Unsqueeze", [f"{out}_g", "ax"], [out])]


def _fold(m, dims: dict[str, int]):
    graph = to_graph(m)
    counts = fold.run(graph, PassContext())
    remove_dead_nodes.run(graph, PassContext())
    check_same(m, graph, feeds_for(m, dims=dims))
    return graph, counts


def _target(graph) -> list[int]:
    reshape = next(n for n in graph.nodes if n.op_type == "Reshape")
    return graph.const(reshape.inputs[1]).tolist()


def test_batch_copied_static_dims_written():
    nodes = [*_dim("x", "i0", "b"), *_dim("x", "i1", "n"), node("Concat", ["b", "n", "two", "four"], ["t"], axis=0),
             node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["B", 6, 8]}, initializers=CONSTS)
    graph, counts = _fold(m, {"B": 3})
    assert ops(graph) == ["Reshape"] and counts == {"folded": 1}
    assert _target(graph) == [0, 6, 2, 4]


def test_two_copied_dynamic_dims_and_one_inferred():
    nodes = [*_dim("x", "i0", "b"), *_dim("x", "i1", "s"), node("Concat", ["b", "s", "two", "m1"], ["t"], axis=0),
             node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["B", "S", 8]}, initializers=CONSTS)
    graph, _ = _fold(m, {"B": 2, "S": 5})
    assert ops(graph) == ["Reshape"] and _target(graph) == [0, 0, 2, -1]


def test_dim_read_from_another_tensor_with_the_same_symbol():
    nodes = [*_dim("t0", "i0", "b"), node("Concat", ["b", "m1"], ["t"], axis=0), node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["B", 6, 4], "t0": ["B", 5]}, initializers=CONSTS)
    graph, _ = _fold(m, {"B": 3})
    assert ops(graph) == ["Reshape"] and _target(graph) == [0, -1]


def test_slice_of_shape():
    nodes = [node("Shape", ["x"], ["sh"]), node("Slice", ["sh", "s0", "s2"], ["lead"]),
             node("Concat", ["lead", "m1"], ["t"], axis=0), node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["B", 6, 4, 2]}, initializers=CONSTS)
    graph, _ = _fold(m, {"B": 3})
    assert ops(graph) == ["Reshape"] and _target(graph) == [0, 6, -1]


def test_unrelated_dynamic_dims_stay():
    # Both dims come from a tensor whose symbols say nothing about x's: two unknowns, no fold.
    nodes = [*_dim("t0", "i0", "a"), *_dim("t0", "i1", "b"), node("Concat", ["a", "b", "four"], ["t"], axis=0),
             node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["N", 4], "t0": ["P", "Q"]}, initializers=CONSTS)
    feeds = {"x": np.ones((6, 4), np.float32), "t0": np.ones((2, 3), np.float32)}
    graph = to_graph(m)
    assert fold.run(graph, PassContext()) == {"folded": 0}
    check_same(m, graph, feeds)


def test_dim_at_another_position_is_not_a_copy():
    # x is [B, S, 8]; the target puts S first: 0 there would copy B, so it must be -1.
    nodes = [*_dim("x", "i1", "s"), *_dim("x", "i0", "b"), node("Concat", ["s", "b", "m1"], ["t"], axis=0),
             node("Reshape", ["x", "t"], ["y"])]
    m = model(nodes, {"x": ["B", "S", 8]}, initializers=CONSTS)
    graph = to_graph(m)
    assert fold.run(graph, PassContext()) == {"folded": 0}  # S, B both unprovable, plus the -1
    check_same(m, graph, feeds_for(m, dims={"B": 2, "S": 3}))


def test_allowzero_stays():
    nodes = [*_dim("x", "i0", "b"), node("Concat", ["b", "m1"], ["t"], axis=0),
             node("Reshape", ["x", "t"], ["y"], allowzero=1)]
    m = model(nodes, {"x": ["B", 6, 4]}, initializers=CONSTS, opset=14)
    graph = to_graph(m)
    assert fold.run(graph, PassContext()) == {"folded": 0}
