"""fuse_layer_norm: the decomposed layer norm becomes LayerNormalization; near misses stay."""

import numpy as np
import pytest

from optcli.passes import fuse_layer_norm
from tests.passes.ir_build import feeds_for, model, node, ops, run_pass

F = np.float32
RNG = np.random.default_rng(3)


def _inits(dims=(16,)) -> dict:
    return {"two": np.array(2.0, F), "eps": np.array(1e-5, F),
            "gamma": RNG.uniform(0.5, 1.5, dims).astype(F), "beta": RNG.standard_normal(dims).astype(F)}


def _ln(axes=(-1,), square="pow", divide="div", gamma=True, beta=True, axes_input=False) -> list:
    def mean(src, dst):
        if axes_input:
            return node("ReduceMean", [src, "axes"], [dst])
        return node("ReduceMean", [src], [dst], axes=list(axes))

    nodes = [node("Relu", ["in"], ["x"]), mean("x", "mu"), node("Sub", ["x", "mu"], ["d"])]
    nodes.append(node("Pow", ["d", "two"], ["sq"]) if square == "pow" else node("Mul", ["d", "d"], ["sq"]))
    nodes += [mean("sq", "var"), node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"])]
    if divide == "div":
        nodes.append(node("Div", ["d", "sd"], ["n"]))
    else:
        nodes += [node("Reciprocal", ["sd"], ["inv"]), node("Mul", ["inv", "d"], ["n"])]
    last = "n"
    if gamma:
        nodes.append(node("Mul", ["gamma", last], ["g"]))
        last = "g"
    if beta:
        nodes.append(node("Add", [last, "beta"], ["b"]))
        last = "b"
    nodes.append(node("Identity", [last], ["y"]))
    return nodes


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "reciprocal"])
def test_full_pattern(square, divide):
    inits = _inits()
    m = model(_ln(square=square, divide=divide), {"in": [2, 5, 16]}, initializers=inits)
    graph, counts = run_pass(m, fuse_layer_norm)
    assert ops(graph) == ["Relu", "LayerNormalization", "Identity"] and counts == {"fused": 1}
    ln = graph.nodes[1]
    assert ln.inputs[0] == "x" and len(ln.inputs) == 3 and ln.outputs == ["b"]
    assert ln.attrs["axis"] == -1 and ln.attrs["epsilon"] == pytest.approx(1e-5)
    np.testing.assert_array_equal(graph.const(ln.inputs[1]), inits["gamma"])
    np.testing.assert_array_equal(graph.const(ln.inputs[2]), inits["beta"])


def test_without_scale_and_shift_and_with_dynamic_leading_dims():
    m = model(_ln(gamma=False, beta=False), {"in": ["B", "S", 16]}, initializers=_inits())
    graph, _ = run_pass(m, fuse_layer_norm, feeds=feeds_for(m, dims={"B": 3, "S": 7}))
    assert ops(graph) == ["Relu", "LayerNormalization", "Identity"]
    ln = graph.nodes[1]
    assert len(ln.inputs) == 2 and np.all(graph.const(ln.inputs[1]) == 1) and ln.outputs == ["n"]


def test_two_trailing_axes_with_positive_indices():
    m = model(_ln(axes=(2, 1)), {"in": [2, 5, 16]}, initializers=_inits((5, 16)))
    graph, _ = run_pass(m, fuse_layer_norm)
    assert ops(graph) == ["Relu", "LayerNormalization", "Identity"] and graph.nodes[1].attrs["axis"] == -2


def test_axes_as_input_at_opset_18():
    inits = {**_inits(), "axes": np.array([-1], np.int64)}
    m = model(_ln(axes_input=True), {"in": [2, 5, 16]}, initializers=inits, opset=18)
    graph, _ = run_pass(m, fuse_layer_norm)
    assert ops(graph) == ["Relu", "LayerNormalization", "Identity"]


def test_gamma_varying_along_a_leading_dim_stays_a_mul():
    inits = _inits()
    inits["gamma"] = RNG.uniform(0.5, 1.5, (5, 1)).astype(F)
    m = model(_ln(beta=False), {"in": [2, 5, 16]}, initializers=inits)
    graph, _ = run_pass(m, fuse_layer_norm)
    assert ops(graph) == ["Relu", "LayerNormalization", "Mul", "Identity"]


def test_channel_axis_of_nchw_is_not_fused():
    # Mean over axis 1 of NCHW: not the trailing dims, so no LayerNormalization.
    m = model(_ln(axes=(1,), gamma=False, beta=False), {"in": [1, 4, 3, 3]}, initializers=_inits())
    graph, counts = run_pass(m, fuse_layer_norm)
    assert "LayerNormalization" not in ops(graph) and counts["fused"] == 0


def test_mismatched_reductions_are_not_fused():
    nodes = _ln(gamma=False, beta=False)
    nodes[4] = node("ReduceMean", ["sq"], ["var"], axes=[-2])
    m = model(nodes, {"in": [2, 5, 16]}, initializers=_inits())
    graph, counts = run_pass(m, fuse_layer_norm)
    assert "LayerNormalization" not in ops(graph) and counts["fused"] == 0


@pytest.mark.parametrize("also_read", ["mu", "d", "var", "sd", "n"])
def test_intermediate_read_elsewhere_is_not_fused_over(also_read):
    m = model(_ln(), {"in": [2, 5, 16]}, outputs=["y", also_read], initializers=_inits())
    graph, _ = run_pass(m, fuse_layer_norm)
    if also_read == "n":  # the norm itself is wanted: fused up to it, gamma and beta stay
        assert ops(graph) == ["Relu", "LayerNormalization", "Mul", "Add", "Identity"]
    else:
        assert "LayerNormalization" not in ops(graph)


def test_dynamic_normalized_dim_is_not_fused():
    m = model(_ln(gamma=False, beta=False), {"in": [2, "H"]}, initializers=_inits())
    graph, _ = run_pass(m, fuse_layer_norm, feeds=feeds_for(m, dims={"H": 6}))
    assert "LayerNormalization" not in ops(graph)


def test_centred_value_with_a_third_reader_is_not_fused():
    nodes = _ln(gamma=False, beta=False) + [node("Neg", ["d"], ["z"])]
    m = model(nodes, {"in": [2, 5, 16]}, outputs=["y", "z"], initializers=_inits())
    graph, _ = run_pass(m, fuse_layer_norm)
    assert "LayerNormalization" not in ops(graph)
