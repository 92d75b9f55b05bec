"""onnxruntime's quantized contrib ops (domain ``com.microsoft``) that its QOperator-format
quantizer emits beside QLinearConv/QLinearMatMul: QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat.

Each is "dequantize the inputs, run the float op, quantize the result" with the float kernels of
this package, which is what onnxruntime computes up to the rounding of its fixed-point
requantization.
"""

from __future__ import annotations

import numpy as np

from optcli.ops.activation import _sigmoid
from optcli.ops.pool import average_pool
from optcli.ops.quant import quantize
from optcli.ops.registry import kernel

MS = "com.microsoft"


def _deq(x, scale, zp) -> np.ndarray:
    z = 0.0 if zp is None else np.asarray(zp, np.float64)
    return (x.astype(np.float64) - z) * np.asarray(scale, np.float64)


def _q(y: np.ndarray, scale, zp) -> np.ndarray:
    zp = np.asarray(zp) if zp is not None else np.uint8(0)
    return quantize(y, np.asarray(scale, np.float64), zp, zp.dtype)


def _opt(inputs, i):
    return inputs[i] if len(inputs) > i else None


@kernel("QLinearAdd", domain=MS)
def qlinear_add(inputs, attrs):
    a, b = _deq(inputs[0], inputs[1], _opt(inputs, 2)), _deq(inputs[3], inputs[4], _opt(inputs, 5))
    return [_q(a + b, inputs[6], _opt(inputs, 7))]


@kernel("QLinearMul", domain=MS)
def qlinear_mul(inputs, attrs):
    a, b = _deq(inputs[0], inputs[1], _opt(inputs, 2)), _deq(inputs[3], inputs[4], _opt(inputs, 5))
    return [_q(a * b, inputs[6], _opt(inputs, 7))]


@kernel("QLinearSigmoid", domain=MS)
def qlinear_sigmoid(inputs, attrs):
    return [_q(_sigmoid(_deq(inputs[0], inputs[1], _opt(inputs, 2))), inputs[3], _opt(inputs, 4))]


@kernel("QLinearLeakyRelu", domain=MS)
def qlinear_leaky_relu(inputs, attrs):
    x = _deq(inputs[0], inputs[1], _opt(inputs, 2))
    return [_q(np.where(x >= 0, x, x * float(attrs.get("alpha", 0.01))), inputs[3], _opt(inputs, 4))]


@kernel("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool(inputs, attrs):
    x = _deq(inputs[0], inputs[1], inputs[2])
    axes = tuple(range(1, x.ndim - 1)) if int(attrs.get("channels_last", 0)) else tuple(range(2, x.ndim))
    return [_q(x.mean(axis=axes, keepdims=True), inputs[3], inputs[4])]


@kernel("QLinearAveragePool", domain=MS)
def qlinear_average_pool(inputs, attrs):
    x = _deq(inputs[0], inputs[1], _opt(inputs, 2))
    if int(attrs.get("channels_last", 0)):
        x = np.moveaxis(x, -1, 1)
    y = average_pool([x], {k: v for k, v in attrs.items() if k != "channels_last"})[0]
    if int(attrs.get("channels_last", 0)):
        y = np.moveaxis(y, 1, -1)
    return [_q(y, inputs[3], _opt(inputs, 4))]


@kernel("QLinearConcat", domain=MS)
def qlinear_concat(inputs, attrs):
    ys, yzp = inputs[0], inputs[1]
    parts = [_deq(inputs[i], inputs[i + 1], inputs[i + 2]) for i in range(2, len(inputs), 3)]
    return [_q(np.concatenate(parts, axis=int(attrs.get("axis", 1))), ys, yzp)]


@kernel("QGemm", domain=MS)
def qgemm(inputs, attrs):
    """alpha * A' @ B' + C with dequantized A and B; quantized output when y_scale is given."""
    a = _deq(inputs[0], inputs[1], _opt(inputs, 2))
    b_scale = np.asarray(inputs[4], np.float64)
    b = inputs[3].astype(np.float64) - (0.0 if _opt(inputs, 5) is None else np.asarray(inputs[5], np.float64))
    if int(attrs.get("transA", 0)):
        a = a.T
    if int(attrs.get("transB", 0)):
        b = b.T
    y = float(attrs.get("alpha", 1.0)) * (a @ (b * b_scale.reshape(-1) if b_scale.size > 1 else b * b_scale))
    c = _opt(inputs, 6)
    if c is not None:
        # C is int32, in the scale of the product (a_scale * b_scale).
        y = y + c.astype(np.float64) * np.asarray(inputs[1], np.float64) * b_scale.reshape(-1)
    ys = _opt(inputs, 7)
    return [_q(y, ys, _opt(inputs, 8)) if ys is not None else y.astype(np.float32)]
