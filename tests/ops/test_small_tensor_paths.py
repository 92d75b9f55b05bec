"""The small-tensor paths a Loop body runs every iteration (issue 24's decoder): the per-step memos of
the shape ops and OneHot (which must follow each call's shapes and arguments, never leak one call's
answer into another's), and the numpy paths of a one-row FullyConnected, a float32 Softmax, a
small tanh/sigmoid epilogue and a few-row ScatterND, each against the plain reference."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.ops.activation import activate, apply_activation
from optcli.ops.evaluate import kernel_attrs
from optcli.ops.gemm import fully_connected
from optcli.ops.normalization import softmax
from optcli.ops.tensor import argmax, argmin, one_hot, reshape, scatter_nd, split, squeeze, transpose, unsqueeze


def _bound(attrs: dict, n_outputs: int = 1):
    return kernel_attrs(attrs, n_outputs, {"": 17})


def test_shape_op_memos_follow_the_input_shape_and_the_axes():
    axes = np.array([1], np.int64)
    un, sq, rs = _bound({}), _bound({}), _bound({})
    for _ in range(2):  # the second round runs from the memo
        for shape in [(2, 3), (4, 5, 6), (1,)]:
            x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
            assert unsqueeze([x, axes], un)[0].shape == (shape[0], 1, *shape[1:])
            assert squeeze([unsqueeze([x, axes], un)[0], axes], sq)[0].shape == shape
            assert reshape([x, np.array([0, -1], np.int64)], rs)[0].shape == (shape[0], x.size // shape[0])
    x = np.zeros((2, 3), np.float32)
    other = np.array([0], np.int64)  # another axes array (same shape and dtype): read, not the memo's answer
    assert unsqueeze([x, other], un)[0].shape == (1, 2, 3)
    assert squeeze([np.zeros((1, 2, 3), np.float32), other], sq)[0].shape == (2, 3)
    assert reshape([x, np.array([3, 2], np.int64)], rs)[0].shape == (3, 2)
    with pytest.raises(ValueError):  # squeezing a dim that is not 1 is still refused after a memo hit
        squeeze([np.zeros((2, 3), np.float32), other], sq)


def test_split_memo_follows_the_input_shape_and_the_sizes():
    attrs = _bound({"axis": 1}, n_outputs=2)
    for _ in range(2):
        for width, sizes in ((6, [2, 4]), (5, [1, 4])):
            x = np.arange(2 * width, dtype=np.float32).reshape(2, width)
            s = np.array(sizes, np.int64)
            got = split([x, s], attrs)
            assert [g.shape[1] for g in got] == sizes
            np.testing.assert_array_equal(np.concatenate(got, axis=1), x)
    no_sizes = _bound({"axis": 0}, n_outputs=2)
    for rows in (4, 6):
        assert [g.shape[0] for g in split([np.zeros((rows, 2)), None], no_sizes)] == [rows // 2] * 2


def _one_hot_reference(idx, depth, off, on, axis=-1):
    idx = np.asarray(idx).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    out = np.where(idx[..., None] == np.arange(depth), on, off).astype(np.float32)
    return np.moveaxis(out, -1, axis)


def test_one_hot_memo_follows_depth_and_values():
    attrs = _bound({"axis": -1})
    values = np.array([0.0, 1.0], np.float32)
    for _ in range(2):
        for depth in (5, 3):
            d = np.array([depth], np.int64)
            for idx in ([1], [-1, 2, 7, -9], [[0, 2], [1, -2]], np.array([1.7, -1.2], np.float32)):
                got = one_hot([np.asarray(idx), d, values], attrs)[0]
                np.testing.assert_array_equal(got, _one_hot_reference(idx, depth, 0.0, 1.0))
    swapped = np.array([3.0, -2.0], np.float32)  # other values, the same depth array: read again
    d = np.array([4], np.int64)
    one_hot([np.array([1]), d, values], attrs)
    np.testing.assert_array_equal(one_hot([np.array([1, 9]), d, swapped], attrs)[0],
                                  _one_hot_reference([1, 9], 4, 3.0, -2.0))
    np.testing.assert_array_equal(one_hot([np.arange(40) % 7 - 3, d, values], attrs)[0],  # the numpy path
                                  _one_hot_reference(np.arange(40) % 7 - 3, 4, 0.0, 1.0))
    np.testing.assert_array_equal(one_hot([np.array([[1, 0]]), d, values], _bound({"axis": 0}))[0],
                                  _one_hot_reference([[1, 0]], 4, 0.0, 1.0, axis=0))


def test_scatter_nd_few_rows_checks_and_counts_from_the_end():
    data = np.zeros((1, 4, 3), np.float32)
    upd = np.ones((1, 3), np.float32)
    attrs = _bound({})
    for row in ([0, 2], [0, -1], [-1, -4]):
        got = scatter_nd([data, np.array([row], np.int64), upd], attrs)[0]
        want = data.copy()
        want[tuple(row)] = 1.0
        np.testing.assert_array_equal(got, want)
    assert not data.any()  # the input is never written
    for bad in ([0, 4], [1, 0], [0, -5]):
        with pytest.raises(IndexError):
            scatter_nd([data, np.array([bad], np.int64), upd], attrs)
    got = scatter_nd([data, np.array([[0, 1], [0, 3]], np.int32), np.full((2, 3), 2.0, np.float32)], attrs)[0]
    assert got[0, 1].tolist() == got[0, 3].tolist() == [2.0] * 3 and got.sum() == 12.0


def test_one_hot_off_value_keeps_its_sign_and_nan():
    """The off value 0 fills by np.zeros: a -0 off value (its sign bit) or a NaN is still written."""
    for off in (0.0, -0.0, np.nan, 2.5):
        values = np.array([off, 1.0], np.float32)
        got = one_hot([np.array([2, -1, 7]), np.array([4], np.int64), values], _bound({"axis": -1}))[0]
        want = _one_hot_reference([2, -1, 7], 4, off, 1.0)
        np.testing.assert_array_equal(got, want)
        assert np.signbit(got).tolist() == np.signbit(want).tolist()


def test_scatter_nd_one_row_shapes():
    """One index row: an index of every length up to the rank (the update a row, a plane, one
    element), int32 and int64, rank-1 indices, a negative index, out of range refused, the input
    never written; each as the general path gives it."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((2, 5, 3)).astype(np.float32)
    data.setflags(write=False)
    attrs = _bound({})
    for idx in ([[1]], [[1, -2]], [[-2, 4, 2]], [1, 3], [0], [[0, 0, -3]]):
        for dtype in (np.int64, np.int32):
            raw = np.array(idx, dtype)
            k = raw.shape[-1]
            upd = rng.standard_normal(raw.shape[:-1] + data.shape[k:]).astype(np.float32)
            got = scatter_nd([data, raw, upd], attrs)[0]
            want = data.copy()
            want[tuple(raw.reshape(-1).tolist())] = upd.reshape(data.shape[k:])
            np.testing.assert_array_equal(got, want)
    for bad in ([[2, 0]], [[0, 5]], [[-3]], [[0, 0, 3]]):
        with pytest.raises(IndexError):
            scatter_nd([data, np.array(bad, np.int64), np.zeros(data.shape[len(bad[0]):], np.float32)[None]],
                       attrs)


