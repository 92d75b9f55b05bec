"""PRelu with a slope per channel (kernels/host/epilogue.c ``optcli_channel_prelu_f32``) and the PRelu
kernel that takes it (ops/activation.py): against numpy's ``where(x >= 0, x, x * slope)`` and
onnxruntime, for the slope shapes exporters write ([C], [C, 1, 1], [1, C, 1, 1], [1], a dense
layer's [N]) and the blocked layout's [1, Cb, 1, 1, B]; one channel, primes, 1x1 maps, zero and
negative slopes, NaN, -0 and infinities, in place and not, 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest

from optcli import native
from optcli.ops import activation
from optcli.ops.registry import StepAttrs

# (x shape, slope shape, expected [N, C, HW, lanes] or None: numpy's broadcast)
LAYOUTS = [
    ((1, 28, 22, 22), (28, 1, 1), (1, 28, 484, 1)),
    ((2, 13, 7, 5), (1, 13, 1, 1), (2, 13, 35, 1)),
    ((1, 1, 9, 11), (1, 1, 1), (1, 1, 99, 1)),
    ((3, 128), (128,), (1, 1, 3, 128)),
    ((2, 37), (1, 37), (1, 1, 2, 37)),
    ((2, 3, 5, 7), (1,), (1, 1, 210, 1)),
    ((2, 5, 1, 1), (5, 1, 1), (2, 5, 1, 1)),
    ((1, 3, 4, 5, 8), (1, 3, 1, 1, 8), (1, 3, 20, 8)),
    ((2, 3, 5, 7), (5, 7), (6, 5, 1, 7)),
    ((2, 3, 5, 7), (3, 1, 7), (2, 3, 5, 7)),  # channel and last axis, unit axes between
    ((2, 3, 5, 7), (3, 5, 1), None),  # two axes, not the last: numpy
    ((2, 3, 5, 7), (5, 1), (6, 5, 7, 1)),
    ((2, 3, 5, 7), (2, 3, 5, 7), None),
    ((0, 3), (3,), None),
    ((), (), None),
]


@pytest.mark.parametrize("xs, ss, want", LAYOUTS, ids=[f"{x}-{s}" for x, s, _ in LAYOUTS])
def test_layouts(xs, ss, want):
    assert activation.prelu_layout(xs, ss) == want


def _values(xs, ss, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(xs) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(4, flat.size)] = [np.nan, -0.0, -np.inf, np.inf][: min(4, flat.size)]
    s = rng.standard_normal(ss).astype(np.float32)
    s.reshape(-1)[0] = 0.0  # a zero slope; the others of either sign
    return x, s


@pytest.mark.parametrize("xs, ss, want", [c for c in LAYOUTS if c[2] is not None],
                         ids=[f"{x}-{s}" for x, s, w in LAYOUTS if w is not None])
def test_native_pass_matches_numpy(xs, ss, want, pool_threads):
    x, s = _values(xs, ss, len(xs) + len(ss))
    with np.errstate(invalid="ignore"):
        ref = np.where(x >= 0, x, x * s)
    flat = np.ascontiguousarray(s).reshape(-1)
    got = native.prepared_channel_prelu(flat, want, x.shape)(x)
    np.testing.assert_array_equal(got, ref)
    assert np.array_equal(np.signbit(got), np.signbit(ref))  # -0 stays -0
    same = x.copy()  # in place
    assert native.library._lib.optcli_channel_prelu_f32(same.ctypes.data, same.ctypes.data, flat.ctypes.data,
                                                        *want) == 0
    np.testing.assert_array_equal(same, ref)


@pytest.mark.parametrize("xs, ss", [(c[0], c[1]) for c in LAYOUTS if c[0] and all(c[0])])
def test_prelu_kernel_matches_numpy_at_any_size(xs, ss, monkeypatch, native_lib):
    """The PRelu kernel with the native pass forced on (threshold 0) and as shipped."""
    x, s = _values(xs, ss, 7)
    with np.errstate(invalid="ignore"):
        ref = np.where(x >= 0, x, x * s)
    for start in (0, activation.NATIVE_PRELU_FROM):
        monkeypatch.setattr(activation, "NATIVE_PRELU_FROM", start)
        attrs = StepAttrs()
        for _ in range(2):  # the first call prepares, the second takes the memo
            got = activation.prelu([x, s], attrs)[0]
            np.testing.assert_array_equal(got, ref)
        native_call = attrs.memo.get("native prelu", (None, None, None))[2]
        assert (native_call is not None) == (x.size >= start and activation.prelu_layout(xs, ss) is not None)


def test_the_kernel_takes_the_native_pass_from_its_threshold(monkeypatch, native_lib):
    calls = []
    real = native.prepared_channel_prelu
    monkeypatch.setattr(native, "prepared_channel_prelu", lambda *a: calls.append(a[1]) or real(*a))
    x, s = _values((1, 10, 30, 30), (10, 1, 1), 1)
    with np.errstate(invalid="ignore"):
        want = np.where(x >= 0, x, x * s)
    np.testing.assert_array_equal(activation.prelu([x, s], StepAttrs())[0], want)
    assert calls == [(1, 10, 900, 1)]
    activation.prelu([x[:, :, :5, :5].copy(), s], StepAttrs())
    assert len(calls) == 1  # 250 elements: numpy's pass


def test_prelu_kernel_matches_onnxruntime(native_lib):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    for xs, ss in [((1, 28, 22, 22), (28, 1, 1)), ((1, 128), (128,)), ((2, 3, 50, 41), (1,)),
                   ((1, 1, 64, 65), (1, 1, 1))]:
        x, s = _values(xs, ss, 3)
        x = np.nan_to_num(x, posinf=5.0, neginf=-5.0)
        graph = helper.make_graph(
            [helper.make_node("PRelu", ["x", "s"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(s, "s")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(activation.prelu([x, s], StepAttrs())[0], want)


def test_bad_geometry_is_refused(native_lib):
    fn = native.library._lib.optcli_channel_prelu_f32
    x = np.zeros(8, np.float32)
    for args in ((1, 0, 8, 1), (-1, 1, 8, 1), (1, 1, -1, 1), (1, 1, 8, 0)):
        assert fn(x.ctypes.data, x.ctypes.data, x.ctypes.data, *args) != 0
