"""StepAttrs (a bound step's fixed attributes) and the per-step caches that rely on it: the conv
window memo keyed by its identity and the native library's address cache for read-only arrays."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from optcli import native
from optcli.native import caches
from optcli.ops.conv import _window_of
from optcli.ops.evaluate import kernel_attrs
from optcli.ops.registry import StepAttrs


def test_bound_attributes_cannot_change_but_copies_can():
    attrs = kernel_attrs({"pads": [1, 1, 1, 1]}, 1, {"": 13})
    assert type(attrs) is StepAttrs and attrs["_opset"] == 13
    for change in (lambda a: a.__setitem__("pads", [0] * 4), lambda a: a.pop("pads"), lambda a: a.update(x=1),
                   lambda a: a.setdefault("x", 1), lambda a: a.clear()):
        with pytest.raises(TypeError):
            change(attrs)
    for dup in (dict(attrs), copy.copy(attrs), copy.deepcopy(attrs), pickle.loads(pickle.dumps(attrs))):
        dup["pads"] = [0, 0, 0, 0]  # plain dicts
        assert attrs["pads"] == [1, 1, 1, 1]


def test_window_memo_follows_each_steps_own_attributes():
    """Two steps with the same shapes but other pads get their own windows, run after run."""
    a = kernel_attrs({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 1, {})
    b = kernel_attrs({"kernel_shape": [3, 3], "pads": [0, 0, 0, 0], "strides": [2, 2]}, 1, {})
    for _ in range(2):
        assert _window_of(a, (1, 4, 8, 8), (4, 1, 3, 3)).out == (8, 8)
        assert _window_of(b, (1, 4, 8, 8), (4, 1, 3, 3)).out == (3, 3)
    plain = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}  # a caller's dict may change between calls
    assert _window_of(plain, (1, 4, 8, 8), (4, 1, 3, 3)).out == (8, 8)
    plain["pads"] = [0, 0, 0, 0]
    assert _window_of(plain, (1, 4, 8, 8), (4, 1, 3, 3)).out == (6, 6)


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
def test_address_cache_only_keeps_read_only_arrays():
    w = np.arange(12, dtype=np.float32)
    w.flags.writeable = False
    x = np.zeros(12, dtype=np.float32)
    assert caches._ptr(w) == w.ctypes.data == caches._ptr(w)
    assert caches._ptr(x) == x.ctypes.data
    assert id(w) in caches._CONST_ADDRS and id(x) not in caches._CONST_ADDRS
    assert caches._ptr(None) is None
    key = id(w)
    del w  # the cache holds it weakly: a dropped weight leaves it
    import gc

    gc.collect()
    assert key not in caches._CONST_ADDRS


def _address_cases():
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    ro = base.copy()
    ro.flags.writeable = False
    return {"writable": base.copy(), "row view": base[3:5], "column view": base[:, 2:4], "transposed": base.T,
            "fortran": np.asfortranarray(base), "read-only": ro, "read-only view": ro[1:], "empty": base[:0],
            "0-d": np.array(2.5, np.float32), "int8": np.arange(5, dtype=np.int8), "bool": np.ones(3, bool)}


@pytest.mark.parametrize("kind", sorted(_address_cases()))
def test_address_is_the_data_address_of_every_kind_of_array(kind):
    """``_ptr`` takes a writable contiguous array's address through ctypes' view of its buffer and
    falls back to numpy's for the rest: whatever the array, the address is where its data starts."""
    a = _address_cases()[kind]
    assert caches._ptr(a) == a.ctypes.data
    assert caches._ptr(a) == a.ctypes.data  # the second call (a cached read-only one) too


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
@pytest.mark.parametrize("kind", ["1x1", "depthwise", "1x1-small-plane", "im2col", "im2col-1d", "im2col-1d-dilated",
                                  "im2col-small", "fc", "stem", "stem-grouped"])
