"""The bodies of If, Loop and Scan run optcli's kernels, onnx.reference only the ops without one.

Each model is optimized for `arm`, run, and compared with onnxruntime; a counting wrapper around
the kernel a body should use proves the body ran it (a result that merely matches could come
from onnx.reference's own implementation).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.ops import recurrent
from tests.helpers import assert_close, run_ort

RNG = np.random.default_rng(7)


def _lstm_branch(name: str, hidden: int, size: int) -> onnx.GraphProto:
    """A branch graph: an LSTM over the outer value 'x' [seq, 1, size], its Y_h as the output."""
    w = numpy_helper.from_array((RNG.standard_normal((1, 4 * hidden, size)) * 0.3).astype(np.float32), f"{name}_w")
    r = numpy_helper.from_array((RNG.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), f"{name}_r")
    lstm = helper.make_node("LSTM", ["x", f"{name}_w", f"{name}_r"], ["", f"{name}_h"], hidden_size=hidden)
    out = helper.make_tensor_value_info(f"{name}_h", TensorProto.FLOAT, None)
    return helper.make_graph([lstm], name, [], [out], [w, r])


def _if_model() -> onnx.ModelProto:
    """A voice detector's shape: the whole net inside an If on the sample rate."""
    cond = helper.make_node("Equal", ["sr", "sr16k"], ["is16k"])
    node = helper.make_node("If", ["is16k"], ["h"], then_branch=_lstm_branch("then", 16, 8),
                            else_branch=_lstm_branch("else", 16, 8))
    graph = helper.make_graph(
        [cond, node], "vad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 1, 8]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(16000, np.int64), "sr16k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _loop_model(steps: int = 20, classes: int = 6) -> onnx.ModelProto:
    """A decoder's shape (paddle2onnx's table decoder): a Loop whose body takes the ArgMax of the
    carried scores, one-hot encodes it with a *rank-1* depth (legal ONNX, which onnx.reference's
    OneHot refuses under numpy 2) and mixes it back in."""
    body = helper.make_graph(
        [helper.make_node("ArgMax", ["s_in"], ["idx"], axis=1, keepdims=0),
         helper.make_node("OneHot", ["idx", "depth", "onoff"], ["hot"], axis=-1),
         helper.make_node("MatMul", ["hot", "mix"], ["proj"]),
         helper.make_node("Add", ["proj", "s_in"], ["summed"]),
         helper.make_node("Tanh", ["summed"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["s_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [1, classes])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, classes]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, classes])],
        [numpy_helper.from_array(np.array([classes], np.int64), "depth"),
         numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "onoff"),
         numpy_helper.from_array((RNG.standard_normal((classes, classes)) * 0.5).astype(np.float32), "mix")])
    loop = helper.make_node("Loop", ["trips", "keep", "s0"], ["s_final", "all"], body=body)
    graph = helper.make_graph(
        [loop], "decoder", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1, classes])],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("all", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(steps, np.int64), "trips"),
         numpy_helper.from_array(np.array(True), "keep")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _counting(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    outs = predictor.run(feeds)
    return [outs[o.name] for o in model.graph.output]


@pytest.mark.parametrize("sr", [16000, 8000])
def test_lstm_inside_if_runs_optcli_kernel(monkeypatch, sr):
    calls = _counting(monkeypatch, recurrent, "run_recurrent")
    model = _if_model()
    feeds = {"x": RNG.standard_normal((12, 1, 8)).astype(np.float32), "sr": np.array(sr, np.int64)}
    got = _run(model, feeds)
    assert_close(got[0], run_ort(model, feeds)[0], what=f"If branch sr={sr}")
    assert calls == ["run_recurrent"], "the branch's LSTM did not run optcli's kernel"


def _conv_if_model() -> onnx.ModelProto:
    """An If whose branches convolve the outer [1, 8, 17] 'x' (Conv1d, weights in the main graph as
    torch writes them): a pointwise conv in one branch, a depthwise and a dense one in the other."""
    inits = [numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)
             for name, shape in (("w1x1", (4, 8, 1)), ("wdw", (8, 1, 3)), ("wd", (4, 8, 3)), ("b4", (4,)))]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("Conv", ["x", "w1x1", "b4"], ["y"], kernel_shape=[1])], "then", [],
                             [out])
    other = helper.make_graph([helper.make_node("Conv", ["x", "wdw"], ["t"], kernel_shape=[3], pads=[1, 1], group=8),
                               helper.make_node("Conv", ["t", "wd", "b4"], ["y"], kernel_shape=[3], strides=[2])],
                              "else", [], [out])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 17]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("branch", [True, False])
