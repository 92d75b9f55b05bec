"""Upsampling by whole factors (kernels/host/upsample.c): a ConvTranspose whose taps never overlap,
against the numpy path and onnxruntime on odd shapes (rows that are not whole vectors, 1 channel,
1x1 maps, kernels 1-3 per axis), with every fused activation; the routing to it; refused arguments.
The nearest geometry (tap stride 0) runs on aarch64 in test_aarch64's driver cases."""

from __future__ import annotations

from unittest import mock

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from optcli import native
from optcli.native import upsample
from optcli.ops.activation import apply_activation
from optcli.ops.conv import conv_transpose
from tests.native.cases import ACT_PARAMS
from tests.native.conftest import spy_native_function

SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 16, 9, 17), (1, 4, 40, 40), (1, 2, 3, 33)]


def _ort(node, inits, x):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _count_calls(monkeypatch):
    return spy_native_function(monkeypatch, "optcli_upsample_taps_f32")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel", [(2, 2), (1, 2), (3, 1), (2, 3)])
@pytest.mark.parametrize("act", [None, *ACT_PARAMS])
def test_conv_transpose_with_taps_side_by_side(shape, kernel, act, native_lib, monkeypatch):
    """stride = kernel (a 2x2 / 2 upsampling head and odd ones), bias and activation fused."""
    rng = np.random.default_rng(len(shape) + sum(kernel))
    x = rng.standard_normal(shape).astype(np.float32)
    m = 1 + shape[1] % 5
    w = (rng.standard_normal((shape[1], m, *kernel)) / np.sqrt(shape[1])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = {"kernel_shape": list(kernel), "strides": list(kernel)}
    if act:
        attrs.update(activation=act, activation_alpha=ACT_PARAMS[act][0], activation_beta=ACT_PARAMS[act][1])
    calls = _count_calls(monkeypatch)
    got = conv_transpose([x, w, b], attrs)[0]
    assert len(calls) == 1
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=list(kernel), strides=list(kernel))
    pre = _ort(node, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], x)
    want = pre if act is None else apply_activation(pre.copy(), act, *ACT_PARAMS[act])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with mock.patch.object(native.library, "_lib", None):
        np.testing.assert_allclose(conv_transpose([x, w, b], attrs)[0], got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{"strides": [2, 2], "pads": [1, 0, 1, 0]},
                                   {"strides": [2, 2], "output_padding": [1, 1]},
                                   {"strides": [1, 1]}, {"strides": [2, 2], "dilations": [2, 1]}],
                         ids=["pads", "output-padding", "overlapping", "dilated"])
def test_conv_transposes_of_other_geometry_stay_with_numpy(attrs, native_lib, monkeypatch):
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 3, 6, 7)).astype(np.float32), rng.standard_normal((3, 2, 2, 2)).astype(np.float32)
    calls = _count_calls(monkeypatch)
    got = conv_transpose([x, w, None], {"kernel_shape": [2, 2], **attrs})[0]
    assert not calls
    want = _ort(helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], **attrs),
                [numpy_helper.from_array(w, "w")], x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_refuses_bad_arguments(native_lib):
    lib = native_lib._lib
    x, y = np.zeros(16, np.float32), np.zeros(64, np.float32)
    for geom in ((1, 0, 4, 4, 2, 2, 16, 0), (1, 1, 4, 4, 0, 2, 16, 0), (1, 1, 4, -1, 2, 2, 16, 0),
                 (-1, 1, 4, 4, 2, 2, 16, 0), (1, 1, 4, 4, 2, 2, 16, -16)):
        g = np.array(geom, np.int64)
        assert lib.optcli_upsample_taps_f32(x.ctypes.data, None, y.ctypes.data, g.ctypes.data, 0, 0.0, 0.0) != 0
    g = np.array((1, 1, 4, 4, 2, 2, 16, 0), np.int64)
    assert lib.optcli_upsample_taps_f32(x.ctypes.data, None, y.ctypes.data, g.ctypes.data, 99, 0.0, 0.0) != 0
    with pytest.raises(native.NativeError):
        upsample.transpose_conv_taps(np.zeros((1, 8, 16), np.float32), np.zeros(3, np.float32), 1, 2, 4, 4, 2, 2)
