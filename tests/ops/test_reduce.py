"""Reduce* kernels against onnxruntime: axes as attribute (old opsets) and as input (new), keepdims,
noop_with_empty_axes, negative axes, integer inputs, and the empty-set identities."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.ops import kernels_for
from tests.helpers import assert_matches, run_ort, single_node_model

RNG = np.random.default_rng(2)
OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
# Opset where `axes` became an input: ReduceSum at 13, the others at 18.
AXES_INPUT = {op: 13 if op == "ReduceSum" else 18 for op in OPS}


def check(op: str, x: np.ndarray, axes: list[int] | None, opset: int, **attrs) -> np.ndarray:
    as_input = opset >= AXES_INPUT[op]
    inits = {"axes": np.array(axes, np.int64)} if as_input and axes is not None else {}
    node_attrs = dict(attrs)
    if not as_input and axes is not None:
        node_attrs["axes"] = axes
    model = single_node_model(op, {"x": x}, 1, node_attrs, inits, opset)
    for o in model.graph.output:
        o.ClearField("type")  # onnxruntime rejects the UNDEFINED element type
    expected = run_ort(model, {"x": x})[0]
    x = x.copy()
    x.setflags(write=False)
    args = [x] + list(inits.values())
    got = kernels_for(op)[0].fn(args, {**node_attrs, "_opset": opset})[0]
    assert_matches(got, expected, op)
    return got


def data(op: str, dtype=np.float32) -> np.ndarray:
    if np.dtype(dtype).kind == "i":
        return RNG.integers(1, 4, size=(2, 3, 4)).astype(dtype)
    if op in ("ReduceLogSum", "ReduceProd"):
        return RNG.uniform(0.5, 1.5, size=(2, 3, 4)).astype(dtype)
    return RNG.standard_normal((2, 3, 4)).astype(dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [None, [1], [0, 2], [-1], [-3, -1]])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("form", ["attr", "input"])
def test_reduce(op, axes, keepdims, form):
    opset = AXES_INPUT[op] if form == "input" else AXES_INPUT[op] - 2
    check(op, data(op), axes, opset, keepdims=keepdims)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                                "ReduceL1", "ReduceMean"])
def test_reduce_int64(op):
    check(op, data(op, np.int64), [1], AXES_INPUT[op], keepdims=0)
    check(op, data(op, np.int64), None, AXES_INPUT[op], keepdims=1)


@pytest.mark.parametrize("op", OPS)
def test_noop_with_empty_axes(op):
    x = data(op)
    opset = AXES_INPUT[op]
    check(op, x, None, opset, noop_with_empty_axes=1)
    check(op, x, [], opset, noop_with_empty_axes=0)


@pytest.mark.parametrize("op,value", [
    ("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceMin", np.inf),
    ("ReduceL1", 0.0), ("ReduceL2", 0.0), ("ReduceSumSquare", 0.0), ("ReduceLogSum", -np.inf),
    ("ReduceLogSumExp", -np.inf),
])
def test_empty_set(op, value):
    x = np.zeros((2, 0, 4), np.float32)
    y = kernels_for(op)[0].fn([x, np.array([1], np.int64)], {"keepdims": 1, "_opset": 18})[0]
    assert y.shape == (2, 1, 4) and y.dtype == np.float32
    np.testing.assert_array_equal(y, np.full((2, 1, 4), value, np.float32))


def test_empty_set_int_max():
    x = np.zeros((0, 3), np.int32)
    y = kernels_for("ReduceMax")[0].fn([x, np.array([0], np.int64)], {"keepdims": 0, "_opset": 18})[0]
    np.testing.assert_array_equal(y, np.full(3, np.iinfo(np.int32).min, np.int32))


def test_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]], np.float32)
    y = kernels_for("ReduceLogSumExp")[0].fn([x, np.array([1], np.int64)], {"keepdims": 0, "_opset": 18})[0]
    np.testing.assert_allclose(y, [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 1, 16), (2, 2, 3)])
@pytest.mark.parametrize("axes,keepdims", [((2,), 0), ((1, 2), 1), ((0,), 0), ((-1,), 1), ((0, 1, 2), 0)])
def test_bound_small_mean_remembers_its_axes(axes, keepdims, shape):
    """A bound ReduceMean step of fixed axes on a small float32 input remembers its axes and shape
    (one sum and one division a run; in Python floats for a tiny input's trailing axes): the same
    values as numpy's mean, run after run, quiet on inf - inf; a new shape or axes given as an
    input go the general way."""
    import warnings

    from optcli.ops.evaluate import kernel_attrs

    fn = next(k for k in kernels_for("ReduceMean") if k.applies is None).fn
    attrs = kernel_attrs({"axes": list(axes), "keepdims": keepdims}, 1, {"": 13})
    x = RNG.standard_normal(shape).astype(np.float32)
    want = np.mean(x.astype(np.float64), axis=axes, keepdims=bool(keepdims)).astype(np.float32)
    first = fn([x], attrs)[0]
    assert "small mean" in attrs.memo
    trailing = sorted(a % 3 for a in axes) == list(range(3 - len(axes), 3))
    assert (attrs.memo["small mean"][4] is not None) == (trailing and x.size <= 64)  # the Python-float path
    for _ in range(2):
        got = fn([x], attrs)[0]
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got, first)
    wide = [a % 3 for a in axes if shape[a] >= 2]
    if wide:
        y = x.copy()
        first_two = [slice(None)] * 3
        first_two[wide[0]] = slice(0, 2)  # inf and -inf meet in a reduced row
        y[tuple(first_two)] = np.array([np.inf, -np.inf], np.float32).reshape([-1 if i == wide[0] else 1
                                                                                for i in range(3)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert np.isnan(fn([y], attrs)[0]).any()
    other = RNG.standard_normal((3, 2, 5)).astype(np.float32)
    np.testing.assert_allclose(fn([other], attrs)[0], np.mean(other, axis=axes, keepdims=bool(keepdims)),
                               rtol=1e-6, atol=1e-7)
    by_input = kernel_attrs({"keepdims": keepdims}, 1, {"": 18})
    for ax in ((2,), (0,)):  # axes as an input: never remembered, each run's own
        got = fn([x, np.array(ax, np.int64)], by_input)[0]
        np.testing.assert_allclose(got, np.mean(x, axis=ax, keepdims=bool(keepdims)), rtol=1e-6, atol=1e-7)
    assert "small mean" not in by_input.memo
