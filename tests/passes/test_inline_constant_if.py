"""inline_constant_if: an If whose condition folds to a constant becomes the nodes of its branch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.tables import model_ops_table
from tests.helpers import assert_close, run_ort

RNG = np.random.default_rng(11)


def _branch(name: str, op: str, out: str, inner: str = "t") -> onnx.GraphProto:
    """A branch: ``out = Tanh(op(x, its own constant))``, its intermediate value named ``inner``."""
    k = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), f"{name}_k")
    return helper.make_graph([helper.make_node(op, ["x", f"{name}_k"], [inner]),
                              helper.make_node("Tanh", [inner], [out])],
                             name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], [k])


def _model(then_inner: str = "t1", extra: list | None = None) -> onnx.ModelProto:
    """If on Shape(x)[0] == 3: constant once --input_shapes pins x, dynamic otherwise."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["rows"], axis=0),
             helper.make_node("Equal", ["rows", "three"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Add", "ty", then_inner),
                              else_branch=_branch("else", "Mul", "ey", "t2")),
             *(extra or [])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra:
        outputs.append(helper.make_tensor_value_info(extra[-1].output[0], TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])], outputs,
                              [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                               numpy_helper.from_array(np.array(3, np.int64), "three")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops(result) -> list[str]:
    return [s["op"] for s in result.report["steps"]]


@pytest.mark.parametrize("rows", [3, 5])
def test_pinned_condition_inlines_the_branch_it_takes(rows):
    model = _model()
    result = optcli.optimize(model=model, valid_targets="arm", input_shapes=f"x:{rows},4")
    assert "If" not in _ops(result), model_ops_table(result.report)
    assert ("Add" if rows == 3 else "Mul") in _ops(result)
    x = RNG.standard_normal((rows, 4)).astype(np.float32)
    assert_close(optcli.load(result.data).run({"x": x})["y"], run_ort(model, {"x": x})[0], what=f"rows {rows}")


def test_dynamic_condition_keeps_the_if():
    result = optcli.optimize(model=_model(), valid_targets="arm")
    assert "If" in _ops(result)


def test_a_branch_name_taken_in_the_graph_is_renamed():
    """ONNX's checker keeps branch names apart from the graph's, but names a pass made may meet a
    branch's: here the main graph's 'shp' is renamed to the branch's intermediate 't1' by hand.  The
    branch's value is renamed, and both keep their meaning."""
    from optcli.passes import fold_constants, inline_constant_if
    from optcli.passes.base import PassContext
    from tests.passes.ir_build import run_ir, to_graph

    model = _model(extra=[helper.make_node("Cast", ["shp"], ["shp_f"], to=TensorProto.FLOAT)])
    graph = to_graph(model)
    for n in graph.nodes:
        n.inputs = ["t1" if i == "shp" else i for i in n.inputs]
        n.outputs = ["t1" if o == "shp" else o for o in n.outputs]
    graph.inputs[0].shape = (3, 4)
    graph.values["x"].shape = (3, 4)
    fold_constants.run(graph, PassContext())
    assert inline_constant_if.run(graph, PassContext())["inlined"] == 1
    assert "If" not in [n.op_type for n in graph.nodes]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    got = run_ir(graph, {"x": x})
    expected = run_ort(model, {"x": x})
    assert_close(got[0], expected[0], what="y")
    assert_close(got[1], expected[1], what="the main graph's value")
