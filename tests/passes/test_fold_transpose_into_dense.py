"""fold_transpose_into_dense: Transpose -> Flatten/Reshape -> dense layers become Flatten -> dense
layers with their weight rows permuted, exactly; and left alone where that would not be exact."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import optcli

RNG = np.random.default_rng(11)


def _model(perm, flatten="Flatten", shape=(2, 5, 3, 4), heads=1, extra_reader=False):
    features = int(np.prod(shape[1:]))
    inits = [numpy_helper.from_array(RNG.standard_normal((features, 7)).astype(np.float32), "w0"),
             numpy_helper.from_array(RNG.standard_normal(7).astype(np.float32), "b0"),
             numpy_helper.from_array(RNG.standard_normal((features, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "rows")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=list(perm))]
    if flatten == "Flatten":
        nodes.append(helper.make_node("Flatten", ["t"], ["f"], axis=1))
    else:
        nodes.append(helper.make_node("Reshape", ["t", "rows"], ["f"]))
    nodes += [helper.make_node("MatMul", ["f", "w0"], ["m0"]), helper.make_node("Add", ["m0", "b0"], ["y0"])]
    outputs = ["y0"]
    if heads == 2:
        nodes.append(helper.make_node("MatMul", ["f", "w1"], ["y1"]))
        outputs.append("y1")
    if extra_reader:
        nodes.append(helper.make_node("Sigmoid", ["t"], ["s"]))
        outputs.append("s")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _check(m, folded: bool):
    x = RNG.standard_normal(tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim))
    x = x.astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    result = optcli.optimize(model=m, valid_targets="arm")
    p = optcli.load(result.data)
    ops = [s.op_type for s in p._executor.plan.steps]
    assert ("Transpose" not in ops) == folded, ops
    got = p.run({"x": x})
    for name, w in zip([o.name for o in m.graph.output], want):
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 3, 2, 1), (0, 1, 3, 2), (0, 1, 2, 3)])
@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
@pytest.mark.parametrize("heads", [1, 2])
def test_the_transpose_goes_and_the_result_stays(perm, flatten, heads):
    _check(_model(perm, flatten, heads=heads), folded=True)


def test_a_transpose_read_elsewhere_stays():
    _check(_model((0, 2, 3, 1), extra_reader=True), folded=False)


def test_a_transpose_that_moves_the_batch_stays():
    _check(_model((1, 0, 2, 3), shape=(2, 2, 3, 4)), folded=False)


def test_the_pass_permutes_a_copy_of_a_shared_weight():
    """Two Transposes of two branches feeding dense layers that share one weight: each gets its own
    permuted copy; the model's result is unchanged."""
    m = _model((0, 2, 3, 1), heads=1)
    g = m.graph
    g.node.extend([helper.make_node("Transpose", ["r"], ["t2"], perm=[0, 3, 1, 2]),
                   helper.make_node("Flatten", ["t2"], ["f2"], axis=1),
                   helper.make_node("MatMul", ["f2", "w0"], ["y2"])])
    g.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    _check(m, folded=True)
