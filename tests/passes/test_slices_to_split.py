"""slices_to_split: Slices that tile one axis of a tensor become one Split (what onnxruntime's
optimizer does with a mel front end's real and imaginary halves); anything short of an exact
tiling keeps its Slices.  Every case is checked against onnxruntime on the original model."""

import numpy as np
import pytest

from optcli.passes import slices_to_split
from tests.passes.ir_build import model, node, ops, run_pass

I64 = np.int64


def _slices(bounds, axis=1, shape=(2, 10, 3), opset=17, steps=None):
    """Relu(x), then a Slice per (start, end) along ``axis``, each output summed into y via Concat."""
    nodes, inits, outs = [node("Relu", ["x"], ["r"])], {}, []
    for i, (start, end) in enumerate(bounds):
        out = f"s{i}"
        if opset >= 10:
            inits.update({f"b{i}": np.array([start], I64), f"e{i}": np.array([end], I64),
                          f"a{i}": np.array([axis], I64)})
            ins = ["r", f"b{i}", f"e{i}", f"a{i}"]
            if steps is not None:
                inits[f"t{i}"] = np.array([steps], I64)
                ins.append(f"t{i}")
            nodes.append(node("Slice", ins, [out]))
        else:
            nodes.append(node("Slice", ["r"], [out], starts=[start], ends=[end], axes=[axis]))
        outs.append(out)
    nodes.append(node("Concat", outs, ["y"], axis=axis))
    return model(nodes, {"x": list(shape)}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
def test_halves_become_one_split(opset):
    graph, counts = run_pass(_slices([(0, 4), (4, 10)], opset=opset), slices_to_split)
    assert ops(graph) == ["Relu", "Split", "Concat"] and counts == {"Slice": 2}
    split = graph.nodes[1]
    assert split.outputs == ["s0", "s1"] and split.attrs["axis"] == 1
    sizes = split.attrs["split"] if opset < 13 else list(graph.const(split.inputs[1]))
    assert list(sizes) == [4, 6]


def test_out_of_order_negative_and_clamped_bounds():
    # what exporters write: x[:, -3:] as (-3, INT64_MAX), x[:, :3], x[:, 3:-3]
    big = np.iinfo(np.int64).max
    graph, _ = run_pass(_slices([(-3, big), (0, 3), (3, -3)]), slices_to_split)
    assert ops(graph) == ["Relu", "Split", "Concat"]
    assert graph.nodes[1].outputs == ["s1", "s2", "s0"]


@pytest.mark.parametrize("bounds", [
    [(0, 4), (5, 10)],        # a gap
    [(0, 5), (4, 10)],        # an overlap
    [(0, 4), (4, 9)],         # short of the end
    [(0, 10)],                # one piece: eliminate_identity's business
])
def test_anything_but_an_exact_tiling_keeps_its_slices(bounds):
    graph, counts = run_pass(_slices(bounds), slices_to_split)
    assert "Split" not in ops(graph) and not counts


def test_steps_other_than_one_keep_their_slices():
    graph, counts = run_pass(_slices([(0, 5), (5, 10)], steps=2), slices_to_split)
    assert "Split" not in ops(graph) and not counts


def test_an_axis_of_unknown_length_keeps_its_slices():
    m = _slices([(0, 4), (4, 10)], shape=(2, "n", 3))
    graph, counts = run_pass(m, slices_to_split, feeds={"x": np.ones((2, 10, 3), np.float32)})
    assert "Split" not in ops(graph) and not counts


def test_slices_of_different_axes_are_not_mixed():
    # x[0:1, :] and x[:, 1:2] would tile a length-2 axis if the axis were not part of the match
    m = model([node("Slice", ["x", "b0", "e0", "a0"], ["s0"]), node("Slice", ["x", "b1", "e1", "a1"], ["s1"]),
               node("Add", ["s0", "s1"], ["y"])], {"x": [2, 2]},
              initializers={"b0": np.array([0], I64), "e0": np.array([1], I64), "a0": np.array([0], I64),
                            "b1": np.array([1], I64), "e1": np.array([2], I64), "a1": np.array([1], I64)})
    graph, counts = run_pass(m, slices_to_split)
    assert ops(graph) == ["Slice", "Slice", "Add"] and not counts
