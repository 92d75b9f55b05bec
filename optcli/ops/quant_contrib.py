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
from optcli.ops.quant import int_matmul, quantize, requantize
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, broadcast, first_input, shape_fn

MS = "com.microsoft"


def _deq(x, scale, zp) -> np.ndarray:
    """(x - zero point) * scale in float32 (the integer difference is exact, so is one rounding)."""
    z = 0.0 if zp is None else np.asarray(zp, np.float64)
    return ((x.astype(np.float64) - z) * np.asarray(scale, np.float32).astype(np.float64)).astype(np.float32)


def _q(y: np.ndarray, scale, zp) -> np.ndarray:
    zp = np.asarray(zp) if zp is not None else np.uint8(0)
    return quantize(np.asarray(y, np.float32), np.asarray(scale, np.float32), zp, zp.dtype)


def _f32(v) -> np.float32:
    return np.float32(np.asarray(v).reshape(-1)[0]) if v is not None else np.float32(0)


def _fma(a: np.ndarray, b, c) -> np.ndarray:
    """float32 fused multiply-add: the float32 product is exact in float64, one rounding at the end."""
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


def _saturate(r: np.ndarray, zp) -> np.ndarray:
    dtype = np.asarray(zp).dtype if zp is not None else np.dtype(np.uint8)
    info = np.iinfo(dtype)
    return np.asarray(np.clip(np.rint(r), info.min, info.max), dtype=dtype)


def _opt(inputs, i):
    return inputs[i] if len(inputs) > i else None


@kernel("QLinearAdd", domain=MS)
def qlinear_add(inputs, attrs):
    """onnxruntime's MLAS arithmetic (x86, AVX2): the scale ratios and zero points folded into
    one float32 multiply-add per operand, rounded half to even."""
    a, b = inputs[0], inputs[3]
    za, zb, zc = _f32(_opt(inputs, 2)), _f32(_opt(inputs, 5)), _f32(_opt(inputs, 7))
    sc = _f32(inputs[6])
    r_ac, r_bc = _f32(inputs[1]) / sc, _f32(inputs[4]) / sc
    fixed = zc - (r_ac * za + r_bc * zb)
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    if b.size == 1 and a.size != 1:
        r = _fma(fa, r_ac, fixed + fb.reshape(()) * r_bc)
    elif a.size == 1 and b.size != 1:
        r = _fma(fb, r_bc, fixed + fa.reshape(()) * r_ac)
    else:
        r = _fma(fa, r_ac, _fma(fb, r_bc, fixed))
    return [_saturate(r, _opt(inputs, 7))]


@kernel("QLinearMul", domain=MS)
def qlinear_mul(inputs, attrs):
    """onnxruntime's MLAS arithmetic: the integer product of the centred operands, times
    a_scale * b_scale / c_scale in float32, plus the zero point, rounded half to even."""
    za, zb = _opt(inputs, 2), _opt(inputs, 5)
    prod = (inputs[0].astype(np.int32) - (0 if za is None else np.int32(_f32(za)))) * \
        (inputs[3].astype(np.int32) - (0 if zb is None else np.int32(_f32(zb))))
    ratio = _f32(inputs[1]) * _f32(inputs[4]) / _f32(inputs[6])
    return [_saturate(prod.astype(np.float32) * ratio + _f32(_opt(inputs, 7)), _opt(inputs, 7))]


@kernel("QLinearSigmoid", domain=MS)
def qlinear_sigmoid(inputs, attrs):
    return [_q(_sigmoid(_deq(inputs[0], inputs[1], _opt(inputs, 2))), inputs[3], _opt(inputs, 4))]


@kernel("QLinearLeakyRelu", domain=MS)
def qlinear_leaky_relu(inputs, attrs):
    x = _deq(inputs[0], inputs[1], _opt(inputs, 2))
    return [_q(np.where(x >= 0, x, x * float(attrs.get("alpha", 0.01))), inputs[3], _opt(inputs, 4))]


