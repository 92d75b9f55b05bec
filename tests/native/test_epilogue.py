"""The native bias + activation epilogue of the GEMM convs (1x1, im2col, ConvTranspose) against
numpy's, odd plane sizes and non-finite values included."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from optcli import native
from optcli.ops.activation import apply_activation
from optcli.ops.conv import conv_im2col, conv_transpose
from tests.helpers import assert_close
from tests.native.cases import ACT_PARAMS
from tests.native.test_depthwise import ort_conv

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("activation", [None, *ACT_PARAMS])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 7), (1, 5, 8), (1, 13, 9), (1, 24, 49), (1, 2, 3136),
                                   (3, 4, 2, 5)])
def test_bias_activation_matches_numpy(shape, activation, native_lib):
    y = (RNG.standard_normal(shape) * 4).astype(np.float32)
    y.flat[0], y.flat[-1] = np.nan, -np.inf  # NaN stays NaN, -inf saturates or stays as numpy says
    bias = RNG.standard_normal(shape[1]).astype(np.float32)
    a, b = ACT_PARAMS.get(activation, (0.0, 0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        want = apply_activation(y + bias.reshape((1, -1) + (1,) * (y.ndim - 2)), activation, a, b)
    got = native.bias_activation_(y.copy(), bias, activation, a, b)
    assert_close(got, want, what=f"{activation} on {shape}")


def test_without_bias(native_lib):
    y = RNG.standard_normal((2, 6, 11)).astype(np.float32)
    assert_close(native.bias_activation_(y.copy(), None, "hard_swish"), apply_activation(y.copy(), "hard_swish"))


@pytest.mark.parametrize("kernel, xshape, wshape, attrs", [  # 2-D 1x1 / im2col: the native GEMM (test_gemm.py)
    # 3-D grouped: BLAS columns (1-D convs now run as 2-D of height 1, with the GEMM's own epilogue)
    (conv_im2col, (1, 16, 8, 20, 24), (12, 8, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "group": 2}),
    (conv_transpose, (1, 16, 57, 61), (16, 5, 3, 3), {"strides": [2, 2]}),
])
@pytest.mark.parametrize("activation", ["clip", "swish", None])
def test_gemm_convs_finish_natively(kernel, xshape, wshape, attrs, activation, native_calls):
    x = RNG.standard_normal(xshape).astype(np.float32)  # outputs above the native threshold
    w = RNG.standard_normal(wshape).astype(np.float32)
    b = RNG.standard_normal(wshape[1] if kernel is conv_transpose else wshape[0]).astype(np.float32)
    full = dict(attrs)
    if activation:
        a, be = ACT_PARAMS[activation]
        full.update(activation=activation, activation_alpha=a, activation_beta=be)
    got = kernel([x, w, b], dict(full))[0]
    assert native_calls["epilogue"] == 1
    with mock.patch.object(native.library, "_lib", None):
        want = kernel([x, w, b], dict(full))[0]
    assert_close(got, want, what=f"{kernel.__name__} {activation}")


@pytest.mark.parametrize("activation", ["swish", "relu", None])
def test_channel_affine_out_of_place(activation, native_lib):
    """The map of a stand-alone BatchNormalization: the input is left as it was."""
    x = RNG.standard_normal((2, 5, 3, 7)).astype(np.float32)
    keep = x.copy()
    scale, shift = RNG.standard_normal(5).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    got = native.channel_affine(x, scale, shift, activation)
    want = apply_activation(x * scale[None, :, None, None] + shift[None, :, None, None], activation)
    assert_close(got, want, what=f"affine {activation}")
    assert np.array_equal(x, keep)


def test_small_outputs_finish_in_numpy(native_calls):
    """Below ~32K elements a call into the library costs more than numpy's two passes (a 3x3 conv
    with under 16 positions is a BLAS product, finished by _finish)."""
    x = RNG.standard_normal((1, 16, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((24, 16, 3, 3)).astype(np.float32)
    got = conv_im2col([x, w, None], {"activation": "relu", "kernel_shape": [3, 3]})[0]
    assert native_calls["epilogue"] == 0 and native_calls["gemm"] == 0 and native_calls["conv_gemm"] == 0
    assert_close(got, np.maximum(ort_conv(x, w, None, {"kernel_shape": [3, 3]}), 0))