@pytest.mark.parametrize("shape,perm", [((1, 64, 1), [0, 2, 1]), ((2, 3, 5), None), ((2, 3, 5), [2, 0, 1]),
                                        ((7,), [0]), ((), [])])
def test_transpose_matches_numpy(shape, perm):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    got = transpose([x], _bound({} if perm is None else {"perm": perm}))[0]
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    assert got.shape == np.transpose(x, perm).shape
    if perm is not None and len(perm) > 1:
        with pytest.raises(ValueError):
            transpose([x], _bound({"perm": perm[:-1]}))


@pytest.mark.parametrize("shape,axis", [((1, 30), 1), ((1, 64, 1), 1), ((2, 3, 5), -1), ((2, 3, 5), 0),
                                        ((1, 1024), 1), ((1, 4000), -1)])
def test_float32_softmax_matches_the_reference(shape, axis):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 10
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    want = e / e.sum(axis=axis, keepdims=True)
    got = softmax([x], _bound({"axis": axis}))[0]
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.shares_memory(got, x)


def test_long_row_softmax_sums_to_one():
    """A long row (a vocabulary) is summed by numpy's pairwise reduction, not the dot product with
    ones that short rows take: float32 accumulation there drifts ~1e-6 at 1e5 elements."""
    x = (np.random.default_rng(2).standard_normal((1, 300_000)) * 3).astype(np.float32)
    got = softmax([x], _bound({"axis": 1}))[0]
    assert abs(got.astype(np.float64).sum() - 1.0) < 3e-7


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("shape", [(1, 30), (1, 64, 1), (1, 3000)])
def test_one_row_softmax_of_a_nan_or_inf_is_all_nan(shape, bad):
    """A row holding a NaN, or +inf (inf - inf), is NaN everywhere, as the general path makes it,
    wherever the bad value sits (the row's max is the element argmax points at)."""
    for at in (0, -1):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        x.reshape(-1)[at] = bad
        with np.errstate(invalid="ignore"):
            got = softmax([x], _bound({"axis": 1}))[0]
        assert np.isnan(got).all(), f"{bad} at {at}"


