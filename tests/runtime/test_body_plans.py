"""What a compiled If/Loop body keeps between calls (ops/control_flow.py) gives the right answers.

A body's shape-only steps remember their output shape per input shape; a ScatterND that owns a
Loop-carried value writes into it; a plan's If/Loop step looks its compiled node up once.  Each
test checks the answers against onnxruntime on a case where the kept state could go wrong: a
carried value whose shape changes every iteration and between runs, a caller's array and a
second reader of the carried value, repeated runs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.ops import control_flow as cf
from tests.helpers import assert_close, run_ort

RNG = np.random.default_rng(11)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _compiled_loop(predictor) -> cf.ControlFlow:
    """The ControlFlow the predictor's Loop (or If) step runs (the node's compiled form, cached)."""
    plan = predictor._executor.plan
    step = next(s for s in plan.steps if s.op_type in ("Loop", "If"))
    return cf._control_flow(step.proto, tuple(sorted(plan.opsets.items())))


def _growing_loop() -> onnx.ModelProto:
    """A carried [1, n] value that gains a column every iteration (Concat of its own sum), passed
    through Unsqueeze, Reshape, Flatten and Squeeze with constant axes and shapes on the way."""
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["acc_in", "axis0"], ["u"]),           # [1, 1, n]
         helper.make_node("Reshape", ["u", "flat"], ["r"]),                   # [n]
         helper.make_node("Flatten", ["u"], ["f"], axis=2),                   # [1, n]
         helper.make_node("Squeeze", ["u", "axis0"], ["sq"]),                 # [1, n]
         helper.make_node("ReduceSum", ["r"], ["total"], keepdims=1),         # [1]
         helper.make_node("Reshape", ["total", "one_by_one"], ["col"]),       # [1, 1]
         helper.make_node("Mul", ["f", "half"], ["halved"]),
         helper.make_node("Add", ["sq", "halved"], ["mixed"]),
         helper.make_node("Concat", ["mixed", "col"], ["acc_out"], axis=1),  # [1, n + 1]
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "grow",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, None])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, None]),
         helper.make_tensor_value_info("col", TensorProto.FLOAT, [1, 1])],
        [_const("axis0", np.array([0], np.int64)), _const("flat", np.array([-1], np.int64)),
         _const("one_by_one", np.array([1, 1], np.int64)), _const("half", np.float32(0.5))])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "acc0"], ["acc_final", "cols"], body=body)], "growing",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("acc0", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("acc_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("cols", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_only_steps_follow_a_carried_value_whose_shape_changes():
    """Each iteration the carried value is one column wider, and the second run starts from another
    width: every shape-only step's remembered output shape is the one of its input's shape (a step
    that reused another shape's would fail to reshape or give a wrong shape)."""
    model = _growing_loop()
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    for width, trips in ((3, 5), (6, 4), (3, 5)):
        feeds = {"trips": np.array(trips, np.int64), "acc0": RNG.standard_normal((1, width)).astype(np.float32)}
        got = predictor.run(feeds)
        expected = run_ort(model, feeds)
        assert got["acc_final"].shape == expected[0].shape == (1, width + trips)
        assert_close(got["acc_final"], expected[0], what=f"acc_final from width {width}")
        assert_close(got["cols"], expected[1], what=f"cols from width {width}")
    body = _compiled_loop(predictor).bodies["body"]
    cached = [fn for fn, _, _, _ in body._program if type(fn) is cf.ShapeCached]
    assert len(cached) >= 3, "the body's constant-axes Unsqueeze/Reshape/Squeeze were not planned as shape-only"
    widths = {w + k for w, trips in ((3, 5), (6, 4)) for k in range(trips)}  # 3..9
    seen = max(len(fn.shapes) for fn in cached)
    assert seen == len(widths), f"a shape-only step remembered {seen} input shapes, expected one per width seen"


def _scatter_loop(second_reader: bool) -> onnx.ModelProto:
    """A decoder's output buffer: the carried [1, N, K] 'probs' gets row i of each iteration's
    scores by ScatterND (paddle2onnx's ``preds[:, i, :] = step``).  With ``second_reader`` another
    step reads the carried value after the ScatterND (its row sums before the write, a scan output)."""
    nodes = [
        helper.make_node("Reshape", ["i", "one"], ["i1"]),
        helper.make_node("Concat", ["zero", "i1"], ["where1"], axis=0),
        helper.make_node("Unsqueeze", ["where1", "zero"], ["where"]),             # [[0, i]]
        helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["row", "fi"], ["scaled"]),
        helper.make_node("Add", ["scaled", "row"], ["update"]),                 # [1, K]
        helper.make_node("ScatterND", ["probs_in", "where", "update"], ["probs_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
               helper.make_tensor_value_info("probs_out", TensorProto.FLOAT, [1, 4, 3])]
    if second_reader:
        nodes.append(helper.make_node("ReduceSum", ["probs_in"], ["before"], keepdims=0))
        outputs.append(helper.make_tensor_value_info("before", TensorProto.FLOAT, []))
    body = helper.make_graph(
        nodes, "scatter",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("probs_in", TensorProto.FLOAT, [1, 4, 3])],
        outputs,
        [_const("one", np.array([1], np.int64)), _const("zero", np.array([0], np.int64)),
         _const("row", RNG.standard_normal((1, 3)).astype(np.float32))])
    outs = ["probs"] + (["sums"] if second_reader else [])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "probs0"], outs, body=body)], "decoder_buffer",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("probs0", TensorProto.FLOAT, [1, 4, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_scatter_fills_its_own_copy_of_the_carried_buffer():
    """The ScatterND that alone reads and replaces a carried value writes into it (the Loop copies
    the caller's first value once): the caller's array is left as it was, the answer is
    onnxruntime's for several trip counts and repeated runs, zero iterations included."""
    model = _scatter_loop(second_reader=False)
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    for trips in (4, 2, 0, 4):
        probs0 = RNG.standard_normal((1, 4, 3)).astype(np.float32)
        kept = probs0.copy()
        feeds = {"trips": np.array(trips, np.int64), "probs0": probs0}
        got = predictor.run(feeds)["probs"]
        np.testing.assert_array_equal(probs0, kept, err_msg=f"the Loop wrote into the caller's array ({trips} trips)")
        assert got is not probs0
        assert_close(got, run_ort(model, feeds)[0], what=f"probs after {trips} trips")
    assert _compiled_loop(predictor).owned_carried == (0,), "the decoder's buffer was not filled in place"


def test_loop_scatter_copies_where_another_step_reads_the_carried_value():
    """A second reader of the carried value (after the ScatterND in the body's order) must see the
    value before the write: that ScatterND keeps copying."""
    model = _scatter_loop(second_reader=True)
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    feeds = {"trips": np.array(4, np.int64), "probs0": RNG.standard_normal((1, 4, 3)).astype(np.float32)}
    got = predictor.run(feeds)
    for name, expected in zip(["probs", "sums"], run_ort(model, feeds)):
        assert_close(got[name], expected, what=name)
    assert _compiled_loop(predictor).owned_carried == ()


def test_if_step_looks_up_its_compiled_node_once(monkeypatch):
    """A plan's If step finds its compiled node on its first run and keeps it (a voice detector's
    whole net is one If, run every 30 ms); each run still takes the branch its condition picks."""
    calls = []
    real = cf._control_flow
    monkeypatch.setattr(cf, "_control_flow", lambda *a: calls.append(1) or real(*a))
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                               [_const("two", np.float32(2.0))])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Greater", ["sr", "limit"], ["fast"]),
         helper.make_node("If", ["fast"], ["y"], then_branch=then_g, else_branch=else_g)], "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("limit", np.array(8000, np.int64))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    for sr in (16000, 8000, 16000):
        got = predictor.run({"x": x, "sr": np.array(sr, np.int64)})["y"]
        np.testing.assert_array_equal(got, x * 2 if sr > 8000 else -x)
    assert len(calls) == 1, f"the If's compiled node was looked up {len(calls)} times in 3 runs"
