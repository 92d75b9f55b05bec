"""fuse_gelu: the erf and tanh spellings of GELU become one Gelu node; near misses stay."""

import math

import numpy as np
import pytest

from optcli.passes import fuse_gelu
from optcli.targets import parse_targets
from tests.passes.ir_build import model, node, ops, run_pass

F = np.float32
C = {
    "sqrt2": np.array(math.sqrt(2.0), F),
    "inv_sqrt2": np.array(1.0 / math.sqrt(2.0), F),
    "one": np.array(1.0, F),
    "half": np.array(0.5, F),
    "three": np.array(3.0, F),
    "k": np.array(0.044715, F),
    "s2pi": np.array(math.sqrt(2.0 / math.pi), F),
    "c15": np.array(1.5, F),
}

ERF_ARG = {
    "div": [node("Div", ["x", "sqrt2"], ["d"])],
    "mul": [node("Mul", ["inv_sqrt2", "x"], ["d"])],
}
# 0.5 * x * a (a = 1 + f(x)) in its three associations, operands in several orders.
TAIL = {
    "x_times_a_then_half": [node("Mul", ["x", "a"], ["m"]), node("Mul", ["m", "half"], ["y"])],
    "half_x_times_a": [node("Mul", ["half", "x"], ["h"]), node("Mul", ["a", "h"], ["y"])],
    "half_a_times_x": [node("Mul", ["a", "half"], ["h"]), node("Mul", ["x", "h"], ["y"])],
}
CUBE = {
    "pow": [node("Pow", ["x", "three"], ["x3"])],
    "x_x_x": [node("Mul", ["x", "x"], ["sq"]), node("Mul", ["sq", "x"], ["x3"])],
    "x_xx": [node("Mul", ["x", "x"], ["sq"]), node("Mul", ["x", "sq"], ["x3"])],
}


def _erf(arg: str, tail: str, flip_add: bool = False) -> list:
    add = node("Add", ["one", "e"] if flip_add else ["e", "one"], ["a"])
    return [node("Relu", ["in"], ["x"]), *ERF_ARG[arg], node("Erf", ["d"], ["e"]), add, *TAIL[tail]]


def _tanh(cube: str, tail: str) -> list:
    return [
        node("Relu", ["in"], ["x"]), *CUBE[cube],
        node("Mul", ["k", "x3"], ["q"]), node("Add", ["x", "q"], ["s"]), node("Mul", ["s", "s2pi"], ["t_in"]),
        node("Tanh", ["t_in"], ["t"]), node("Add", ["t", "one"], ["a"]), *TAIL[tail],
    ]


@pytest.mark.parametrize("arg", sorted(ERF_ARG))
@pytest.mark.parametrize("tail", sorted(TAIL))
def test_erf_form(arg, tail):
    m = model(_erf(arg, tail, flip_add=arg == "mul"), {"in": [2, 3, 8]}, initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert ops(graph) == ["Relu", "Gelu"] and counts == {"erf": 1, "tanh": 0}
    gelu = graph.nodes[1]
    assert gelu.inputs == ["x"] and gelu.outputs == ["y"] and gelu.attrs == {"approximate": "none"}
    assert gelu.domain == ""


@pytest.mark.parametrize("cube", sorted(CUBE))
@pytest.mark.parametrize("tail", ["x_times_a_then_half", "half_x_times_a"])
def test_tanh_form(cube, tail):
    m = model(_tanh(cube, tail), {"in": [2, 16]}, initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert ops(graph) == ["Relu", "Gelu"] and counts == {"erf": 0, "tanh": 1}
    assert graph.nodes[1].attrs == {"approximate": "tanh"}


@pytest.mark.parametrize("also_read", ["d", "e", "a", "m"])
def test_intermediate_read_elsewhere_is_not_fused(also_read):
    m = model(_erf("div", "x_times_a_then_half"), {"in": [4, 8]}, outputs=["y", also_read], initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert "Gelu" not in ops(graph) and counts["erf"] == 0


def test_tanh_cube_read_elsewhere_is_not_fused():
    m = model(_tanh("x_x_x", "half_x_times_a"), {"in": [4, 8]}, outputs=["y", "sq"], initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert "Gelu" not in ops(graph) and counts["tanh"] == 0


def test_wrong_constant_is_not_fused():
    nodes = _erf("div", "half_a_times_x")
    nodes[1] = node("Div", ["x", "c15"], ["d"])
    m = model(nodes, {"in": [4, 8]}, initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert "Gelu" not in ops(graph) and counts["erf"] == 0


def test_half_of_another_tensor_is_not_fused():
    # 0.5 * z * (1 + erf(x / sqrt2)) with z != x is not GELU.
    nodes = [node("Relu", ["in"], ["x"]), node("Neg", ["in"], ["z"]), *ERF_ARG["div"], node("Erf", ["d"], ["e"]),
             node("Add", ["e", "one"], ["a"]), node("Mul", ["z", "a"], ["m"]), node("Mul", ["m", "half"], ["y"])]
    m = model(nodes, {"in": [4, 8]}, initializers=C)
    graph, counts = run_pass(m, fuse_gelu)
    assert "Gelu" not in ops(graph) and counts["erf"] == 0


def test_fused_erf_gelu_stays_placeable_on_opencl():
    m = model(_erf("div", "x_times_a_then_half"), {"in": [1, 8, 4, 4]}, initializers=C)
    graph, _ = run_pass(m, fuse_gelu)
    opencl = parse_targets("opencl")[0]
    ok, reason = opencl.can_run(graph.nodes[1], graph)
    assert ok, reason
