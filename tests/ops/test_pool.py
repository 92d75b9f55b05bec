"""Pooling kernels against onnxruntime: pads, auto_pad, strides, dilations, ceil_mode, 1-D/2-D/3-D."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import assert_close, run_ort, run_variants, single_node_model

RNG = np.random.default_rng(1)


def check(op: str, shape: tuple, attrs: dict, dtype=np.float32, opset: int = 17) -> None:
    x = RNG.standard_normal(shape).astype(dtype)
    model = single_node_model(op, {"x": x}, attrs=attrs, opset=opset)
    for o in model.graph.output:
        o.ClearField("type")  # ORT rejects the UNDEFINED element type
    expected = run_ort(model, {"x": x})[0]
    x.setflags(write=False)
    for variant, out in run_variants(op, [x], attrs).items():
        assert out[0].dtype == expected.dtype
        assert_close(out[0], expected, what=f"{op}[{variant}] {shape} {attrs}")


WINDOW_CASES = [
    ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 3, 9, 7), {"kernel_shape": [3, 3]}),
    ((1, 2, 9, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 4], "strides": [3, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((1, 2, 10, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 11, 9), {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 1, 0, 1], "ceil_mode": 1}),
    ((1, 2, 4, 4), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((2, 3, 15), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
]
DILATED_CASES = [
    ((1, 2, 10, 10), {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    ((1, 2, 11, 12), {"kernel_shape": [2, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("shape,attrs", WINDOW_CASES + DILATED_CASES)
def test_max_pool(shape, attrs):
    check("MaxPool", shape, attrs)


@pytest.mark.parametrize("shape,attrs", WINDOW_CASES + DILATED_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(shape, attrs, include_pad):
    # AveragePool has dilations only from opset 19.
    opset = 19 if "dilations" in attrs else 17
    check("AveragePool", shape, {**attrs, "count_include_pad": include_pad}, opset=opset)


def test_max_pool_int8_and_fp16():
    check("MaxPool", (1, 2, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, np.float16)
    x = RNG.integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    out = run_variants("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    ref = np.full((1, 2, 8, 8), -128, np.int8)
    ref[:, :, 1:7, 1:7] = x
    expected = ref.reshape(1, 2, 4, 2, 4, 2).max(axis=(3, 5))
    for o in out.values():
        np.testing.assert_array_equal(o[0], expected)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 9), (1, 2, 3, 4, 5)])
def test_global_pools(op, shape):
    check(op, shape, {})
