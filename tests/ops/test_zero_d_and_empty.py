"""Every registered host kernel on 0-d inputs and on empty inputs (a dim of 0), against onnxruntime.

Generated from the kernel registry: each variant of each registered op runs every recipe of
``zero_d_empty_cases.CASES`` for its op, the way the `arm` runtime runs a step (the node goes
through the frontend's ONNX -> IR conversion, the kernel gets ``kernel_attrs``), with read-only
inputs.  The reference is onnxruntime on the same one-node model, or ``onnx.reference`` where
the case says why onnxruntime cannot be, or an equivalent ONNX subgraph for optcli's own ops.
Outputs must agree in dtype, shape and value.  Two end-to-end tests run 0-d and empty inputs
through ``optcli.optimize`` + ``optcli.load`` as well.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import optcli
from optcli.frontend.onnx_reader import to_ir
from optcli.ops.evaluate import kernel_attrs
from optcli.ops.registry import Kernel, all_kernels, registered_ops
from tests.helpers import assert_matches, run_ort
from tests.ops.zero_d_empty_cases import CASES, NO_EMPTY, NO_ZERO_D, NOT_APPLICABLE, Case, attribute_protos


def _model(nodes: list, feeds: dict[str, np.ndarray], initializers: dict[str, np.ndarray], outs: list[str],
           opset: int, domain: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    for o in graph.output:
        o.ClearField("type")  # onnxruntime rejects the UNDEFINED element type
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def _reference(case: Case, node: onnx.NodeProto, feeds: dict[str, np.ndarray], domain: str) -> list[np.ndarray]:
    outs = list(node.output)
    if case.equivalent is not None:
        nodes, consts = case.equivalent(list(node.input), outs)
        model = _model(nodes, feeds, consts, outs, max(case.opset, 13), "")
    else:
        model = _model([node], feeds, {}, outs, case.opset, domain)
    if case.onnx_reference:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "mean of empty slice"
            return [np.asarray(y) for y in ReferenceEvaluator(model).run(None, feeds)]
    return run_ort(model, feeds)


def _params():
    for kern in all_kernels():
        if kern.is_blocked:  # they read channel-blocked arrays: tests/passes/test_choose_host_layout.py
            continue
        for case in CASES.get((kern.domain, kern.op_type), []):
            yield pytest.param(kern, case, id=f"{kern.id}[{case.label}]")


@pytest.mark.parametrize("kern, case", list(_params()))
def test_kernel_matches_reference(kern: Kernel, case: Case):
    names = [f"x{i}" if v is not None else "" for i, v in enumerate(case.inputs)]
    feeds = {n: v for n, v in zip(names, case.inputs) if n}
    outs = [f"y{i}" for i in range(case.n_outputs)]
    node = helper.make_node(kern.op_type, names, outs, domain=kern.domain, **attribute_protos(case.attrs))
    expected = _reference(case, node, feeds, kern.domain)

    opsets = {"": case.opset, **({kern.domain: 1} if kern.domain else {})}
    ir_node = to_ir(_model([node], feeds, {}, outs, case.opset, kern.domain), opsets).nodes[0]
    args = [None if v is None else v.copy() for v in case.inputs]
    for a in args:
        if a is not None:
            a.setflags(write=False)  # kernels must never write into their inputs
    got = kern.fn(args, kernel_attrs(ir_node.attrs, len(ir_node.outputs), opsets))

    assert len(got) >= case.n_outputs, f"{kern.id}: {len(got)} outputs, expected {case.n_outputs}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_matches(np.asarray(g), e, f"{kern.id} [{case.label}] output {i}")
    # The case is what its label says: a rank-0 or an empty tensor on the way in or out.
    shapes = [np.shape(v) for v in case.inputs if v is not None] + [np.shape(e) for e in expected]
    if case.label.startswith("0-d"):
        assert any(len(s) == 0 for s in shapes), f"{case.label}: no 0-d input or output"
    else:
        assert any(0 in s for s in shapes), f"{case.label}: no empty input or output"


def test_every_registered_op_has_recipes_or_a_reason():
    registered = set(registered_ops())
    missing = sorted(registered - set(CASES) - set(NOT_APPLICABLE))
    assert not missing, f"registered ops with no 0-d/empty recipe in zero_d_empty_cases.py: {missing}"
    stale = sorted((set(CASES) | set(NOT_APPLICABLE)) - registered)
    assert not stale, f"recipes or exclusions for ops with no registered kernel: {stale}"
    both = sorted(set(CASES) & set(NOT_APPLICABLE))
    assert not both, f"ops both covered and excluded: {both}"


@pytest.mark.parametrize("kind, reasons", [("0-d", NO_ZERO_D), ("empty", NO_EMPTY)])
def test_every_op_has_both_kinds_of_case_or_a_reason(kind, reasons):
    for key, cases in CASES.items():
        assert all(c.label.startswith(("0-d", "empty")) for c in cases), f"{key}: labels start with 0-d or empty"
        has = any(c.label.startswith(kind) for c in cases)
        assert has or key in reasons, f"{key} has no {kind} case and no reason in the table"
        assert not (has and key in reasons), f"{key} has {kind} cases but is also listed as having none"
    assert set(reasons) <= set(CASES), f"reasons for ops with no recipes: {sorted(set(reasons) - set(CASES))}"


# ----------------------------------------------------------------------------- through the predictor

def _run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    predictor = optcli.load(optcli.optimize(model=model, valid_targets="arm").data)
    got = predictor.run(feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for out, expected in zip(model.graph.output, sess.run(None, feeds)):
        assert_matches(got[out.name], expected, out.name)


def test_predictor_runs_a_0d_model():
    f32 = onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Mul", ["c", "two"], ["m"]),
             helper.make_node("Add", ["m", "y"], ["s"]), helper.make_node("Unsqueeze", ["s", "ax"], ["u"]),
             helper.make_node("ReduceSum", ["u"], ["out"], keepdims=0), helper.make_node("Relu", ["s"], ["r"])]
    inits = {"lo": np.array(-1.0, np.float32), "hi": np.array(1.0, np.float32),
             "two": np.array(2.0, np.float32), "ax": np.array([0], np.int64)}
    graph = helper.make_graph(
        nodes, "zero_d", [helper.make_tensor_value_info(n, f32, []) for n in "xy"],
        [helper.make_tensor_value_info("out", f32, []), helper.make_tensor_value_info("r", f32, [])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for x in (3.5, -0.25):
        _run_both(model, {"x": np.array(x, np.float32), "y": np.array(-0.5, np.float32)})


def test_predictor_runs_an_empty_batch():
    f32 = onnx.TensorProto.FLOAT
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("LayerNormalization", ["r", "g"], ["n"]),
             helper.make_node("Softmax", ["n"], ["p"]),
             helper.make_node("ReduceSum", ["p", "ax"], ["total"], keepdims=0)]
    inits = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32),
             "g": rng.standard_normal(3).astype(np.float32), "ax": np.array([0], np.int64)}
    graph = helper.make_graph(
        nodes, "empty_batch", [helper.make_tensor_value_info("x", f32, ["N", 4])],
        [helper.make_tensor_value_info("p", f32, ["N", 3]), helper.make_tensor_value_info("total", f32, [3])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for batch in (2, 0):
        _run_both(model, {"x": rng.standard_normal((batch, 4)).astype(np.float32)})
