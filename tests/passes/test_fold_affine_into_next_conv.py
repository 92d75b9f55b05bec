"""fold_affine_into_next_conv: constant Mul/Div/Add/Sub chains before a Conv fold into its weights,
and into its bias where it pads nothing (before a padded conv the shift stays as one Add)."""

import numpy as np
import pytest

from optcli.passes import fold_affine_into_next_conv
from tests.passes.ir_build import model, node, ops, run_pass

F = np.float32
RNG = np.random.default_rng(12)
C = 6  # the chain's channels: the conv's input channels


def _chain_conv(tail: list, consts: dict, kernel: int = 1, group: int = 1, bias: bool = True,
                out: tuple = ("y",), channels: int = C, **conv_attrs) -> tuple:
    """x -> HardSwish (a nonlinearity no pass folds through) -> ``tail`` steps (op, constant,
    constant first?) -> Conv(C -> 4 * group channels)."""
    inits = {"w": RNG.standard_normal((4 * group, C // group, kernel, kernel)).astype(F),
             **{k: np.asarray(v, F) for k, v in consts.items()}}
    conv_inputs = ["t", "w"]
    if bias:
        inits["cb"] = RNG.standard_normal(4 * group).astype(F)
        conv_inputs.append("cb")
    nodes, prev = [node("HardSwish", ["x"], ["h"])], "h"
    for i, (op, const, flip) in enumerate(tail):
        name = "t" if i == len(tail) - 1 else f"t{i}"
        nodes.append(node(op, [const, prev] if flip else [prev, const], [name]))
        prev = name
    nodes.append(node("Conv", conv_inputs, ["y"], group=group, **conv_attrs))
    return model(nodes, {"x": [1, channels, 7, 7]}, outputs=list(out), initializers=inits), inits


def _pos(shape):
    return RNG.uniform(0.5, 2.0, shape)


LAB = [("Mul", "a", True), ("Add", "b", False)]  # PaddlePaddle's learnable affine: scale * x + bias
EXACT = {
    "lab_1x1": (LAB, {"a": [1.3], "b": [0.2]}, {}),
    "lab_per_channel_3x3_stride_dilation": (LAB, {"a": _pos((1, C, 1, 1)), "b": _pos((C, 1, 1))},
                                            {"kernel": 3, "strides": [2, 2], "dilations": [2, 2]}),
    "x/a-b_valid": ([("Div", "a", False), ("Sub", "b", False)], {"a": [0.7], "b": [0.2]},
                    {"kernel": 3, "auto_pad": "VALID"}),
    "b-x_grouped": ([("Sub", "b", True)], {"b": _pos((C, 1, 1))}, {"kernel": 2, "group": 3}),
    "(x+b)*a_depthwise": ([("Add", "b", False), ("Mul", "a", False)], {"a": _pos((C, 1, 1)), "b": [0.1]},
                          {"group": C}),
    "scale_only_padded": ([("Mul", "a", False), ("Div", "d", False)], {"a": [-1.3], "d": _pos((C, 1, 1))},
                          {"kernel": 3, "pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", sorted(EXACT))
def test_chain_folds_into_the_conv(case, bias):
    tail, consts, conv = EXACT[case]
    m, inits = _chain_conv(tail, consts, bias=bias, **conv)
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", "Conv"] and counts == {"folded": len(tail)}
    assert graph.nodes[1].inputs[0] == "h"
    np.testing.assert_array_equal(graph.initializers["w"], inits["w"])  # left as it was, for other readers


@pytest.mark.parametrize("a, b", [([1.3], [0.2]), (_pos((C, 1, 1)), [0.2])])
@pytest.mark.parametrize("pads", [{"pads": [1, 1, 1, 1]}, {"auto_pad": "SAME_UPPER"}])
def test_padded_conv_keeps_the_shift_as_one_add(a, b, pads):
    m, _ = _chain_conv(LAB, {"a": a, "b": b}, kernel=3, **pads)
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", "Add", "Conv"] and counts == {"folded": 1}
    assert graph.nodes[1].inputs[0] == "h" and graph.nodes[2].inputs[0] == graph.nodes[1].outputs[0]


@pytest.mark.parametrize("tail, consts", [
    ([("Add", "b", False)], {"b": [0.2]}),  # a lone shift: nothing to gain
    (LAB, {"a": [0.0], "b": [0.2]}),  # a zero scale cannot carry the shift in front of it
])
def test_padded_conv_without_gain_stays(tail, consts):
    m, _ = _chain_conv(tail, consts, kernel=3, pads=[1, 1, 1, 1])
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", *(t[0] for t in tail), "Conv"] and counts["folded"] == 0


def test_chain_read_elsewhere_stops_there():
    m, _ = _chain_conv(LAB, {"a": [1.3], "b": [0.2]}, out=("y", "t0"))
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", "Mul", "Conv"] and counts["folded"] == 1


def test_conv_input_read_elsewhere_stays():
    m, _ = _chain_conv(LAB, {"a": [1.3], "b": [0.2]}, out=("y", "t"))
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", "Mul", "Add", "Conv"] and counts["folded"] == 0


def test_step_that_grows_its_data_stays():
    # One channel times six: the Mul makes the channels the conv reads.
    m, _ = _chain_conv([("Mul", "a", False)], {"a": _pos((1, C, 1, 1))}, channels=1)
    graph, counts = run_pass(m, fold_affine_into_next_conv)
    assert ops(graph) == ["HardSwish", "Mul", "Conv"] and counts["folded"] == 0


def test_constant_divided_by_the_data_stays():
    m, _ = _chain_conv([("Div", "a", True)], {"a": [2.0]})
    graph, _ = run_pass(m, fold_affine_into_next_conv, feeds={"x": _pos((1, C, 7, 7)).astype(F)})
    assert ops(graph) == ["HardSwish", "Div", "Conv"]


def test_overflowing_weights_stay():
    # Small inputs keep the model's own output finite; the weights times 3e38 would not be.
    m, _ = _chain_conv([("Mul", "a", False)], {"a": [3e38]})
    feeds = {"x": RNG.uniform(0, 1e-3, (1, C, 7, 7)).astype(F)}
    graph, counts = run_pass(m, fold_affine_into_next_conv, feeds=feeds)
    assert ops(graph) == ["HardSwish", "Mul", "Conv"] and counts["folded"] == 0


def test_shared_weight_is_not_changed_for_the_other_conv():
    inits = {"w": RNG.standard_normal((4, C, 1, 1)).astype(F), "a": np.array([1.5], F), "b": np.array([0.2], F)}
    nodes = [node("Mul", ["x", "a"], ["m"]), node("Add", ["m", "b"], ["t"]), node("Conv", ["t", "w"], ["y"]),
             node("Conv", ["x", "w"], ["z"])]
    graph, _ = run_pass(model(nodes, {"x": [1, C, 5, 5]}, outputs=["y", "z"], initializers=inits),
                        fold_affine_into_next_conv)
    assert ops(graph) == ["Conv", "Conv"] and graph.nodes[1].inputs[1] == "w"
    np.testing.assert_array_equal(graph.initializers["w"], inits["w"])


def test_lcnetv3_blocks_end_to_end():
    """Two PP-LCNetV3 blocks as exported (each layer Conv -> x*a+b -> HardSwish -> x*a+b), through
    the whole pipeline and the runtime: of the 16 Mul/Add steps one Add stays, before the padded
    depthwise conv of the second block, and the last layer's output affine, read by nothing else."""
    import optcli
    from tests.helpers import assert_close, run_ort

    nodes, inits, prev = [], {}, "x"
    for i, (k, group) in enumerate([(3, C), (1, 1), (3, C), (1, 1)]):
        inits[f"w{i}"] = RNG.standard_normal((C, C // group, k, k)).astype(F) / k
        inits[f"cb{i}"] = RNG.standard_normal(C).astype(F)
        nodes.append(node("Conv", [prev, f"w{i}", f"cb{i}"], [f"c{i}"], pads=[k // 2] * 4, group=group))
        prev = f"c{i}"
        for j, (op, c) in enumerate([("Mul", "a"), ("Add", "b"), ("HardSwish", None), ("Mul", "a2"), ("Add", "b2")]):
            if c is not None:
                inits[f"{c}{i}"] = np.array([RNG.uniform(0.8, 1.2) if op == "Mul" else RNG.uniform(-0.3, 0.3)], F)
            nodes.append(node(op, [prev] if c is None else [f"{c}{i}", prev], [f"t{i}{j}"]))
            prev = f"t{i}{j}"
    nodes.append(node("Identity", [prev], ["y"]))
    m = model(nodes, {"x": [1, C, 9, 9]}, initializers=inits)
    result = optcli.optimize(model=m, valid_targets="arm")
    steps = [s.op_type for s in result.plan.steps]
    assert steps.count("Conv") == 4 and steps.count("Add") == 2 and steps.count("Mul") == 1, steps
    feeds = {"x": RNG.standard_normal((1, C, 9, 9)).astype(F)}
    assert_close(optcli.load(result.data).run(feeds)["y"], run_ort(m, feeds)[0])