def test_prepared_native_call_matches_and_steps_aside(kind):
    """A bound step's second run takes its prepared native call (in its attrs' memo), with the same
    result; a new input shape, a strided input or other weights go the full way again.  The
    implicit-GEMM conv (im2col) keeps its own under "prepared im2col"; a Conv1d (one group) its
    padding and implicit GEMM as one call under "prepared conv1d"."""
    from optcli.ops import conv, gemm

    rng = np.random.default_rng(3)
    if kind == "depthwise":
        x = rng.standard_normal((1, 24, 9, 11)).astype(np.float32)
        w = rng.standard_normal((24, 1, 3, 3)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 24, "activation": "relu"}, 1, {})
        fn, other_x = conv.conv_depthwise, rng.standard_normal((1, 24, 5, 7)).astype(np.float32)
    elif kind == "im2col":
        x = rng.standard_normal((1, 16, 12, 10)).astype(np.float32)
        w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [3, 3], "pads": [1, 2, 0, 1], "strides": [2, 1],
                              "activation": "relu"}, 1, {})
        fn, other_x = conv.conv_im2col, rng.standard_normal((1, 16, 9, 17)).astype(np.float32)
    elif kind in ("stem", "stem-grouped"):  # few channels (a group): the stem conv, prepared like the GEMM's
        groups = 4 if kind == "stem-grouped" else 1
        x = rng.standard_normal((1, 3 * groups, 13, 11)).astype(np.float32)
        w = rng.standard_normal((5 * groups, 3, 3, 3)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "strides": [2, 1], "group": groups,
                              "activation": "relu"}, 1, {})
        fn, other_x = conv.conv_im2col, rng.standard_normal((1, 3 * groups, 7, 9)).astype(np.float32)
    elif kind == "im2col-small":  # below 16 output positions: numpy's BLAS for one call, prepared for a step
        x = rng.standard_normal((1, 48, 4, 4)).astype(np.float32)
        w = rng.standard_normal((64, 48, 2, 2)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [2, 2], "activation": "relu"}, 1, {})
        fn, other_x = conv.conv_im2col, rng.standard_normal((1, 48, 3, 5)).astype(np.float32)
    elif kind == "im2col-1d":  # a voice detector's STFT-like Conv1d: 1 channel, kernel 64, stride 32
        x = rng.standard_normal((1, 1, 512)).astype(np.float32)
        w = rng.standard_normal((32, 1, 64)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [64], "pads": [16, 16], "strides": [32]}, 1, {})
        fn, other_x = conv.conv_im2col, rng.standard_normal((1, 1, 300)).astype(np.float32)
    elif kind == "im2col-1d-dilated":  # uneven pads, a dilation, many channels; through conv_by_shape (bodies)
        x = rng.standard_normal((2, 32, 19)).astype(np.float32)
        w = rng.standard_normal((24, 32, 3)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [3], "pads": [2, 1], "dilations": [2], "activation": "relu"}, 1, {})
        fn, other_x = conv.conv_by_shape, rng.standard_normal((2, 32, 7)).astype(np.float32)
    elif kind == "fc":  # a classifier head: one row, W [K, N] (above the few-row kernel's size: smaller ones run it)
        from optcli.native.fc_rows import FC_ROWS_MAX_WEIGHTS

        x = rng.standard_normal((1, 1024)).astype(np.float32)
        w = rng.standard_normal((1024, 160)).astype(np.float32)
        assert w.size > max(gemm._SMALL_FC, FC_ROWS_MAX_WEIGHTS)
        attrs = kernel_attrs({"activation": "relu"}, 1, {})
        fn, other_x = gemm.fully_connected, rng.standard_normal((1, 1, 1024)).astype(np.float32)
    else:
        side = 7 if kind == "1x1-small-plane" else 20
        x = rng.standard_normal((1, 32, side, side)).astype(np.float32)
        w = rng.standard_normal((48, 32, 1, 1)).astype(np.float32)
        attrs = kernel_attrs({"kernel_shape": [1, 1], "activation": "clip", "activation_alpha": 0.0,
                              "activation_beta": 6.0}, 1, {})
        fn, other_x = conv.conv_1x1, rng.standard_normal((1, 32, 3, 5)).astype(np.float32)
    b = rng.standard_normal(w.shape[1] if kind == "fc" else w.shape[0]).astype(np.float32)
    w.flags.writeable = b.flags.writeable = False  # as a plan's weights
    first = fn([x, w, b], attrs)[0]
    if kind == "fc":  # W.T is derived from the second sighting of a weight on: the step prepares then
        first = fn([x, w, b], attrs)[0]
    key = {"im2col": "prepared im2col", "im2col-1d": "prepared conv1d", "im2col-1d-dilated": "prepared conv1d",
           "im2col-small": "prepared im2col", "fc": "prepared fc", "stem": "prepared im2col",
           "stem-grouped": "prepared im2col"}.get(kind, "prepared")
    memo = attrs.memo
    assert key in memo, "the first run did not prepare the step"
    calls = []
    prepared = memo[key][3]

    def counted(arr):
        calls.append(arr.shape)
        return prepared(arr)

    counted.xshape = getattr(prepared, "xshape", None)
    memo[key] = memo[key][:3] + (counted,)
    np.testing.assert_array_equal(fn([x, w, b], attrs)[0], first)
    assert len(calls) == 1
    with np.errstate(all="ignore"):
        plain = dict(attrs)
        for args in ([np.asfortranarray(x), w, b], [x, w.copy(), b], [x, w, None], [other_x, w, b]):
            got = fn(args, attrs)[0]
            want = fn(args, plain)[0]  # a plain dict: never prepared
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # native vs numpy sums: fp32 rounding
    # A Fortran-ordered copy of x is the same input: the 1x1 and im2col steps make it C-contiguous
    # (their GEMM would copy it anyway) and take the prepared call; depthwise reads x in place.
    assert len(calls) == (1 if kind == "depthwise" else 2), "the prepared call ran for an input it was not made for"
    del calls[1:]
    from unittest import mock

    memo[key] = memo[key][:2] + (memo[key][2], counted)
    with mock.patch.object(native.library, "_lib", None):  # the library set aside (OPTCLI_NATIVE=0): numpy runs
        np.testing.assert_allclose(fn([x, w, b], attrs)[0], first, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1, "the prepared native call ran with the library set aside"


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
def test_a_dropped_predictor_leaves_no_weights_behind():
    """The per-step memos live in the bound steps: once a predictor is gone, its weights are freed
    (process-wide caches keyed by identity would have kept them until they filled up)."""
    import gc
    import weakref

    import optcli
    from optcli.zoo.models import build, sample_inputs

    model = build("mobilenet_v2")
    pred = optcli.load(optcli.optimize(model=model, valid_targets="arm").data, threads=1)
    feeds = sample_inputs(model, seed=0)
    pred.run(feeds)
    pred.run(feeds)  # the second run takes the prepared calls
    refs = [weakref.ref(w) for w in pred._executor.plan.weights.values() if isinstance(w, np.ndarray)]
    assert refs
    del pred
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} of {len(refs)} weights outlived their predictor"


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
@pytest.mark.parametrize("op", ["max", "avg"])
def test_prepared_pool_matches_and_steps_aside(op):
    """A pooling step's second run takes its prepared call (the memo's "prepared pool"), with the
    same result; another input shape, a Fortran-ordered input or the library set aside go the full way."""
    from unittest import mock

    from optcli.ops import pool

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 28, 22, 22)).astype(np.float32)
    attrs = kernel_attrs({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 0, 0, 1]}, 1, {})
    fn = pool.max_pool if op == "max" else pool.average_pool
    first = fn([x], attrs)[0]
    shape, prepared = attrs.memo["prepared pool"]
    calls = []

    def counted(arr):
        calls.append(arr.shape)
        return prepared(arr)

    attrs.memo["prepared pool"] = (shape, counted)
    np.testing.assert_array_equal(fn([x], attrs)[0], first)
    assert calls == [x.shape]
    for other in (np.asfortranarray(x), rng.standard_normal((1, 28, 9, 9)).astype(np.float32)):
        np.testing.assert_allclose(fn([other], attrs)[0], fn([other], dict(attrs))[0], rtol=1e-6, atol=1e-6)
    assert calls == [x.shape], "the prepared call ran for an input it was not made for"
    attrs.memo["prepared pool"] = (x.shape, counted)
    with mock.patch.object(native.library, "_lib", None):  # OPTCLI_NATIVE=0: numpy runs
        np.testing.assert_allclose(fn([x], attrs)[0], first, rtol=1e-6, atol=1e-6)
    assert calls == [x.shape]


