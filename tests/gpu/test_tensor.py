"""Data-movement GPU kernels (remap family, Slice, Split, Concat, Pad) against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.gpu.registry import gpu_kernels_for
from tests.gpu.harness import check_gpu, one_node_graph

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 6, 3, 5)).astype(np.float32)
I64 = np.int64

# (op, input, consts, attrs)
CASES = [
    ("Reshape", X, {"s": np.array([2, 5, 3, 6], I64)}, {}),
    ("Reshape", X, {"s": np.array([2, -1], I64)}, {}),
    ("Reshape", X, {"s": np.array([2, 6, 15], I64)}, {}),
    ("Flatten", X, {}, {"axis": 1}),
    ("Flatten", X, {}, {"axis": 2}),
    ("Squeeze", X[:, :, :1].copy(), {"a": np.array([2], I64)}, {}),
    ("Unsqueeze", X[0].copy(), {"a": np.array([0], I64)}, {}),
    ("Identity", X, {}, {}),
    ("Unsqueeze", X[:, :, 0].copy(), {"a": np.array([1], I64)}, {}),
    ("Transpose", X, {}, {"perm": [0, 2, 3, 1]}),
    ("Transpose", X, {}, {"perm": [1, 0, 3, 2]}),
    ("Transpose", X[:, :, 0].copy(), {}, {"perm": [0, 2, 1]}),
    ("Transpose", X[:, :, 0, 0].copy(), {}, {}),
    ("DepthToSpace", X[:, :4].copy(), {}, {"blocksize": 2, "mode": "DCR"}),
    ("DepthToSpace", RNG.standard_normal((2, 12, 2, 3)).astype(np.float32), {}, {"blocksize": 2, "mode": "CRD"}),
    ("SpaceToDepth", RNG.standard_normal((2, 3, 4, 6)).astype(np.float32), {}, {"blocksize": 2}),
    ("Slice", X, {"st": np.array([1, 1], I64), "en": np.array([5, 3], I64), "ax": np.array([1, 3], I64)}, {}),
    ("Slice", X, {"st": np.array([-1, 4], I64), "en": np.array([-100, 0], I64), "ax": np.array([2, 3], I64),
                  "sp": np.array([-1, -2], I64)}, {}),
    ("Slice", X, {"st": np.array([0, 3], I64), "en": np.array([1, 6], I64), "ax": np.array([0, 1], I64)}, {}),
    ("Expand", RNG.standard_normal((6, 1, 5)).astype(np.float32), {"s": np.array([2, 6, 3, 5], I64)}, {}),
    ("Pad", X, {"p": np.array([0, 1, 1, 2, 0, 2, 0, 1], I64)}, {"mode": "constant"}),
    ("Pad", X, {"p": np.array([0, 0, 2, 1, 0, 0, 1, 3], I64)}, {"mode": "reflect"}),
    ("Pad", X, {"p": np.array([0, 0, 2, 1, 0, 0, 1, 3], I64)}, {"mode": "edge"}),
    ("Pad", X, {"p": np.array([0, -1, 1, -2, 0, 2, 0, 1], I64), "v": np.array(1.5, np.float32)}, {}),
    ("Pad", X[:, :, 0].copy(), {"p": np.array([0, 0, 2, 0, 0, 1], I64)}, {"mode": "reflect"}),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_remap_family(case, precision):
    op, x, consts, attrs = CASES[case]
    graph, node = one_node_graph(op, {"x": x}, consts, attrs)
    check_gpu(graph, node, {"x": x}, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("shapes, axis", [
    ([(2, 3, 4, 5), (2, 5, 4, 5), (2, 2, 4, 5)], 1),
    ([(2, 6, 4, 5), (2, 6, 1, 5)], 2),
    ([(2, 3, 4, 5), (2, 3, 4, 2)], -1),
    ([(1, 3, 4, 5), (2, 3, 4, 5)], 0),
    ([(2, 3), (2, 6)], 1),
    ([(2, 5, 4), (2, 3, 4)], 1),
])
def test_concat(shapes, axis, precision):
    inputs = {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    graph, node = one_node_graph("Concat", inputs, attrs={"axis": axis})
    check_gpu(graph, node, inputs, precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("shape, axis, sizes, opset", [
    ((2, 7, 3, 5), 1, [3, 4], 17),        # channel split off a slice-of-4 boundary (mixnet)
    ((2, 12, 3, 5), 1, [4, 4, 4], 17),
    ((2, 6, 3, 5), 2, [1, 2], 17),
    ((2, 6, 3, 5), -1, [2, 3], 17),
    ((2, 6, 3), 1, [1, 5], 17),
    ((2, 9, 3, 5), 1, None, 17),          # equal parts, no sizes given
    ((2, 9, 3, 5), 1, None, 18),          # num_outputs, the last part smaller
])
def test_split(shape, axis, sizes, opset, precision):
    x = RNG.standard_normal(shape).astype(np.float32)
    consts = {"s": np.array(sizes, I64)} if sizes else {}
    n = len(sizes) if sizes else 3 if opset < 18 else 2
    attrs = {"axis": axis, **({"num_outputs": n} if opset >= 18 and not sizes else {})}
    graph, node = one_node_graph("Split", {"x": x}, consts, attrs, n_outputs=n, opset=opset)
    check_gpu(graph, node, {"x": x}, precision)


def test_concat_with_constant():
    x, w = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32), RNG.standard_normal((2, 2, 2, 2)).astype(np.float32)
    graph, node = one_node_graph("Concat", {"x": x}, {"w": w}, {"axis": 1})
    check_gpu(graph, node, {"x": x})


def _reason(op, graph, node):
    return gpu_kernels_for(op)[0].check(node, graph)


def test_rejects():
    st = np.array([1], I64)
    graph, node = one_node_graph("Slice", {"x": X, "s": st}, {"e": np.array([3], I64)}, input_names=["x", "s", "e"])
    assert "constants" in _reason("Slice", graph, node)
    graph, node = one_node_graph("Pad", {"x": X, "p": np.zeros(8, I64)})
    assert "constant" in _reason("Pad", graph, node)
    graph, node = one_node_graph("Pad", {"x": X}, {"p": np.array([0, 0, -1, 0, 0, 0, 0, 0], I64)}, {"mode": "edge"})
    assert "negative" in _reason("Pad", graph, node)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pack_and_unpack_in_a_loaded_plan(precision):
    """Upload -> Pack -> Relu -> Unpack -> Download through optcli.load: the layout kernels at both
    precisions, on 6 channels (a padded slice of 4)."""
    from onnx import TensorProto, helper

    import optcli

    x = X[:, :, :3].copy()
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    result = optcli.optimize(model=model, valid_targets="opencl,arm", precision=precision,
                             disabled_passes={"keep_small_islands_on_host"})
    p = optcli.load(result.data, require_gpu=True)
    ops = [s.op_type for s in p.plan.steps if s.target == "opencl"]
    assert ops == ["Upload", "Pack", "Relu", "Unpack", "Download"], ops
    np.testing.assert_array_equal(p.run({"x": x})["y"], np.maximum(x, 0).astype(np.float16 if precision == "fp16"
                                                                                   else np.float32))
