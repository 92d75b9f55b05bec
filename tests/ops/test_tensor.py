"""Tensor kernels (shape ops, indexing, gather/scatter, casts) against onnxruntime on one-node models.

Every op whose attributes moved to inputs across ONNX versions is run in both forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from optcli.ops import kernels_for
from tests.helpers import OPSET, assert_matches, run_ort, single_node_model

RNG = np.random.default_rng(1)
I64 = np.int64


def check(op: str, inputs: dict, attrs: dict | None = None, opset: int = OPSET, n_outputs: int = 1,
          initializers: dict | None = None, input_names: list[str] | None = None,
          kernel_attrs: dict | None = None) -> list[np.ndarray]:
    """Run ``op`` in onnxruntime and through our kernel; outputs must agree in dtype, shape, value.

    ``kernel_attrs`` overrides what the kernel receives (for tensor attributes, which the node
    carries as TensorProto and the runtime hands over as numpy arrays).
    """
    model = single_node_model(op, inputs, n_outputs, attrs, initializers, opset, input_names)
    for o in model.graph.output:
        o.ClearField("type")  # onnxruntime rejects the UNDEFINED element type
    expected = run_ort(model, inputs)
    values = {**inputs, **(initializers or {})}
    names = input_names if input_names is not None else list(values)
    args = [np.asarray(values[n]) if n else None for n in names]
    for a in args:
        if a is not None:
            a.setflags(write=False)  # kernels must never write into their inputs
    k_attrs = {**(attrs or {}), **(kernel_attrs or {}), "_opset": opset}
    got = kernels_for(op)[0].fn(args, k_attrs)
    assert len(got) == len(expected), f"{op}: {len(got)} outputs, expected {len(expected)}"
    for g, e in zip(got, expected):
        assert_matches(g, e, op)
    return got


def rand(shape, dtype=np.float32) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-9, 10, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def ints(*v: int) -> np.ndarray:
    return np.array(v, dtype=I64)


# ----------------------------------------------------------------------------- shape ops

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_concat(axis, dtype):
    shapes = [[2, 3, 4] for _ in range(3)]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    check("Concat", {f"x{i}": rand(s, dtype) for i, s in enumerate(shapes)}, {"axis": axis})


@pytest.mark.parametrize("opset,attrs,inits,n", [
    (11, {"axis": 1, "split": [1, 3, 2]}, {}, 3),
    (11, {"axis": -2}, {}, 2),
    (13, {"axis": 1}, {"split": ints(4, 2)}, 2),
    (13, {"axis": 0}, {}, 2),
    (18, {"axis": 2, "num_outputs": 3}, {}, 3),  # 7 -> 3, 3, 1
    (18, {"axis": 1, "num_outputs": 2}, {}, 2),
])
def test_split(opset, attrs, inits, n):
    x = rand((4, 6, 7))
    check("Split", {"x": x}, attrs, opset, n_outputs=n, initializers=inits, kernel_attrs={"_n_outputs": n})


def test_split_returns_views():
    x = rand((4, 6))
    outs = kernels_for("Split")[0].fn([x, ints(2, 4)], {"axis": 1, "_opset": 13})
    assert all(np.shares_memory(o, x) for o in outs)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, 10], [0, 2], [1, 2]),
    ([-1], [-1000], [1], [-1]),  # full reverse with clamping
    ([10], [0], [-1], [-2]),
    ([0, 1], [2**62, -1], None, None),
    ([-3], [2**62], [0], [1]),
    ([2], [1], [0], [1]),  # empty
])
def test_slice(starts, ends, axes, steps):
    x = rand((4, 5, 6))
    inits = {"starts": ints(*starts), "ends": ints(*ends)}
    names = ["x", "starts", "ends"]
    if axes is not None:
        inits["axes"] = ints(*axes)
        names.append("axes")
    if steps is not None:
        inits["steps"] = ints(*steps)
        names.append("steps")
    check("Slice", {"x": x}, initializers=inits, input_names=names, opset=13)


@pytest.mark.parametrize("attrs", [
    {"starts": [1, 0], "ends": [3, 100]},
    {"starts": [-2], "ends": [1000], "axes": [2]},
    {"starts": [0, 1], "ends": [-1, -1], "axes": [-1, 1]},
])
def test_slice_attrs_opset9(attrs):
    check("Slice", {"x": rand((4, 5, 6))}, attrs, opset=9)


def test_slice_is_view():
    x = rand((4, 5))
    y = kernels_for("Slice")[0].fn([x, ints(1), ints(3), ints(1), None], {"_opset": 13})[0]
    assert np.shares_memory(y, x)


@pytest.mark.parametrize("shape,allowzero,opset", [
    ((0, -1), 0, 13), ((2, 0, -1), 0, 13), ((-1,), 0, 5), ((4, 3, 5, 1), 0, 5), ((3, 0, 2), 1, 14),
])
def test_reshape(shape, allowzero, opset):
    x = rand((4, 3, 5)) if not allowzero else rand((3, 0, 2))
    attrs = {"allowzero": allowzero} if opset >= 14 else None
    check("Reshape", {"x": x}, attrs, opset, initializers={"shape": ints(*shape)})


def test_reshape_is_view():
    x = rand((4, 6))
    assert np.shares_memory(kernels_for("Reshape")[0].fn([x, ints(2, -1)], {"_opset": 13})[0], x)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 3])
def test_flatten(axis):
    check("Flatten", {"x": rand((2, 3, 4))}, {"axis": axis})


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    check("Transpose", {"x": rand((2, 3, 4))}, {"perm": perm} if perm else None)


@pytest.mark.parametrize("axes,opset", [([0, -1], 11), ([2], 11), (None, 11), ([0, -1], 13), (None, 13)])
def test_squeeze(axes, opset):
    x = rand((1, 3, 1, 1))
    if axes is None:
        check("Squeeze", {"x": x}, opset=opset)
    elif opset < 13:
        check("Squeeze", {"x": x}, {"axes": axes}, opset)
    else:
        check("Squeeze", {"x": x}, opset=opset, initializers={"axes": ints(*axes)})


@pytest.mark.parametrize("axes,opset", [([0, 3], 11), ([-1, 0], 11), ([4, 1], 13), ([-1, -3], 13), ([0], 13)])
def test_unsqueeze(axes, opset):
    x = rand((2, 3, 4))
    if opset < 13:
        check("Unsqueeze", {"x": x}, {"axes": axes}, opset)
    else:
        check("Unsqueeze", {"x": x}, opset=opset, initializers={"axes": ints(*axes)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 2, 1], [1, 0, -1, 0, 2, 2]])
def test_pad(mode, pads):
    x = rand((3, 4, 5))
    inits = {"pads": ints(*pads)}
    if mode == "constant":
        inits["value"] = np.array(1.5, np.float32)
    check("Pad", {"x": x}, {"mode": mode}, 13, initializers=inits)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_attrs_opset2(mode):
    attrs = {"mode": mode, "pads": [0, 1, 2, 0, 1, 1]}
    if mode == "constant":
        attrs["value"] = -2.0
    check("Pad", {"x": rand((3, 4, 5))}, attrs, opset=10)


def test_pad_axes_and_wrap():
    x = rand((3, 4, 5))
    check("Pad", {"x": x}, {"mode": "constant"}, 18, initializers={"pads": ints(1, 2, 3, 0), "value":
          np.array(0.5, np.float32), "axes": ints(-1, 0)})
    check("Pad", {"x": x}, {"mode": "wrap"}, 19, initializers={"pads": ints(0, 2, 3, 0, 4, 1)})
    check("Pad", {"x": rand((3, 4), I64)}, {"mode": "constant"}, 13, initializers={"pads": ints(1, 1, 0, 2)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check("DepthToSpace", {"x": rand((2, 8, 3, 4))}, {"blocksize": 2, "mode": mode})


def test_space_to_depth():
    check("SpaceToDepth", {"x": rand((2, 3, 4, 6))}, {"blocksize": 2})


@pytest.mark.parametrize("xshape,shape", [
    ((3, 1), (2, 1, 4)), ((2, 3), (3,)), ((4, 1), (1, 1)), ((), (2, 2)),
])
def test_expand(xshape, shape):
    check("Expand", {"x": rand(xshape)}, initializers={"shape": ints(*shape)})


def test_tile():
    check("Tile", {"x": rand((2, 3), I64)}, initializers={"repeats": ints(2, 3)})


# ----------------------------------------------------------------------------- indexing

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx", [
    np.array([[0, -1], [2, 1]], I64), np.array(-2, I64), np.array([1, 0], np.int32),
])
def test_gather(axis, idx):
    check("Gather", {"x": rand((3, 4, 5))}, {"axis": axis}, initializers={"idx": idx})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = rand((3, 4))
    idx = RNG.integers(-3, 3, size=(2, 3)).astype(I64)
    check("GatherElements", {"x": x}, {"axis": axis}, initializers={"idx": idx})


@pytest.mark.parametrize("batch_dims,ishape", [
    (0, (2, 2)), (0, (3, 1)), (0, (2, 3)), (1, (2, 1)), (1, (2, 2, 2)),
])
def test_gather_nd(batch_dims, ishape):
    x = rand((2, 3, 4))
    dims = x.shape[batch_dims:]
    idx = np.stack([RNG.integers(-dims[j], dims[j], size=ishape[:-1]) for j in range(ishape[-1])], -1)
    check("GatherND", {"x": x}, {"batch_dims": batch_dims}, initializers={"idx": idx.astype(I64)})


@pytest.mark.parametrize("reduction,opset", [
    ("none", 16), ("add", 16), ("mul", 16), ("max", 18), ("min", 18),
])
def test_scatter_elements(reduction, opset):
    data = rand((3, 5))
    idx = np.array([[1, -1, 2], [0, 0, -5]], I64)  # duplicates only meet with a reduction
    if reduction == "none":
        idx = np.array([[1, -1, 2], [0, 3, -5]], I64)
    check("ScatterElements", {"data": data}, {"axis": 1, "reduction": reduction}, opset,
          initializers={"idx": idx, "updates": rand((2, 3))})


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_nd(reduction):
    data = rand((4, 3, 2))
    idx = np.array([[1], [3], [0]] if reduction == "none" else [[1], [3], [1]], I64)
    check("ScatterND", {"data": data}, {"reduction": reduction}, 16,
          initializers={"idx": idx, "updates": rand((3, 3, 2))})
    idx2 = np.array([[0, 1], [2, 2]], I64)
    check("ScatterND", {"data": data}, {"reduction": reduction}, 16,
          initializers={"idx": idx2, "updates": rand((2, 2))})
    # a batch of index rows with negative coordinates, and all three coordinates (single elements)
    idx3 = np.array([[[-1, 0], [2, -3]], [[0, -1], [-4, 2]]], I64)
    check("ScatterND", {"data": data}, {"reduction": reduction}, 16,
          initializers={"idx": idx3, "updates": rand((2, 2, 2))})
    idx4 = np.array([[3, 2, 1], [-4, -3, -2]], I64)
    check("ScatterND", {"data": data}, {"reduction": reduction}, 16,
          initializers={"idx": idx4, "updates": rand((2,))})


def test_scatter_nd_few_rows_match_the_fancy_indexing_path():
    """Up to 32 index values take the per-row assignment, more take numpy's fancy indexing: the
    same distinct indices (negative ones too) give the same result, and the input is never written."""
    from optcli.ops.tensor import scatter_nd

    data = rand((6, 5, 4))
    data.setflags(write=False)
    cells = RNG.permutation(30)[:20]
    idx = np.stack([cells // 5, cells % 5], axis=1).astype(I64)
    idx[::3] -= np.array([6, 5], I64)  # the same cells counted from the end
    updates = rand((20, 4))
    few = [scatter_nd([data, idx[k:k + 4], updates[k:k + 4]], {})[0] for k in range(0, 20, 4)]  # 8 values each
    many = scatter_nd([data, idx, updates], {})[0]  # 40 values: the general path
    merged = data.copy()
    for k, part in zip(range(0, 20, 4), few):
        rows = idx[k:k + 4]
        merged[rows[:, 0], rows[:, 1]] = part[rows[:, 0], rows[:, 1]]
    np.testing.assert_array_equal(merged, many)
    with pytest.raises(IndexError):
        scatter_nd([data, np.array([[6, 0]], I64), rand((1, 4))], {})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk(largest, axis):
    x = RNG.integers(0, 4, size=(6, 7)).astype(np.float32)  # many ties: lower index must come first
    check("TopK", {"x": x}, {"axis": axis, "largest": largest}, 11, n_outputs=2, initializers={"k": ints(3)})


def test_topk_opset1_and_int():
    check("TopK", {"x": rand((4, 5))}, {"k": 2}, 1, n_outputs=2)
    check("TopK", {"x": rand((4, 5), I64)}, {"axis": 1}, 11, n_outputs=2, initializers={"k": ints(5)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 0), (1, 1, 1), (-2, 0, 1)])
def test_arg(op, axis, keepdims, last):
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(np.float32)
    check(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last}, 13)


def test_nonzero():
    check("NonZero", {"x": (rand((3, 4)) > 0).astype(np.float32)})
    check("NonZero", {"x": rand((5,), I64)})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    idx = np.array([[0, 2, -1], [4, -5, 1]], I64)
    check("OneHot", {"idx": idx}, {"axis": axis}, 11,
          initializers={"depth": np.array(5, I64), "values": np.array([-1.0, 2.0], np.float32)})
    check("OneHot", {"idx": idx.astype(np.float32)}, {"axis": axis}, 11,
          initializers={"depth": np.array([4.0], np.float32), "values": np.array([0, 3], np.float32)})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum(exclusive, reverse, axis):
    for dtype in (np.float32, I64):
        check("CumSum", {"x": rand((3, 4), dtype)}, {"exclusive": exclusive, "reverse": reverse},
              initializers={"axis": np.array(axis, I64)})


# ----------------------------------------------------------------------------- shape, cast, constants

@pytest.mark.parametrize("attrs", [None, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 3}])
def test_shape(attrs):
    check("Shape", {"x": rand((2, 3, 4))}, attrs, opset=15 if attrs else 13)


def test_size_identity():
    check("Size", {"x": rand((2, 3, 4))})
    check("Identity", {"x": rand((2, 3), I64)})


@pytest.mark.parametrize("to", [TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16,
                                TensorProto.DOUBLE, TensorProto.UINT8, TensorProto.FLOAT])
@pytest.mark.parametrize("opset", [13, 19])
def test_cast(to, opset):
    x = np.array([[-2.7, -0.5, 0.0, 0.5, 1.5, 2.7, 100.2]], np.float32)
    check("Cast", {"x": np.abs(x) if to == TensorProto.UINT8 else x}, {"to": to}, opset)
    check("Cast", {"x": np.array([0, 3, -4], I64)}, {"to": to}, opset)


def test_cast_like():
    check("CastLike", {"x": rand((3, 4))}, initializers={"like": np.zeros(1, I64)}, opset=15)
    like = {"like": np.zeros(1, np.float32)}
    check("CastLike", {"x": np.array([True, False])}, initializers=like, opset=15)


@pytest.mark.parametrize("attr,value", [
    ("value_float", 1.5), ("value_floats", [1.0, 2.5]), ("value_int", 3), ("value_ints", [1, -2, 3]),
])
def test_constant_scalar_attrs(attr, value):
    check("Constant", {}, {attr: value}, opset=13)


def test_constant_tensor():
    v = rand((2, 3), I64)
    check("Constant", {}, {"value": numpy_helper.from_array(v)}, kernel_attrs={"value": v})


@pytest.mark.parametrize("value", [None, np.array([7], I64), np.array([0.25], np.float32)])
def test_constant_of_shape(value):
    attrs = None if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", {}, attrs, initializers={"shape": ints(2, 3)},
          kernel_attrs=None if value is None else {"value": value})


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 10, 3, I64), (10, 2, -3, I64), (1, 1, 1, I64), (0, 5, 1, np.int32),
    (0.5, 3.0, 0.7, np.float32), (2.0, -1.0, -0.5, np.float32),
])
def test_range(start, limit, delta, dtype):
    check("Range", {}, initializers={k: np.array(v, dtype) for k, v in
                                     {"start": start, "limit": limit, "delta": delta}.items()})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 1, -2])
def test_trilu(upper, k):
    inits = {} if k is None else {"k": np.array(k, I64)}
    check("Trilu", {"x": rand((2, 4, 5))}, {"upper": upper}, 14, initializers=inits)


def test_cast_string_roundtrip():
    x = np.array([1.5, -2.0, 3.25], np.float32)
    s = kernels_for("Cast")[0].fn([x], {"to": TensorProto.STRING, "_opset": 13})[0]
    back = kernels_for("Cast")[0].fn([s], {"to": TensorProto.FLOAT, "_opset": 13})[0]
    np.testing.assert_array_equal(back, x)