def test_body_convs_take_the_variant_their_shapes_fit(monkeypatch, branch):
    """A body's Conv meets its weight only at run time, so it chooses the pointwise or depthwise
    variant there (``conv.conv_by_shape``) instead of always im2col: a voice detector's 1x1 Conv1d
    in its If took 56 us through im2col, 12 us as a 1x1."""
    from optcli.ops import conv

    pointwise = _counting(monkeypatch, conv, "conv_1x1")
    depthwise = _counting(monkeypatch, conv, "conv_depthwise")
    model = _conv_if_model()
    feeds = {"x": RNG.standard_normal((1, 8, 17)).astype(np.float32), "c": np.array(branch)}
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    for _ in range(2):  # the second run takes the steps' prepared calls
        assert_close(predictor.run(feeds)["y"], run_ort(model, feeds)[0], what=f"If branch {branch}")
    assert (len(pointwise), len(depthwise)) == ((2, 0) if branch else (0, 2))


def test_loop_body_with_rank1_onehot_depth_runs_optcli_kernels(monkeypatch):
    from onnx.reference.ops import op_one_hot, op_tanh

    def refused(self, *args, **kwargs):
        raise AssertionError("onnx.reference ran a body node that has an optcli kernel")

    monkeypatch.setattr(op_one_hot.OneHot, "_run", refused)
    monkeypatch.setattr(op_tanh.Tanh, "_run", refused)
    model = _loop_model(steps=20)
    feeds = {"s0": RNG.standard_normal((1, 6)).astype(np.float32)}
    got = _run(model, feeds)
    expected = run_ort(model, feeds)
    for g, e, name in zip(got, expected, ("s_final", "all")):
        assert_close(g, e, what=name)


def test_print_model_ops_names_who_runs_each_body_op():
    """`opt --print_model_ops` lists the ops inside bodies and who runs each: optcli's kernel, or
    onnx.reference for an op optcli has no kernel for (Hardmax here)."""
    from optcli.tables import model_ops_table

    model = _loop_model(steps=3)
    body = model.graph.node[0].attribute[0].g
    body.node.insert(0, helper.make_node("Hardmax", ["s_in"], ["hard"]))
    scan = next(n for n in body.node if list(n.output) == ["scan"])
    body.node.remove(scan)  # the scan output reads the Hardmax, so compile_bodies keeps it
    body.node.extend([helper.make_node("Add", ["hard", "s_out"], ["mixed"]),
                      helper.make_node("Identity", ["mixed"], ["scan"])])
    report = optcli.optimize(model=model, valid_targets="arm").report
    table = model_ops_table(report)
    rows = {line.split("(in")[0].strip(): line for line in table.splitlines() if "(in Loop body)" in line}
    # compile_bodies made the body's MatMul a FullyConnected and gave its Add the Tanh as epilogue
    assert "optcli kernel" in rows["OneHot"] and "optcli kernel" in rows["FullyConnected"], table
    assert "optcli kernel" in rows["Add"] and "Tanh" not in rows, table
    assert "onnx reference" in rows["Hardmax"] and "fallback" in rows["Hardmax"], table
    loop_row = next(line for line in table.splitlines() if line.startswith("Loop "))
    assert "optcli executor" in loop_row and "fallback" not in loop_row, table
    assert report["steps"][0]["fallback"] is False