@pytest.mark.parametrize("name", ["tanh", "sigmoid"])
def test_small_epilogue_matches_the_reference_at_the_extremes(name):
    x = np.array([-1e4, -100.0, -88.5, -20.0, -1.0, -1e-8, 0.0, 1e-8, 3.0, 20.0, 100.0, 1e4, np.nan], np.float32)
    want = apply_activation(x.astype(np.float64), name)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow warning from the small path
        got = activate(x.copy(), name)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-37)


@pytest.mark.parametrize("xshape", [(1, 7), (7,), (1, 1, 7)])
@pytest.mark.parametrize("bias", [None, "flat", "row"])
@pytest.mark.parametrize("activation", [None, "sigmoid", "relu"])
def test_one_row_fully_connected(xshape, bias, activation):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((7, 5)).astype(np.float32)
    b = None if bias is None else rng.standard_normal(5 if bias == "flat" else (1, 5)).astype(np.float32)
    attrs = _bound({} if activation is None else {"activation": activation})
    want = x.astype(np.float64) @ w + (0 if b is None else b.reshape(-1))
    want = apply_activation(want, activation)
    got = fully_connected([x, w, b], attrs)[0]
    assert got.shape == xshape[:-1] + (5,) and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5, atol=1e-6)


def test_small_fully_connected_memo_follows_weights_bias_and_rows():
    """A bound step keeps its small-layer function while the same weight and bias arrays come back;
    other arrays (of another width), other row counts and a float64 X are each computed afresh."""
    rng = np.random.default_rng(2)
    attrs = _bound({"activation": "tanh"})
    for w_cols, rows in ((5, (1,)), (5, (3, 2)), (9, (1,)), (9, ())):
        w = rng.standard_normal((4, w_cols)).astype(np.float32)
        b = rng.standard_normal(w_cols).astype(np.float32)
        x = rng.standard_normal((*rows, 4)).astype(np.float32)
        for _ in range(2):
            got = fully_connected([x, w, b], attrs)[0]
            np.testing.assert_allclose(got, np.tanh(x.astype(np.float64) @ w + b), rtol=1e-5, atol=1e-6)
            assert got.shape == (*rows, w_cols) and got.dtype == np.float32
    x64 = rng.standard_normal((1, 4))
    assert fully_connected([x64, w, b], attrs)[0].dtype == np.float64
    assert fully_connected([x, w, None], attrs)[0].shape == (w_cols,)


@pytest.mark.parametrize("kernel,fn", [(argmax, np.argmax), (argmin, np.argmin)])
def test_arg_kernels_give_int64_arrays(kernel, fn):
    """ArgMax/ArgMin through the array's own method: a 1-D input's answer is still a 0-d int64 array
    (the method gives a numpy scalar there); keepdims and select_last_index as before."""
    x = np.array([3.0, 1.0, 3.0, 1.0], np.float32)
    for keep, last, want_shape in ((0, 0, ()), (1, 0, (1,)), (0, 1, ())):
        got = kernel([x], {"axis": 0, "keepdims": keep, "select_last_index": last})[0]
        assert type(got) is np.ndarray and got.dtype == np.int64 and got.shape == want_shape
        assert int(got.reshape(-1)[0]) == (len(x) - 1 - fn(x[::-1]) if last else fn(x))
    m = np.random.default_rng(4).standard_normal((2, 3, 5)).astype(np.float32)
    for axis in (-1, 0, 1):
        got = kernel([m], _bound({"axis": axis, "keepdims": 1}))[0]
        np.testing.assert_array_equal(got, np.expand_dims(fn(m, axis=axis), axis))


