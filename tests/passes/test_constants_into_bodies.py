"""constants_into_bodies: the graph's constants a body reads become the body's, and fold there."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.ops.control_flow import _control_flow
from tests.helpers import assert_close, run_ort

RNG = np.random.default_rng(5)


def _model(shared: bool) -> onnx.ModelProto:
    """An If on a run-time flag whose branches reorder a main-graph weight (Slice + Concat, as
    torch's exporter writes an LSTM's gates) before a MatMul; ``shared``: the main graph reads the
    weight too."""
    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Slice", ["w", "s0", "s1"], [f"{name}_a"]),
             helper.make_node("Slice", ["w", "s1", "s2"], [f"{name}_b"]),
             helper.make_node("Concat", [f"{name}_b", f"{name}_a"] if name == "then" else [f"{name}_a", f"{name}_b"],
                              [f"{name}_w"], axis=0),
             helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"])],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])

    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=branch("then"), else_branch=branch("else"))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("ReduceSum", ["w"], ["wsum"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("wsum", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])], outputs,
        [numpy_helper.from_array(RNG.standard_normal((6, 4)).astype(np.float32), "w"),
         *(numpy_helper.from_array(np.array([v], np.int64), f"s{k}") for k, v in enumerate((0, 3, 6)))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _if_step(result):
    plan = optcli.load(result.data).plan
    return next(s for s in plan.steps if s.op_type == "If"), plan


def test_weights_move_into_the_bodies_and_fold_there():
    model = _model(shared=False)
    result = optcli.optimize(model=model, valid_targets="arm")
    step, plan = _if_step(result)
    assert "w" not in plan.weights and "w" not in step.inputs  # moved: the graph no longer holds it
    compiled = _control_flow(step.proto, tuple(sorted(plan.opsets.items())))
    for body in compiled.bodies.values():
        assert len(body.steps) == 1, "Slice/Concat were not folded"
    predictor = optcli.load(result.data)
    for flag in (True, False):
        feeds = {"flag": np.array(flag), "x": RNG.standard_normal((2, 6)).astype(np.float32)}
        assert_close(predictor.run(feeds)["y"], run_ort(model, feeds)[0], what=f"flag {flag}")


def test_a_weight_the_graph_also_reads_stays_there():
    model = _model(shared=True)
    result = optcli.optimize(model=model, valid_targets="arm")
    feeds = {"flag": np.array(True), "x": RNG.standard_normal((2, 6)).astype(np.float32)}
    got = optcli.load(result.data).run(feeds)
    expected = run_ort(model, feeds)
    assert_close(got["y"], expected[0], what="y")
    assert_close(got["wsum"], expected[1], what="wsum")