def _scan_model(in_axis: int, in_dir: int, out_axis: int, out_dir: int) -> onnx.ModelProto:
    """A running sum over a scan input sliced along ``in_axis`` (forward or reversed), each step's
    state written out along ``out_axis``: the axes and directions onnx.reference refused."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Tanh", ["acc_out"], ["out"])],
        "body",
        [helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("out", TensorProto.FLOAT, [3])])
    scan = helper.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    xs_shape = [5, 3] if in_axis == 0 else [3, 5]
    graph = helper.make_graph(
        [scan], "scan", [helper.make_tensor_value_info("init", TensorProto.FLOAT, [3]),
                         helper.make_tensor_value_info("xs", TensorProto.FLOAT, xs_shape)],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (1, 1, 1, 0)])
def test_scan_axes_and_directions(in_axis, in_dir, out_axis, out_dir):
    model = _scan_model(in_axis, in_dir, out_axis, out_dir)
    feeds = {"init": RNG.standard_normal(3).astype(np.float32),
             "xs": RNG.standard_normal((5, 3) if in_axis == 0 else (3, 5)).astype(np.float32)}
    for g, e, name in zip(_run(model, feeds), run_ort(model, feeds), ("final", "ys")):
        assert_close(g, e, what=f"{name} axes {in_axis}/{out_axis} directions {in_dir}/{out_dir}")


def _loop_body_inputs(width: int) -> list:
    """A Loop body's inputs: the iteration number, the condition and one carried [width] value."""
    return [helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [width])]


def test_if_inside_loop_reads_outer_values_and_zero_iterations():
    """A nested If in a Loop body reads a value of the body and one of the main graph; a trip count
    of 0 returns the initial carried value and an empty scan output."""
    then_g = helper.make_graph([helper.make_node("Add", ["s_in", "bias"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["s_in", "bias"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["odd"]),
         helper.make_node("Cast", ["odd"], ["is_odd"], to=TensorProto.BOOL),
         helper.make_node("If", ["is_odd"], ["s_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["s_out"], ["scan"])],
        "body",
        _loop_body_inputs(2),
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(2, np.int64), "two")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "s0"], ["s_final", "all"], body=body)], "nested",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("all", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    for trips in (5, 0):
        feeds = {"trips": np.array(trips, np.int64), "s0": RNG.standard_normal(2).astype(np.float32),
                 "bias": RNG.standard_normal(2).astype(np.float32)}
        got = predictor.run(feeds)
        expected = run_ort(model, feeds)
        assert_close(got["s_final"], expected[0], what=f"s_final, {trips} trips")
        assert got["all"].shape[0] == expected[1].shape[0] == trips
        if trips:
            assert_close(got["all"], expected[1], what="all")


def test_scan8_rows_of_different_lengths():
    """Scan opset 8: a batch axis and sequence_lens (onnx.reference cannot run Scan-8 at all): rows
    stop at their length, outputs past it are zeros; a length of 0 is refused, as onnxruntime does."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "row"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["out"])],
        "body", [helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2]),
                 helper.make_tensor_value_info("row", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    scan = helper.make_node("Scan", ["lens", "init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [scan], "scan8", [helper.make_tensor_value_info("lens", TensorProto.INT64, [3]),
                          helper.make_tensor_value_info("init", TensorProto.FLOAT, [3, 2]),
                          helper.make_tensor_value_info("xs", TensorProto.FLOAT, [3, 4, 2])],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 3
    feeds = {"lens": np.array([4, 1, 2], np.int64), "init": RNG.standard_normal((3, 2)).astype(np.float32),
             "xs": RNG.standard_normal((3, 4, 2)).astype(np.float32)}
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    got = predictor.run(feeds)
    expected = run_ort(model, feeds)
    assert_close(got["final"], expected[0], what="final")
    assert_close(got["ys"], expected[1], what="ys")
    with pytest.raises(optcli.OptError, match="lengths 1..4"):
        predictor.run({**feeds, "lens": np.array([4, 0, 2], np.int64)})


def test_loop_body_outputs_read_from_everywhere():
    """A body's values sit in slots laid out once (control_flow.Body): its outputs may be one of
    its own inputs, one of its constants or a step's result, a step reads the iteration number and
    a value of the main graph, and every output keeps its place among the scan outputs (the
    checker refuses a main-graph value as a body output)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["s_in", "i_f"], ["scaled"]),
         helper.make_node("Add", ["scaled", "outer_bias"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        _loop_body_inputs(2),
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),         # its own input
         helper.make_tensor_value_info("body_const", TensorProto.FLOAT, [2]),   # its constant
         helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [2])],      # a step's
        [numpy_helper.from_array(np.array([3.0, -1.0], np.float32), "body_const")])
    outs = ["s_final", "inputs_seen", "const_seen", "scaled_seen"]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "s0"], outs, body=body)], "slots",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("outer_bias", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"trips": np.array(4, np.int64), "s0": RNG.standard_normal(2).astype(np.float32),
             "outer_bias": RNG.standard_normal(2).astype(np.float32)}
    got = optcli.load(optcli.optimize(model=model, valid_targets="arm").data).run(feeds)
    for name, expected in zip(outs, run_ort(model, feeds)):
        assert got[name].shape == expected.shape, name
        assert_close(got[name], expected, what=name)