def test_memos_read_a_refilled_array_again():
    """A writable argument array may come back holding other values (a caller refilling its input
    between runs): the memos compare its contents; a read-only one (a plan's constant) is trusted
    by identity."""
    x = np.zeros((2, 3), np.float32)
    shape = np.array([3, 2], np.int64)
    rs, un, oh = _bound({}), _bound({}), _bound({"axis": -1})
    assert reshape([x, shape], rs)[0].shape == (3, 2)
    shape[:] = [6, 1]
    assert reshape([x, shape], rs)[0].shape == (6, 1)
    axes = np.array([0], np.int64)
    assert unsqueeze([x, axes], un)[0].shape == (1, 2, 3)
    axes[0] = 2
    assert unsqueeze([x, axes], un)[0].shape == (2, 3, 1)
    depth, values = np.array([3], np.int64), np.array([0.0, 1.0], np.float32)
    assert one_hot([np.array([1]), depth, values], oh)[0].shape == (1, 3)
    depth[0], values[1] = 5, 7.0
    np.testing.assert_array_equal(one_hot([np.array([1]), depth, values], oh)[0], [[0, 7, 0, 0, 0]])
    frozen = np.array([2, 3], np.int64)
    frozen.flags.writeable = False
    assert reshape([x, frozen], rs)[0].shape == (2, 3) == reshape([x, frozen], rs)[0].shape


def test_layer_norm_memo_follows_shape_weights_and_outputs():
    """A bound LayerNormalization on float32 rows keeps its native call per input shape (read-only
    scale and bias: a plan's constants): each call against the numpy reference, the statistics made
    only where the step names them, another shape or a writable (refillable) scale read anew."""
    from optcli import native
    from optcli.ops.normalization import layer_normalization

    if not native.available():
        pytest.skip(native.status())
    rng = np.random.default_rng(5)
    scale, bias = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    scale.setflags(write=False)
    bias.setflags(write=False)
    one, three = _bound({"axis": -1, "epsilon": 1e-5}), _bound({"axis": -2, "epsilon": 1e-5}, 3)
    for _ in range(2):  # the second round runs from the memo
        for shape in [(2, 3, 24), (5, 24)]:
            x = rng.standard_normal(shape).astype(np.float32)
            want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * scale + bias
            got = layer_normalization([x, scale, bias], one)
            assert len(got) == 1
            np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
        x = rng.standard_normal((2, 4, 6)).astype(np.float32)  # axis -2: rows of 24 over the last two axes
        y, mean, inv = layer_normalization([x, scale.reshape(4, 6), bias.reshape(4, 6)], three)
        flat = x.reshape(2, 24)
        np.testing.assert_allclose(mean.reshape(2), flat.mean(-1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(inv.reshape(2), 1 / np.sqrt(flat.var(-1) + 1e-5), rtol=1e-5)
        assert mean.shape == inv.shape == (2, 1, 1) and y.shape == x.shape
    other = (scale * 3).astype(np.float32)  # another constant scale, same shape: not the memo's call
    other.setflags(write=False)
    x = rng.standard_normal((2, 3, 24)).astype(np.float32)
    np.testing.assert_allclose(layer_normalization([x, other, bias], one)[0] - bias,
                               3 * (layer_normalization([x, scale, bias], one)[0] - bias), rtol=1e-4, atol=1e-5)
    refill = np.ones(24, np.float32)
    first = layer_normalization([x, refill, None], one)[0]
    refill[:] = 2.0
    np.testing.assert_allclose(layer_normalization([x, refill, None], one)[0], 2 * first, rtol=1e-6)


@pytest.mark.parametrize("src", [np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("to", [1, 7, 9, 10, 11])  # float, int64, bool, float16, double
def test_cast_from_integers_matches_numpy(src, to):
    from onnx import helper

    from optcli.ops.tensor import cast

    x = np.array([[0, 1, 5], [200, 3, 7]]).astype(src)
    attrs = _bound({"to": to})
    want = x.astype(helper.tensor_dtype_to_np_dtype(to))
    for _ in range(2):  # the second call reads the target type from the memo
        got = cast([x], attrs)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    f = np.array([np.nan, 1e30, -2.5], np.float32)  # a float source keeps the general path
    assert cast([f], _bound({"to": 1}))[0].dtype == np.float32
