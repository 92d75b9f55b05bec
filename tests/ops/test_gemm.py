"""Gemm, MatMul and FullyConnected against onnxruntime / numpy, with fused epilogues."""

from __future__ import annotations

import numpy as np
import pytest

from optcli.activation_codes import ACTIVATIONS
from optcli.ir import OPTCLI_DOMAIN
from tests.helpers import assert_close, run_ort, run_variants, single_node_model
from tests.ops.test_conv import act_attrs, act_ref

RNG = np.random.default_rng(2)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ort(op: str, inputs: dict, attrs: dict | None = None, input_names: list | None = None) -> np.ndarray:
    model = single_node_model(op, inputs, attrs=attrs, input_names=input_names)
    for o in model.graph.output:
        o.ClearField("type")  # ORT rejects the UNDEFINED element type
    return run_ort(model, inputs)[0]


GEMM_CASES = [
    ((3, 4), (4, 5), None, {}),
    ((4, 3), (4, 5), (5,), {"transA": 1}),
    ((3, 4), (5, 4), (3, 5), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    ((4, 3), (5, 4), (3, 1), {"transA": 1, "transB": 1, "beta": 0.0}),
    ((3, 4), (4, 5), (1, 5), {"alpha": -1.5}),
    ((1, 7), (7, 2), (), {"beta": 3.0}),
]


@pytest.mark.parametrize("a,b,c,attrs", GEMM_CASES)
def test_gemm_matches_ort(a, b, c, attrs):
    feeds = {"a": _rand(*a), "b": _rand(*b)}
    if c is not None:
        feeds["c"] = _rand(*c) if c else np.array(RNG.standard_normal(), dtype=np.float32)
    expected = ort("Gemm", feeds, attrs)
    for variant, out in run_variants("Gemm", list(feeds.values()), attrs).items():
        assert_close(out[0], expected, what=f"Gemm[{variant}] {attrs}")


MATMUL_CASES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((1, 1, 64), (1, 64, 96)),  # a decoder's attention context, every step of its Loop
    ((1, 1, 7), (1, 7, 1)),
]


@pytest.mark.parametrize("a,b", MATMUL_CASES)
def test_matmul_matches_ort(a, b):
    feeds = {"a": _rand(*a), "b": _rand(*b)}
    expected = ort("MatMul", feeds)
    for variant, out in run_variants("MatMul", list(feeds.values()), {}).items():
        assert type(out[0]) is np.ndarray  # 1-D x 1-D included: numpy's matmul gives a scalar there
        assert_close(out[0], expected, what=f"MatMul[{variant}] {a} {b}")


def test_matmul_dtypes():
    a, b = _rand(2, 3, 4), _rand(4, 5)
    for dtype, prec in [(np.float16, "fp16"), (np.float64, "fp32")]:
        out = run_variants("MatMul", [a.astype(dtype), b.astype(dtype)], {})["default"][0]
        assert out.dtype == dtype
        assert_close(out, a @ b, prec)
    ai, bi = RNG.integers(-5, 5, (3, 4)).astype(np.int64), RNG.integers(-5, 5, (4, 2)).astype(np.int64)
    np.testing.assert_array_equal(run_variants("MatMul", [ai, bi], {})["default"][0], ai @ bi)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_gemm_epilogue(name):
    a, b, c = _rand(3, 4), _rand(5, 4), _rand(5)
    attrs = {"transB": 1, "alpha": 0.7}
    expected = act_ref(0.7 * a @ b.T + c, name)
    for variant, out in run_variants("Gemm", [a, b, c], {**attrs, **act_attrs(name)}).items():
        assert_close(out[0], expected, what=f"Gemm[{variant}]+{name}")


@pytest.mark.parametrize("xshape", [(7,), (3, 7), (2, 3, 7), (2, 2, 3, 7)])
@pytest.mark.parametrize("name", [None, *ACTIVATIONS])
def test_fully_connected(xshape, name):
    x, w, b = _rand(*xshape), _rand(7, 5), _rand(5)
    x.setflags(write=False)
    attrs = act_attrs(name) if name else {}
    ref = x.astype(np.float64) @ w + b
    expected = act_ref(ref, name) if name else ref
    for variant, out in run_variants("FullyConnected", [x, w, b], attrs, domain=OPTCLI_DOMAIN).items():
        assert out[0].dtype == np.float32
        assert_close(out[0], expected, what=f"FullyConnected[{variant}] {xshape} {name}")
    no_bias = run_variants("FullyConnected", [x, w, None], {}, domain=OPTCLI_DOMAIN)["default"][0]
    assert_close(no_bias, x @ w)