def test_straight_line_program_stores_what_each_step_gives():
    """A body's steps run as one generated function (control_flow._straight_line): arguments read
    from their slots (None for an absent input), a nested op's environment built when it runs, an
    unnamed output skipped, and a step giving fewer results than its outputs leaves the rest
    unset, as the loop over the steps did."""
    from optcli.ops import control_flow as cf

    seen = []

    def split3(args, attrs):
        seen.append(("split", args, attrs))
        return [args[0] + 1, args[0] + 2, args[0] + 3]

    def short(args, attrs):
        return [args[0] * 10]  # two outputs declared, one given

    def nested(args, env):
        seen.append(("env", dict(env)))
        return [env["outer_value"] + args[0]]

    attrs = {"k": 1}
    program = ((split3, attrs, (0, None), (1, None, 2)),
               (short, attrs, (2,), (3, 4)),
               (nested, cf._ENV, (3,), (5,)))
    run = cf._straight_line(program)
    vals = [1, None, None, None, "untouched", None]
    assert run(vals, {"outer_value": 100}, lambda vals, outer: {**outer, "v3": vals[3]}) is None
    assert vals == [1, 2, 4, 40, "untouched", 140]
    assert seen[0] == ("split", [1, None], attrs)
    assert seen[1] == ("env", {"outer_value": 100, "v3": 40})
    assert cf._straight_line(())([], {}, None) is None  # a body of constants only


def test_body_constants_are_read_only_and_outputs_still_the_callers():
    """A body's constants are read-only, as a plan's weights are (the kernels' memos recognise a
    read-only argument by identity); a constant carried out of the Loop still reaches the caller as
    an array of its own."""
    from optcli.ops import control_flow as cf

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Unsqueeze", ["s_in", "axes"], ["u"]),
         helper.make_node("Squeeze", ["u", "axes"], ["scan"])],
        "body", _loop_body_inputs(2),
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes"),
         numpy_helper.from_array(np.array([4.0, 5.0], np.float32), "k")])
    compiled = cf.Body(body, {"": 17})
    assert all(not v.flags.writeable for v in compiled.consts.values())
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "s0"], ["s_final", "all"], body=body)], "consts",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("all", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"trips": np.array(3, np.int64), "s0": np.array([1.0, 2.0], np.float32)}
    got = optcli.load(optcli.optimize(model=model, valid_targets="arm").data).run(feeds)
    for name, expected in zip(["s_final", "all"], run_ort(model, feeds)):
        assert_close(got[name], expected, what=name)
    got["s_final"][0] = 0.0  # the caller's own array