@pytest.mark.skipif(not native.available(), reason="the native library is not built here")
@pytest.mark.parametrize("n, key", [(80, "fc rows"), (160, "prepared fc")])
def test_prepared_head_keeps_its_fake_quant(n, key):
    """A quantized model's classifier head (FullyConnected with its logits' QuantizeLinear -> DequantizeLinear
    fused, ``activation_quant``) takes the prepared call too (the few-row kernel's up to its size, the
    GEMM's above), and the prepared call applies the FakeQuant: its outputs sit on the grid, equal to
    the unprepared native result."""
    from optcli.ops import gemm

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 1024)).astype(np.float32)  # W above gemm._SMALL_FC: the native head
    w = (rng.standard_normal((1024, n)) / 8).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w.flags.writeable = b.flags.writeable = False
    scale, zp = 0.05, 128.0
    attrs = kernel_attrs({"activation_quant": [scale, zp, 0.0, 255.0]}, 1, {})
    first = gemm.fully_connected([x, w, b], attrs)[0]
    first = gemm.fully_connected([x, w, b], attrs)[0]  # W.T is derived from the second sighting on
    assert attrs.memo.get(key, (None,))[-1] is not None, "the head was not prepared"
    got = gemm.fully_connected([x, w, b], attrs)[0]
    np.testing.assert_array_equal(got, first)
    steps = got / np.float32(scale) + zp
    np.testing.assert_allclose(steps, np.rint(steps), atol=1e-3)  # on the grid: the FakeQuant ran
    assert len(np.unique(got)) > 3
    plain = gemm.fully_connected([x, w, b], dict(attrs))[0]  # numpy's BLAS: within one step
    assert np.abs(got - plain).max() <= scale * 1.001
