"""Quantization ops: ONNX's QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear, the
QOperator ops (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger), and optcli's FakeQuant
(a QuantizeLinear + DequantizeLinear pair in one op: what activation quantization looks like to a
float target).

Integer accumulations are computed exactly: the products of (value - zero point) pairs are
summed in float64, which holds every int32 accumulator exactly, through the same BLAS-backed
Conv/MatMul kernels as the float ops (numpy has no BLAS for integer matrices; float64 BLAS beats
numpy's integer matmul by far).  Requantization rounds half to even, like onnxruntime.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN
from optcli.ops.conv import conv_im2col
from optcli.ops.registry import kernel

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
           np.dtype(np.int16): (-32768, 32767), np.dtype(np.int32): (-(2**31), 2**31 - 1)}


def _per_axis(param: np.ndarray, x: np.ndarray, axis: int, block_size: int = 0) -> np.ndarray:
    """Broadcast a per-tensor, per-axis or blocked (opset 21) scale/zero point against ``x``."""
    param = np.asarray(param)
    if param.ndim == 0 or param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    axis = axis % x.ndim
    if block_size and param.ndim == x.ndim:
        return np.repeat(param, block_size, axis=axis)[tuple(slice(0, d) for d in x.shape)]
    shape = [1] * x.ndim
    shape[axis] = -1
    return param.reshape(shape)


def _target_dtype(zero_point: np.ndarray | None, attrs: dict[str, Any]) -> np.dtype:
    if zero_point is not None:
        return np.asarray(zero_point).dtype
    to = attrs.get("output_dtype")
    if to:
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
    return np.dtype(np.uint8)


def quantize(x: np.ndarray, scale, zero_point, dtype: np.dtype) -> np.ndarray:
    lo, hi = _RANGES[np.dtype(dtype)]
    q = np.rint(x.astype(np.float64) / scale) + np.asarray(zero_point, np.float64)
    return np.clip(q, lo, hi).astype(dtype)


@kernel("QuantizeLinear")
def quantize_linear(inputs, attrs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    dtype = _target_dtype(zp, attrs)
    if dtype not in _RANGES:
        raise NotImplementedError(f"QuantizeLinear to {dtype}")
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    s = _per_axis(scale, x, axis, block)
    z = _per_axis(zp, x, axis, block) if zp is not None else 0
    return [quantize(x, s, z, dtype)]


@kernel("DequantizeLinear")
def dequantize_linear(inputs, attrs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    s = _per_axis(scale, x, axis, block)
    z = _per_axis(zp, x, axis, block).astype(np.float64) if zp is not None else 0.0
    return [((x.astype(np.float64) - z) * s).astype(np.asarray(scale).dtype)]


@kernel("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs):
    x = inputs[0].astype(np.float32)
    lo, hi = min(0.0, float(x.min(initial=0.0))), max(0.0, float(x.max(initial=0.0)))
    if hi > lo:
        scale = np.float32((hi - lo) / 255.0)
        zp = np.uint8(np.clip(np.rint(-lo / scale), 0, 255))
    else:  # all zeros, or no elements: scale 1 as onnxruntime (a later division by it stays finite)
        scale, zp = np.float32(1.0), np.uint8(0)
    y = quantize(x, scale, zp, np.dtype(np.uint8))
    return [y, np.asarray(scale, np.float32), np.asarray(zp, np.uint8)]


def _centered(x: np.ndarray, zp, axis: int = 1) -> np.ndarray:
    """(x - zero point) in float64: exact for every 8/16-bit integer."""
    z = 0.0 if zp is None else _per_axis(zp, x, axis).astype(np.float64)
    return x.astype(np.float64) - z


@kernel("QLinearConv")
def qlinear_conv(inputs, attrs):
    x, xs, xzp, w, ws, wzp, ys, yzp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    acc = conv_im2col([_centered(x, xzp), _centered(w, wzp, 0), None], dict(attrs))[0]
    if bias is not None:
        acc += bias.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    multiplier = (np.asarray(xs, np.float64) * _per_axis(ws, acc, 1).astype(np.float64)) / np.asarray(ys, np.float64)
    return [quantize(acc * multiplier, 1.0, yzp, np.asarray(yzp).dtype)]


@kernel("QLinearMatMul")
def qlinear_matmul(inputs, attrs):
    a, as_, azp, b, bs, bzp, ys, yzp = inputs[:8]
    acc = np.matmul(_centered(a, azp, -1), _centered(b, bzp, -1))
    multiplier = (np.asarray(as_, np.float64) * np.asarray(bs, np.float64).reshape(-1)) / np.asarray(ys, np.float64)
    scaled = acc * (multiplier if multiplier.size > 1 else multiplier.reshape(()))
    return [quantize(scaled, 1.0, yzp, np.asarray(yzp).dtype)]


@kernel("ConvInteger")
def conv_integer(inputs, attrs):
    x, w = inputs[0], inputs[1]
    xzp = inputs[2] if len(inputs) > 2 else None
    wzp = inputs[3] if len(inputs) > 3 else None
    acc = conv_im2col([_centered(x, xzp), _centered(w, wzp, 0), None], dict(attrs))[0]
    return [np.rint(acc).astype(np.int32)]


@kernel("MatMulInteger")
def matmul_integer(inputs, attrs):
    a, b = inputs[0], inputs[1]
    azp = inputs[2] if len(inputs) > 2 else None
    bzp = inputs[3] if len(inputs) > 3 else None
    return [np.rint(np.matmul(_centered(a, azp, -1), _centered(b, bzp, -1))).astype(np.int32)]


@kernel("FakeQuant", domain=OPTCLI_DOMAIN)
def fake_quant(inputs, attrs):
    """Quantize to [qmin, qmax] with a per-tensor scale and zero point, then dequantize."""
    x = inputs[0]
    scale, zp = float(attrs["scale"]), float(attrs.get("zero_point", 0.0))
    qmin, qmax = float(attrs.get("qmin", -128)), float(attrs.get("qmax", 127))
    q = np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zp, qmin, qmax)
    return [((q - zp) * np.float32(scale)).astype(x.dtype)]
