"""compile_bodies: If/Loop/Scan bodies go through the cleanup and fusion passes, keep their
semantics (loop-carried values, scan outputs, outer reads, zero trips), and the loader checks the
compiled bodies of a file like any other step."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli
from optcli.errors import NbFormatError
from optcli.nb.layout import HEADER
from optcli.tolerance import describe_mismatch, within
from tests.reliability.nbfuzz import parts, rebuild

RNG = np.random.default_rng(7)
H = 8


def _w(*shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3)


def _gru_like_loop(trips: int) -> onnx.ModelProto:
    """A decoder's cell: h = sigmoid(h @ W + b) * tanh(h @ U + c), carried, each step's h also a
    scan output; the weights are the outer graph's (read by name from the body)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"], name="mm"),
         helper.make_node("Add", ["hw", "b"], ["hwb"]),
         helper.make_node("Sigmoid", ["hwb"], ["gate"]),
         helper.make_node("MatMul", ["h_in", "U"], ["hu"]),
         helper.make_node("Add", ["hu", "c"], ["huc"]),
         helper.make_node("Tanh", ["huc"], ["cand"]),
         helper.make_node("Mul", ["gate", "cand"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["h_out"], ["h_scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, H])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, H]),
         helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, [1, H])])
    w, u = _w(H, H), _w(H, H)
    w.name, u.name = "W", "U"
    b, c = _w(H), _w(1, H)
    b.name, c.name = "b", "c"
    # An outer value named like the bias the fusion makes up for node "mm": the body must not shadow it.
    graph = helper.make_graph(
        [helper.make_node("Identity", ["h0"], ["mm_bias"]),
         helper.make_node("Loop", ["trips", "", "mm_bias"], ["h_final", "hs"], body=body)],
        "decoder", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, H])],
        [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("hs", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), w, u, b, c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compiled_body(data: bytes) -> onnx.GraphProto:
    from optcli.nb.reader import load_bytes

    plan, _ = load_bytes(data)
    loop = next(s for s in plan.steps if s.op_type in ("Loop", "If", "Scan"))
    node = onnx.NodeProto()
    node.ParseFromString(loop.proto)
    return node.attribute[0].g


def _check_against_ort(model: onnx.ModelProto, feeds: dict, data: bytes) -> None:
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = list(optcli.load(data).run(feeds).values())
    for g, e in zip(got, expected):
        assert g.shape == e.shape and within(g, e), describe_mismatch(g, e)


@pytest.mark.parametrize("trips", [0, 1, 6])
def test_a_loop_body_is_fused_and_runs_as_onnxruntime(trips):
    model = _gru_like_loop(trips)
    data = optcli.optimize(model=model, valid_targets="arm").data
    body = _compiled_body(data)
    ops = [(n.domain, n.op_type) for n in body.node]
    # MatMul+Add -> FullyConnected, its Sigmoid and the other Add's Tanh as epilogues, Identities gone
    assert ops.count(("optcli", "FullyConnected")) == 2 and ("", "Sigmoid") not in ops and ("", "Tanh") not in ops
    assert len(body.node) < 9
    assert HEADER.unpack_from(data)[1] == 2  # compiled bodies: format version 2
    feeds = {"h0": RNG.standard_normal((1, H)).astype(np.float32)}
    _check_against_ort(model, feeds, data)


def test_disabled_compile_bodies_leaves_the_body_and_writes_format_1():
    data = optcli.optimize(model=_gru_like_loop(3), valid_targets="arm", disabled_passes=("compile_bodies",)).data
    assert [n.op_type for n in _compiled_body(data).node].count("MatMul") == 2
    assert HEADER.unpack_from(data)[1] == 1


def _growing_loop() -> onnx.ModelProto:
    """A carried sequence that grows by one column per iteration, its body reading its own Shape;
    the exporter declares the carried input [1, 1] (true on the first iteration only)."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    body = helper.make_graph(
        [helper.make_node("Concat", ["seq_in", "col"], ["seq_out"], axis=1),
         helper.make_node("Shape", ["seq_in"], ["shp"]),
         helper.make_node("Gather", ["shp", "one"], ["width"], axis=0),
         helper.make_node("Cast", ["width"], ["widthf"], to=TensorProto.FLOAT),
         helper.make_node("Reshape", ["seq_in", "flat"], ["same"]),  # a "no-op" only while seq is [1, 1]
         helper.make_node("ReduceSum", ["same"], ["total"], keepdims=0),
         helper.make_node("Add", ["widthf", "total"], ["mark"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("seq_in", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("seq_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mark", TensorProto.FLOAT, [1])],
        [one, numpy_helper.from_array(np.ones((1, 1), np.float32), "col"),
         numpy_helper.from_array(np.array([1, -1], np.int64), "flat")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "s0"], ["s_final", "marks"], body=body)],
        "grow", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("marks", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(4, np.int64), "trips")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_carried_value_that_changes_shape_is_not_folded_from_its_first_iteration():
    """Shapes inside a body hold for every iteration only where they are facts: Shape(seq_in) must
    not fold to the declared [1, 1] (it is [1, 1], [1, 2], ... as the sequence grows)."""
    data = optcli.optimize(model=_growing_loop(), valid_targets="arm").data
    got = optcli.load(data).run({"s0": np.full((1, 1), 2.0, np.float32)})
    # iteration k: seq is [1, k + 1], its sum 2 + k, its width k + 1
    np.testing.assert_allclose(got["marks"].reshape(-1), [3.0, 5.0, 7.0, 9.0])
    assert got["s_final"].shape == (1, 5)


def _if_with_nested_loop() -> onnx.ModelProto:
    inner = _gru_like_loop(3).graph.node[1]
    then = helper.make_graph([inner], "then", [], [helper.make_tensor_value_info("hs", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["mm_bias"], ["other"])], "else", [],
                              [helper.make_tensor_value_info("other", TensorProto.FLOAT, None)])
    loop_graph = _gru_like_loop(3).graph
    graph = helper.make_graph(
        [helper.make_node("Identity", ["h0"], ["mm_bias"]),
         helper.make_node("Greater", ["flag", "zero"], ["go"]),
         helper.make_node("If", ["go"], ["y"], then_branch=then, else_branch=other)],
        "if_loop", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, H]),
                    helper.make_tensor_value_info("flag", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [*loop_graph.initializer, numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    # the inner Loop's h_final is unused: an If branch's one output is its scan output
    del then.node[0].output[:]
    then.node[0].output.extend(["", "hs"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("flag", [1.0, -1.0])
def test_bodies_nested_in_bodies_are_compiled_too(flag):
    model = _if_with_nested_loop()
    data = optcli.optimize(model=model, valid_targets="arm").data
    then = next(a.g for a in _if_node(data).attribute if a.name == "then_branch")
    loop_body = then.node[0].attribute[0].g
    assert [n.op_type for n in loop_body.node].count("FullyConnected") == 2
    feeds = {"h0": RNG.standard_normal((1, H)).astype(np.float32), "flag": np.array(flag, np.float32)}
    _check_against_ort(model, feeds, data)


def _if_node(data: bytes) -> onnx.NodeProto:
    from optcli.nb.reader import load_bytes

    plan, _ = load_bytes(data)
    node = onnx.NodeProto()
    node.ParseFromString(next(s for s in plan.steps if s.op_type == "If").proto)
    return node


# ------------------------------------------------------------------ a file's bodies are untrusted

def _tampered(edit) -> bytes:
    """The compiled decoder's file with ``edit(body GraphProto)`` applied to its Loop's body."""
    data = optcli.optimize(model=_gru_like_loop(3), valid_targets="arm").data
    body, blob = parts(data)
    step = next(s for s in body["steps"] if s["op"] == "Loop")
    node = onnx.NodeProto()
    node.ParseFromString(step["proto"])
    edit(node.attribute[0].g)
    step["proto"] = node.SerializeToString()
    return rebuild(body, blob, version=2)


def _fc(g: onnx.GraphProto) -> onnx.NodeProto:
    return next(n for n in g.node if n.op_type == "FullyConnected")


def _set_activation(name: str):
    def edit(g):
        fc = _fc(g)
        for a in fc.attribute:
            if a.name == "activation":
                a.s = name.encode()
                return
        fc.attribute.append(helper.make_attribute("activation", name))
    return edit


def _become(op: str, domain: str = "optcli"):
    def edit(g):
        fc = _fc(g)
        fc.op_type, fc.domain = op, domain
    return edit


def _extra_input(g):
    _fc(g).input.extend(["W", "W", "W"])


@pytest.mark.parametrize("edit, message", [
    (_set_activation("bogus"), "activation"),
    (_become("QConv"), "cannot be in a body"),
    (_become("NoSuchOp"), "cannot be in a body"),
    (_become("FullyConnected", "optcli.checked"), "domain no op is in"),
    (_extra_input, "inputs"),
])
def test_a_crafted_compiled_body_is_refused_at_load(edit, message):
    with pytest.raises(NbFormatError) as info:
        optcli.load(_tampered(edit))
    assert message in str(info.value) and "body" in str(info.value)


def test_an_untouched_compiled_body_loads():
    optcli.load(_tampered(lambda g: None))
