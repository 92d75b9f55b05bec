"""Shape derivation from input shapes (``optcli.ops.shape_derivation`` and the per-op shape functions of
``optcli.ops.shape_functions``), which the runtime's load check and per-shape GPU binding and the
compiler's placement of dynamic dims use: the hard rules one by one."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.ir import Node
from optcli.ops.shape_derivation import ShapeDerivationError, derive_shapes


def _position_slice():
    """A transformer's position embedding: Slice a [1, 512] table to the sequence length, read
    from the input's shape at run time (onnx's data propagation does not cover Slice)."""
    nodes = [Node("Shape", ["ids"], ["s"]), Node("Gather", ["s", "one"], ["len"], {"axis": 0}),
             Node("Unsqueeze", ["len", "zero1"], ["end"]),
             Node("Slice", ["table", "zero1", "end", "one1"], ["pos"]),
             Node("FullyConnected", ["pos_f", "w"], ["fc"], domain="optcli"),
             Node("Cast", ["pos"], ["pos_f"], {"to": 1})]
    nodes = nodes[:4] + [nodes[5], nodes[4]]
    consts = {"one": np.array(1, np.int64), "zero1": np.array([0], np.int64), "one1": np.array([1], np.int64),
              "table": np.arange(512, dtype=np.int64).reshape(1, 512),
              "w": np.zeros((7, 1000), np.float32)}  # too big to fold: fc is derived, not evaluated
    return nodes, consts


def test_shape_arithmetic_is_evaluated_in_the_one_pass():
    nodes, consts = _position_slice()
    shapes = derive_shapes(nodes, {"ids": ("int64", (2, 7))}, consts, {"": 17}, ["fc"])
    assert shapes["pos"] == (1, 7) and shapes["fc"] == (1, 1000)
    symbolic = derive_shapes(nodes, {"ids": ("int64", ("B", "L"))}, consts, {"": 17}, ["fc"])
    assert symbolic["pos"] == (1, None) and symbolic["fc"] == (1, 1000)  # the length is data to the Slice


def _one(op: str, shapes: list, values: dict | None = None, attrs: dict | None = None, opset: int = 17,
         n_outputs: int = 1, domain: str = "", strict: bool = True) -> list:
    """The output shapes of one ``op`` node on inputs of these shapes (None: an absent input);
    ``values`` gives some inputs by value ({position: array})."""
    values = values or {}
    names = ["" if s is None and k not in values else f"in{k}" for k, s in enumerate(shapes)]
    inputs = {n: ("float32", s) for k, (n, s) in enumerate(zip(names, shapes)) if n and k not in values}
    consts = {f"in{k}": np.asarray(v) for k, v in values.items()}
    outs = [f"out{k}" for k in range(n_outputs)]
    node = Node(op, names, outs, attrs or {}, "n", domain)
    derived = derive_shapes([node], inputs, consts, {"": opset}, outs, strict=strict)
    return [derived.get(o) for o in outs]


@pytest.mark.parametrize("attrs,spatial,expected", [
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (7, 8), (7, 8)),
    ({"kernel_shape": [3, 3], "strides": [2, 2]}, (7, 8), (3, 3)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, (7, 8), (4, 4)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, (7, 8), (4, 4)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, (7, 8), (3, 3)),
    ({"kernel_shape": [3, 3], "dilations": [2, 2]}, (7, 8), (3, 4)),
    ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, (7, 8), (4, 4)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, (4, 4), (3, 3)),
    # ceil_mode: a last window that would start in the end padding is dropped (as onnxruntime)
    ({"kernel_shape": [1, 1], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1}, (2, 2), (1, 1)),
    ({"kernel_shape": [3, 3], "strides": [2, 2]}, ("H", 8), (None, 3)),
])
def test_pool_windows(attrs, spatial, expected):
    assert _one("MaxPool", [(1, 4, *spatial)], attrs=attrs) == [(1, 4, *expected)]
    if all(isinstance(d, int) for d in spatial):  # what the kernels compute
        from optcli.ops.pool import average_pool, max_pool

        x = np.zeros((1, 4, *spatial), np.float32)
        assert max_pool([x], attrs)[0].shape == average_pool([x], attrs)[0].shape == (1, 4, *expected)


def test_conv_window_channels_groups_and_bias():
    w = np.zeros((8, 2, 3, 3), np.float32)
    assert _one("Conv", [("N", 4, 9, 9), None], {1: w}, {"group": 2, "strides": [2, 2]}) == [("N", 8, 4, 4)]
    with pytest.raises(ShapeDerivationError, match="the input has 3 channels, the weight takes 4"):
        _one("Conv", [(1, 3, 9, 9), None], {1: w}, {"group": 2})
    with pytest.raises(ShapeDerivationError, match="8 output channels do not split into 3 groups"):
        _one("Conv", [(1, 6, 9, 9), None], {1: w}, {"group": 3})
    with pytest.raises(ShapeDerivationError, match="the bias has 5 values where 8 are expected"):
        _one("Conv", [(1, 4, 9, 9), None, None], {1: w, 2: np.zeros(5, np.float32)}, {"group": 2})
    with pytest.raises(ShapeDerivationError, match="does not fit"):
        _one("Conv", [(1, 4, 2, 2), None], {1: w}, {"group": 2})
    wt = np.zeros((4, 3, 3, 3), np.float32)  # ConvTranspose: [C, M / group, k, k]
    assert _one("ConvTranspose", [(1, 4, 5, 5), None], {1: wt}, {"strides": [2, 2]}) == [(1, 3, 11, 11)]
    assert _one("ConvTranspose", [(1, 4, 5, 5), None], {1: wt}, {"strides": [2, 2], "output_shape": [10, 10]}) \
        == [(1, 3, 10, 10)]


@pytest.mark.parametrize("x,target,attrs,expected", [
    ((2, 3, 4), [0, -1], {}, (2, 12)),
    ((2, 3, 4), [4, 0, -1], {}, (4, 3, 2)),
    ((0, 3), [0, 3], {"allowzero": 1}, (0, 3)),
    (("N", 3, 4), [0, -1], {}, ("N", 12)),
    (("N", 3, 4), [-1, 12], {}, ("N", 12)),
    (("N", 3, 4), [-1, 6], {}, (None, 6)),
    ((None, 1, 2, 64), [0, 0, -1], {}, (None, 1, 128)),  # a BiLSTM's output, T unknown: copied dims cancel
    ((None, None, 2, 64), [0, 0, -1], {}, (None, None, 128)),
    ((None, 3, 4), [-1, 0, 4], {}, (None, 3, 4)),  # -1 still stands for the unknown dim itself
])
def test_reshape_zero_and_minus_one(x, target, attrs, expected):
    assert _one("Reshape", [x, None], {1: np.array(target, np.int64)}, attrs) == [expected]


def test_reshape_errors_and_unknown_targets():
    with pytest.raises(ShapeDerivationError, match="cannot reshape"):
        _one("Reshape", [(2, 3), None], {1: np.array([4, -1], np.int64)})
    with pytest.raises(ShapeDerivationError, match="more than one -1"):
        _one("Reshape", [(2, 3), None], {1: np.array([-1, -1], np.int64)})
    assert _one("Reshape", [(2, 3), (3,)]) == [(None, None, None)]  # target from data: rank only


@pytest.mark.parametrize("starts,ends,axes,steps,expected", [
    ([1], [-1], [1], [1], (5, 8, 7)),
    ([-1], [-100], [1], [-1], (5, 10, 7)),  # negative step, end clamped to before the start
    ([8], [2], [1], [-2], (5, 3, 7)),
    ([100], [200], [2], [1], (5, 10, 0)),  # clamped to the dim: empty
    ([0, 1], [2**62, 5], [0, 2], [2, 3], (3, 10, 2)),
])
def test_slice_steps_and_clamping(starts, ends, axes, steps, expected):
    values = {k + 1: np.array(v, np.int64) for k, v in enumerate([starts, ends, axes, steps])}
    assert _one("Slice", [(5, 10, 7), None, None, None, None], values) == [expected]


def test_slice_keeps_a_symbol_it_takes_whole_and_forgets_one_it_cuts():
    values = {1: np.array([0, 1]), 2: np.array([2**63 - 1, 3]), 3: np.array([0, 1])}
    assert _one("Slice", [("N", "L"), None, None, None], values) == [("N", None)]
    assert _one("Slice", [("N", 8), (1,), (1,), None], {3: np.array([1])}) == [("N", None)]


def test_broadcasting_symbols_and_errors():
    assert _one("Add", [("N", 1, 4), (3, 1)]) == [("N", 3, 4)]
    assert _one("Add", [("N", 4), ("N", 4)]) == [("N", 4)]
    assert _one("Add", [("N", 4), (5, 4)]) == [(5, 4)]  # N with a fixed dim > 1 is that dim
    assert _one("Add", [("N", 4), ("M", 4)]) == [(None, 4)]
    assert _one("Where", [(1, 4), ("N", 1), (1,)]) == [("N", 4)]
    with pytest.raises(ShapeDerivationError, match=r"input shapes \[2, 3\], \[4, 3\] do not broadcast"):
        _one("Mul", [(2, 3), (4, 3)])
    with pytest.raises(ShapeDerivationError, match="inner dims"):
        _one("MatMul", [("B", 2, 3), (4, 5)])
    assert _one("MatMul", [("B", 2, 3), (3,)]) == [("B", 2)]
    with pytest.raises(ShapeDerivationError, match="differ on axis 0"):
        _one("Concat", [(2, 3), (4, 3)], attrs={"axis": 1})
    assert _one("Concat", [("N", 3), ("N", 5)], attrs={"axis": 1}) == [("N", 8)]


@pytest.mark.parametrize("inputs,values,attrs,opset,expected", [
    ([(1, 3, 4, 6), None, None], {2: np.array([1, 1, 0.5, 1.5], np.float32)}, {}, 13, (1, 3, 2, 9)),
    ([(1, 3, 4, 6), None, None, None], {3: np.array([1, 3, 8, 8], np.int64)}, {}, 13, (1, 3, 8, 8)),
    ([(1, 3, 4, 6), None, None, None], {3: np.array([8, 9], np.int64)}, {"axes": [2, 3]}, 18, (1, 3, 8, 9)),
    ([(1, 3, 4, 6), None, None, None], {3: np.array([2, 2], np.int64)},
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, 18, (1, 3, 1, 2)),
    ([(1, 3, 4, 6), None], {1: np.array([1, 1, 2, 2], np.float32)}, {}, 10, (1, 3, 8, 12)),
    ([("N", 3, "H", 6), None, (4,)], {}, {}, 13, ("N", 3, "H", 6)[:0] + (None,) * 4),
])
def test_resize_by_scales_and_sizes(inputs, values, attrs, opset, expected):
    assert _one("Resize", inputs, values, attrs, opset=opset) == [expected]
    if all(isinstance(d, int) for d in inputs[0]):  # what the kernel computes
        from optcli.ops.resize import resize

        x = np.zeros(inputs[0], np.float32)
        args = [x] + [values.get(k) for k in range(1, len(inputs))]
        assert resize(args, {**attrs, "_opset": opset})[0].shape == expected


def test_reductions_axes_from_attribute_or_input():
    assert _one("ReduceSum", [(2, 3, 4), None], {1: np.array([1])}, {"keepdims": 0}) == [(2, 4)]
    assert _one("ReduceMean", [(2, 3, 4)], attrs={"axes": [-1]}) == [(2, 3, 1)]
    assert _one("ReduceMax", [(2, 3, 4)], attrs={"keepdims": 0}) == [()]
    assert _one("ReduceSum", [(2, 3, 4), (1,)], attrs={"keepdims": 1}) == [(None, None, None)]
    with pytest.raises(ShapeDerivationError, match="reduced axis 3 is out of range"):
        _one("ReduceMean", [(2, 3, 4)], attrs={"axes": [3]})


def test_data_dependent_sizes_are_unknown_until_the_data_is_known():
    assert _one("NonZero", [(3, 4)]) == [(2, None)]
    assert _one("NonZero", [None], {0: np.array([[1, 0], [0, 1]])}) == [(2, 2)]  # small and known: evaluated
    assert _one("Range", [(), (), ()]) == [(None,)]
    assert _one("Range", [None, None, None], {0: np.array(0), 1: np.array(10), 2: np.array(3)}) == [(4,)]
    with pytest.raises(ShapeDerivationError, match="delta is 0"):
        _one("Range", [None, None, None], {0: np.array(0), 1: np.array(10), 2: np.array(0)})
    big = {0: np.array([1 << 20, 1 << 20], np.int64)}
    assert _one("ConstantOfShape", [None], big) == [(1 << 20, 1 << 20)]  # sized, never evaluated


def test_shape_values_carry_symbols_into_reshape_and_expand():
    nodes = [Node("Shape", ["x"], ["s"]), Node("Gather", ["s", "zero"], ["n"], {"axis": 0}),
             Node("Unsqueeze", ["n", "axes"], ["n1"]), Node("Concat", ["n1", "minus"], ["target"], {"axis": 0}),
             Node("Reshape", ["x", "target"], ["flat"]), Node("Expand", ["b", "s"], ["wide"])]
    consts = {"zero": np.array(0), "axes": np.array([0]), "minus": np.array([-1]),
              "b": np.zeros((1, 3, 1), np.float32)}
    shapes = derive_shapes(nodes, {"x": ("float32", ("N", 3, 8))}, consts, {"": 17}, ["flat"])
    assert shapes["flat"] == ("N", 24) and shapes["wide"] == ("N", 3, 8)


def test_unknown_ops_and_subgraphs_leave_their_outputs_unknown():
    nodes = [Node("Loop", ["m", "c"], ["y"], proto=b"\x00"), Node("Relu", ["y"], ["z"]),
             Node("SomeCustomOp", ["x"], ["u"], domain="vendor")]
    shapes = derive_shapes(nodes, {"x": ("float32", (2,)), "m": ("int64", ()), "c": ("bool", ())}, {}, {"": 17}, [])
    assert "y" not in shapes and "z" not in shapes and "u" not in shapes


def test_lenient_derivation_reports_the_first_problem_and_goes_on():
    problems: list[str] = []
    nodes = [Node("Add", ["a", "b"], ["c"], name="add"), Node("Relu", ["a"], ["r"], name="relu")]
    shapes = derive_shapes(nodes, {"a": ("float32", (2,)), "b": ("float32", (3,))}, {}, {"": 17}, [],
                           problems=problems)
    assert problems == ["(op_type:Add, node name: add): input shapes [2], [3] do not broadcast"]
    assert "c" not in shapes and shapes["r"] == (2,)


def test_every_op_with_a_kernel_has_a_shape_function():
    from optcli.gpu.registry import gpu_ops
    from optcli.ops.registry import registered_ops
    from optcli.ops.shape_functions import shape_fn_ops

    assert set(registered_ops()) | set(gpu_ops()) <= set(shape_fn_ops())
