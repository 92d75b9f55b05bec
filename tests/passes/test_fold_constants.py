"""fold_constants: constant subgraphs, Constant nodes and static Shape/Size become initializers."""

import numpy as np
import pytest
from onnx import helper

import optcli
from optcli.ops import evaluate
from optcli.passes import fold_constants
from optcli.passes.base import PassContext
from tests.helpers import assert_close, run_ort
from tests.passes.ir_build import const, model, node, ops, run_pass, to_graph
from tests.passes.tf_same_padding import tf_same_padding_model


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
    assert counts == {"folded": 2, "constants": 1, "shapes": 0, "inferred": 0}
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


# ---------------------------------------------------------------- folding to a fixpoint


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "pinned"])
def test_run_time_same_padding_folds_away(dynamic):
    """TF-style padding arithmetic before two strided convs: the second conv's Shape reads the
    first Pad's output, which is static only after the first pads were folded and shapes
    inferred again.  Everything folds; both convs (with their pads) land on the GPU."""
    m = tf_same_padding_model(dynamic=dynamic)
    result = optcli.optimize(model=m, valid_targets="opencl,arm", input_shapes="x:1,3,15,15" if dynamic else None,
                             disabled_passes={"keep_small_islands_on_host"})
    steps = [(s["op"], s["target"]) for s in result.report["steps"] if s["domain"] != "optcli"]
    assert steps == [("Conv", "opencl"), ("Conv", "opencl")]
    x = np.random.default_rng(1).standard_normal((1, 3, 15, 15)).astype(np.float32)
    assert_close(optcli.load(result.data).run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_dynamic_batch_padding_folds_from_the_fixed_dims():
    """Only the batch is dynamic: Gather(Shape(x), 2) is the fixed height, so the padding
    arithmetic still folds away and the pads go into the convs (no Shape, no Pad left)."""
    m = tf_same_padding_model(dynamic="batch")
    result = optcli.optimize(model=m, valid_targets="arm")
    assert [s["op"] for s in result.report["steps"] if s["domain"] != "optcli"] == ["Conv", "Conv"]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 15, 15)).astype(np.float32)
        assert_close(optcli.load(result.data).run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_partial_shapes_pick_only_fixed_dims():
    """Gather/Slice over a Shape with a symbolic batch: fixed dims fold, the batch does not."""
    m = model([node("Shape", ["x"], ["s"]), node("Gather", ["s", "i2"], ["h"], axis=0),
               node("Slice", ["s", "b", "e"], ["hw"]), node("Gather", ["s", "i0"], ["n"], axis=0),
               node("Cast", ["h"], ["hf"], to=1), node("Cast", ["hw"], ["hwf"], to=1),
               node("Cast", ["n"], ["nf"], to=1),
               node("Mul", ["x", "hf"], ["t"]), node("Mul", ["t", "nf"], ["t2"]), node("ReduceSum", ["hwf"], ["k"]),
               node("Add", ["t2", "k"], ["y"])],
              {"x": ["N", 3, 4, 5]},
              initializers={"i2": np.array(2, np.int64), "i0": np.array(0, np.int64),
                            "b": np.array([2], np.int64), "e": np.array([4], np.int64)})
    graph, counts = run_pass(m, fold_constants)
    assert float(graph.initializers["hf"]) == 4.0 and graph.initializers["k"].tolist() == [9.0]
    assert counts["shapes"] == 2 and "nf" not in graph.initializers
    assert ops(graph) == ["Shape", "Gather", "Cast", "Mul", "Mul", "Add"]


def test_folding_without_reinference_leaves_the_second_pad(monkeypatch):
    """The fixpoint is what folds the second block: without re-inference it stays."""
    monkeypatch.setattr(fold_constants, "reinfer_shapes", lambda graph: 0)
    result = optcli.optimize(model=tf_same_padding_model(), valid_targets="arm")
    assert "Shape" in [s["op"] for s in result.report["steps"]]


def test_symbolic_input_keeps_the_arithmetic():
    """Unpinned dims: nothing is constant, and nothing is folded wrongly."""
    m = tf_same_padding_model(dynamic=True)
    result = optcli.optimize(model=m, valid_targets="arm")
    assert "Shape" in [s["op"] for s in result.report["steps"]]
    x = np.random.default_rng(2).standard_normal((1, 3, 17, 13)).astype(np.float32)
    assert_close(optcli.load(result.data).run({"x": x})["y"], run_ort(m, {"x": x})[0])


# ---------------------------------------------------------------- folding never fails silently


def _crashing_kernel(monkeypatch, op_type: str, exc: Exception) -> None:
    """Make evaluating ``op_type`` raise ``exc`` (the way a buggy kernel would)."""
    real = evaluate.evaluate_node

    def evaluate_node(node, inputs, opsets):
        if node.op_type == op_type:
            raise exc
        return real(node, inputs, opsets)

    monkeypatch.setattr(evaluate, "evaluate_node", evaluate_node)


@pytest.mark.parametrize("exc, kind", [(ZeroDivisionError("oops"), "bug"),
                                       (NotImplementedError("not this form"), "unsupported")])
def test_a_kernel_raising_while_folding_is_reported(monkeypatch, exc, kind):
    m = model([node("Neg", ["a"], ["n"]), node("Add", ["x", "n"], ["y"])], {"x": [3]},
              initializers={"a": np.ones(3, np.float32)})
    _crashing_kernel(monkeypatch, "Neg", exc)
    graph = to_graph(m)
    ctx = PassContext()
    fold_constants.run(graph, ctx)
    assert ops(graph) == ["Neg", "Add"]
    [failure] = ctx.results.fold_failures
    assert failure["node"] == graph.nodes[0].name and failure["op"] == "Neg" and failure["kind"] == kind
    assert any("could not fold node" in w and "Neg" in w for w in ctx.warnings)


def test_fold_failures_reach_the_report(monkeypatch):
    m = model([node("Neg", ["a"], ["n"]), node("Add", ["x", "n"], ["y"])], {"x": [3]},
              initializers={"a": np.ones(3, np.float32)})
    _crashing_kernel(monkeypatch, "Neg", ValueError("broken kernel"))
    report = optcli.optimize(model=m, valid_targets="arm").report
    assert [f["op"] for f in report["fold_failures"]] == ["Neg"]
    assert report["fold_failures"][0]["kind"] == "bug"