@kernel("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool(inputs, attrs):
    """onnxruntime's MLAS arithmetic: the exact integer sum of (x - zero point), times
    x_scale / (y_scale * pixels) in float32, rounded half to even."""
    x = inputs[0]
    axes = tuple(range(1, x.ndim - 1)) if int(attrs.get("channels_last", 0)) else tuple(range(2, x.ndim))
    pixels = int(np.prod([x.shape[a] for a in axes]))
    acc = (x.astype(np.float64) - np.float64(_f32(inputs[2]))).sum(axis=axes, keepdims=True)
    scale = _f32(inputs[1]) / (_f32(inputs[3]) * np.float32(pixels))
    return [_saturate(acc.astype(np.float32) * scale + _f32(inputs[4]), inputs[4])]


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
    parts = []
    for i in range(2, len(inputs), 3):
        x, xs, xzp = inputs[i], inputs[i + 1], inputs[i + 2]
        same = _f32(xs) == _f32(ys) and _f32(xzp) == _f32(yzp) and x.dtype == np.asarray(yzp).dtype
        # onnxruntime copies inputs already in the output's quantization and requantizes the
        # others in float32 (a 256-entry table of dequantize -> quantize).
        parts.append(x if same else _q(_deq(x, xs, xzp), ys, yzp))
    return [np.concatenate(parts, axis=int(attrs.get("axis", 1)))]


@kernel("QGemm", domain=MS)
def qgemm(inputs, attrs):
    """onnxruntime's QGemm: the exact integer product of the centred A' and B' plus the int32 C,
    times alpha * a_scale * b_scale (/ y_scale) in float32: requantized when y_scale is given,
    else the float result."""
    a, b = inputs[0], inputs[3]
    if int(attrs.get("transA", 0)):
        a = a.T
    if int(attrs.get("transB", 0)):
        b = b.T  # per-column zero points and scales run along N, B's columns once it is [K, N]
    acc = int_matmul(a, _opt(inputs, 2), b, _opt(inputs, 5))
    c = _opt(inputs, 6)
    if c is not None:
        acc = acc.astype(np.float64) + c.astype(np.float64)
    scale = np.float32(attrs.get("alpha", 1.0)) * _f32(inputs[1]) * np.asarray(inputs[4], np.float32).reshape(-1)
    ys = _opt(inputs, 7)
    if ys is None:
        return [np.asarray(acc.astype(np.float32) * scale, np.float32)]
    yzp = _opt(inputs, 8)
    return [requantize(acc, scale / _f32(ys), 0 if yzp is None else yzp,
                       np.dtype(np.uint8) if yzp is None else np.asarray(yzp).dtype)]


# ----------------------------------------------------------------------------- shape functions

shape_fn(["QLinearSigmoid", "QLinearLeakyRelu"], domain=MS)(first_input)


@shape_fn(["QLinearAdd", "QLinearMul"], domain=MS)
def _qlinear_binary_shape(args: ShapeArgs) -> list[Shape]:
    return [broadcast(args.shape(0), args.shape(3))]


@shape_fn("QLinearGlobalAveragePool", domain=MS)
def _qlinear_global_pool_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.pool import global_pool_shape

    return [global_pool_shape(args.shape(0), bool(int(args.attrs.get("channels_last", 0))))]


@shape_fn("QLinearAveragePool", domain=MS)
def _qlinear_pool_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.pool import pool_shape

    return [pool_shape(args.shape(0), args.attrs, bool(int(args.attrs.get("channels_last", 0))))]


@shape_fn("QLinearConcat", domain=MS)
def _qlinear_concat_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.tensor_shape_functions import concat_shape

    return [concat_shape([args.shape(k) for k in range(2, len(args.shapes), 3)], int(args.attrs.get("axis", 1)))]


@shape_fn("QGemm", domain=MS)
def _qgemm_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.gemm import gemm_shape

    return gemm_shape(args, 0, 3, 6)
