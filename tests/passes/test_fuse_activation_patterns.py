"""fuse_activation_patterns: x*Sigmoid(x) -> Swish, the hard-swish spellings -> HardSwish."""

import numpy as np
import pytest

from optcli.passes import fuse_activation_patterns
from tests.passes.ir_build import model, node, ops, run_pass

SCALARS = {
    "three": np.array(3.0, np.float32),
    "zero": np.array(0.0, np.float32),
    "six": np.array(6.0, np.float32),
    "sixth": np.array(1.0 / 6.0, np.float32),
}


def _relu6_shift(flip: bool = False) -> list:
    add_inputs = ["three", "x"] if flip else ["x", "three"]
    return [node("Add", add_inputs, ["a"]), node("Clip", ["a", "zero", "six"], ["c"])]


HARD_SWISH = {
    "mul_then_div": _relu6_shift() + [node("Mul", ["x", "c"], ["m"]), node("Div", ["m", "six"], ["y"])],
    "mul_then_mul_sixth": _relu6_shift(True)
    + [node("Mul", ["c", "x"], ["m"]), node("Mul", ["sixth", "m"], ["y"])],
    "div_then_mul": _relu6_shift() + [node("Div", ["c", "six"], ["h"]), node("Mul", ["x", "h"], ["y"])],
    "sixth_then_mul": _relu6_shift() + [node("Mul", ["c", "sixth"], ["h"]), node("Mul", ["h", "x"], ["y"])],
    "hard_sigmoid": [
        node("HardSigmoid", ["x"], ["h"], alpha=1.0 / 6.0, beta=0.5),
        node("Mul", ["h", "x"], ["y"]),
    ],
}


def test_swish():
    m = model(
        [node("Relu", ["in"], ["x"]), node("Sigmoid", ["x"], ["s"]), node("Mul", ["s", "x"], ["y"])],
        {"in": [2, 8]},
    )
    graph, counts = run_pass(m, fuse_activation_patterns)
    assert ops(graph) == ["Relu", "Swish"]
    assert graph.nodes[1].domain == "optcli" and graph.nodes[1].outputs == ["y"]
    assert counts == {"swish": 1, "hard_swish": 0}


@pytest.mark.parametrize("spelling", sorted(HARD_SWISH))
def test_hard_swish(spelling):
    m = model(HARD_SWISH[spelling], {"x": [2, 3, 4, 4]}, initializers=SCALARS)
    graph, counts = run_pass(m, fuse_activation_patterns)
    assert ops(graph) == ["HardSwish"]
    assert graph.nodes[0].inputs == ["x"] and graph.nodes[0].outputs == ["y"]
    assert counts["hard_swish"] == 1


def test_not_fused_when_intermediate_is_read_elsewhere():
    m = model([node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["y"])], {"x": [4]}, outputs=["y", "s"])
    graph, counts = run_pass(m, fuse_activation_patterns)
    assert ops(graph) == ["Sigmoid", "Mul"] and counts["swish"] == 0


def test_not_fused_for_other_operands_or_constants():
    m = model(
        [
            node("Sigmoid", ["z"], ["s"]),
            node("Mul", ["x", "s"], ["p"]),  # x * sigmoid(z): not swish
            node("Add", ["x", "three"], ["a"]),
            node("Clip", ["a", "zero", "five"], ["c"]),  # relu5, not relu6
            node("Mul", ["x", "c"], ["m"]),
            node("Div", ["m", "six"], ["q"]),
            node("Add", ["p", "q"], ["y"]),
        ],
        {"x": [4], "z": [4]},
        initializers={**SCALARS, "five": np.array(5.0, np.float32)},
    )
    graph, counts = run_pass(m, fuse_activation_patterns)
    assert "Swish" not in ops(graph) and "HardSwish" not in ops(graph)
    assert sum(counts.values()) == 0
