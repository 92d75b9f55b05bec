"""Normalisation and softmax kernels against onnxruntime, and the fused ChannelAffine op."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.activation_codes import ACTIVATIONS
from optcli.ir import OPTCLI_DOMAIN
from tests.helpers import assert_close, run_ort, run_variants, single_node_model
from tests.ops.test_conv import act_attrs, act_ref

RNG = np.random.default_rng(3)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(op: str, inputs: dict, attrs: dict, opset: int = 17, n_outputs: int = 1) -> None:
    model = single_node_model(op, inputs, n_outputs=n_outputs, attrs=attrs, opset=opset)
    for o in model.graph.output:
        o.ClearField("type")  # ORT rejects the UNDEFINED element type
    expected = run_ort(model, inputs)
    args = list(inputs.values())
    for a in args:
        a.setflags(write=False)
    for variant, out in run_variants(op, args, {**attrs, "_opset": opset}).items():
        for i, e in enumerate(expected):
            assert out[i].dtype == e.dtype
            assert_close(out[i], e, what=f"{op}[{variant}] output {i} {attrs}")


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4), (2, 3, 5), (1, 2, 3, 4, 2)])
def test_batch_normalization(shape):
    c = shape[1]
    var = np.abs(_rand(c)) + 0.1
    check("BatchNormalization", {"x": _rand(*shape), "s": _rand(c), "b": _rand(c), "m": _rand(c), "v": var},
          {"epsilon": 1e-3})


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 8), 1), ((4, 6), 0), ((2, 3, 4, 5), -2)])
def test_layer_normalization(shape, axis):
    norm = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    check("LayerNormalization", {"x": _rand(*shape), "s": _rand(*norm), "b": _rand(*norm)},
          {"axis": axis, "epsilon": 1e-5}, n_outputs=3)
    out = run_variants("LayerNormalization", [_rand(*shape), _rand(*norm), None], {"axis": axis})
    assert out["default"][0].shape == shape


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 4, 7), (2, 2, 3, 4, 2)])
def test_instance_normalization(shape):
    check("InstanceNormalization", {"x": _rand(*shape), "s": _rand(shape[1]), "b": _rand(shape[1])},
          {"epsilon": 1e-4})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
def test_softmax(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, {"x": _rand(2, 3, 4) * 4}, attrs, opset=opset)


def test_softmax_default_is_opset13():
    x = _rand(2, 3, 4)
    out = run_variants("Softmax", [x], {})["default"][0]
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", [None, *ACTIVATIONS])
def test_channel_affine(name):
    x, s, b = _rand(2, 5, 3, 4), _rand(5), _rand(5)
    x.setflags(write=False)
    ref = x.astype(np.float64) * s.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)
    expected = act_ref(ref, name) if name else ref
    attrs = act_attrs(name) if name else {}
    for variant, out in run_variants("ChannelAffine", [x, s, b], attrs, domain=OPTCLI_DOMAIN).items():
        assert out[0].dtype == np.float32
        assert_close(out[0], expected, what=f"ChannelAffine[{variant}] {name}")


def test_channel_affine_equals_batch_norm():
    x, s, b, m = _rand(2, 4, 3, 3), _rand(4), _rand(4), _rand(4)
    v = np.abs(_rand(4)) + 0.5
    bn = run_variants("BatchNormalization", [x, s, b, m, v], {"epsilon": 1e-5})["default"][0]
    scale = s / np.sqrt(v + 1e-5)
    ca = run_variants("ChannelAffine", [x, scale, b - m * scale], {}, domain=OPTCLI_DOMAIN)["default"][0]
    assert_close(ca, bn)


@pytest.mark.parametrize("shape", [(1, 2), (3, 1), (2, 2, 2), (1, 8), (5,)])
@pytest.mark.parametrize("opset", [11, 13])
def test_tiny_softmax_in_python_floats(shape, opset, monkeypatch):
    """A softmax of at most 8 elements along the last axis runs in Python floats: within one
    float32 rounding of the float64 softmax; rows with a NaN, or infinities, come out as numpy's
    path gives them."""
    from optcli.ops import normalization

    monkeypatch.setattr(normalization.native, "available", lambda: False)  # the native call comes first
    calls = []
    real = normalization._tiny_softmax
    monkeypatch.setattr(normalization, "_tiny_softmax", lambda x: calls.append(x.shape) or real(x))
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    attrs = {"axis": len(shape) - 1, "_opset": opset}
    got = normalization.softmax([x], attrs)[0]
    assert calls and got.dtype == np.float32 and got.shape == x.shape
    x64 = x.astype(np.float64)
    want = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    want /= want.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30)
    odd = np.array([[np.nan, 1.0], [np.inf, 1.0], [-np.inf, 1.0], [-np.inf, -np.inf]], np.float32)
    with np.errstate(invalid="ignore"):
        got = normalization.softmax([odd], {"axis": 1, "_opset": opset})[0]
        monkeypatch.setattr(normalization, "_TINY_SOFTMAX", 0)
        want = normalization.softmax([odd], {"axis": 1, "_opset": opset})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, axis", [((1, 30), 1), ((1, 30), -1), ((1, 64, 1), 1), ((1, 64, 1), -2),
                                         ((1, 1, 13), 2), ((97,), 0), ((1, 9), 1)])
@pytest.mark.parametrize("special", [None, "nan", "inf", "-inf"])
def test_one_row_softmax(shape, axis, special, monkeypatch):
    """A softmax whose axis holds every element (all other dims 1) reduces over the whole array:
    within a few float32 roundings of the float64 softmax along that axis; a NaN or +inf makes the
    row what numpy's general path makes it, a -inf a zero."""
    from optcli.ops import normalization

    monkeypatch.setattr(normalization.native, "available", lambda: False)  # the native call comes first
    calls = []
    real = normalization._one_row_softmax
    monkeypatch.setattr(normalization, "_one_row_softmax", lambda x: calls.append(x.shape) or real(x))
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    if special:
        x.reshape(-1)[3] = float(special)
    with np.errstate(invalid="ignore"):
        got = normalization.softmax([x], {"axis": axis, "_opset": 13})[0]
        x64 = x.astype(np.float64)
        want = np.exp(x64 - x64.max(axis=axis, keepdims=True))
        want /= want.sum(axis=axis, keepdims=True)
    assert calls and got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # float32 x - max and exp: a few roundings

