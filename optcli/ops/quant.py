"""Quantization ops: ONNX's QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear, the
QOperator ops (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger), optcli's FakeQuant
(a QuantizeLinear + DequantizeLinear pair in one op: what activation quantization looks like to a
float target) and optcli's DynamicQuantizeMatMul (a dynamically quantized dense layer in one op).

Integer accumulations are computed exactly: the products of (value - zero point) pairs are
summed in float32 when no partial sum can reach 2**24 (most layers of 8-bit models), else in
float64, which holds every int32 accumulator exactly, through the same BLAS-backed Conv/MatMul
kernels as the float ops (numpy has no BLAS for integer matrices; float BLAS beats numpy's
integer matmul by far).  Requantization rounds half to even, like onnxruntime, with the
float32 arithmetic of its MLAS kernels (a float64 division or product lands differently on the
.5 ties, and a tie that flips in a shape computation changes a pad size).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from optcli import native
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qelementwise
from optcli.native import recurrent as native_recurrent
from optcli.ops.activation import fake_quantize
from optcli.ops.conv import _is_depthwise, _is_pointwise, conv_1x1, conv_depthwise, conv_im2col
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, check_length, first_input, shape_fn

_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
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


def _work_dtype(*arrays) -> type:
    """float32 unless an operand is float64: onnxruntime divides by the scale in float32
    (MlasQuantizeLinear), and a float64 division rounds differently right at the .5 ties."""
    return np.float64 if any(np.asarray(a).dtype == np.float64 for a in arrays) else np.float32


def quantize(x: np.ndarray, scale, zero_point, dtype: np.dtype) -> np.ndarray:
    """round_half_even(x / scale) + zero_point, saturated to ``dtype``: onnxruntime's arithmetic."""
    lo, hi = _RANGES[np.dtype(dtype)]
    ft = _work_dtype(x, scale)
    q = np.rint(np.asarray(x).astype(ft, copy=False) / np.asarray(scale).astype(ft, copy=False))
    return np.asarray(np.clip(q + np.asarray(zero_point, np.float64), lo, hi), dtype=dtype)


def requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point, dtype: np.dtype) -> np.ndarray:
    """An exact integer accumulator (held in float64) to ``dtype``, as onnxruntime's
    MlasRequantizeOutput: float32(acc) * float32 multiplier, rounded half to even, plus the zero
    point, saturated."""
    lo, hi = _RANGES[np.dtype(dtype)]
    y = np.rint(acc.astype(np.float32) * np.asarray(multiplier, np.float32))
    return np.asarray(np.clip(y + np.asarray(zero_point, np.float64), lo, hi), dtype=dtype)


def output_scale(x_scale, w_scale, y_scale) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32, left to right, as onnxruntime computes it."""
    return (np.float32(np.asarray(x_scale).reshape(-1)[0]) * np.asarray(w_scale, np.float32)
            / np.float32(np.asarray(y_scale).reshape(-1)[0]))


@kernel("QuantizeLinear")
def quantize_linear(inputs, attrs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    dtype = _target_dtype(zp, attrs)
    if dtype not in _RANGES:
        raise NotImplementedError(f"QuantizeLinear to {dtype}")
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    if _native_quantize(x, scale, zp, dtype):  # per tensor, float32 to 8 bits: one native pass, the same bytes
        z = int(np.asarray(zp).reshape(-1)[0]) if zp is not None else 0
        return [qelementwise.quantize(x, np.asarray(scale).reshape(-1)[0], z, dtype)]
    s = _per_axis(scale, x, axis, block)
    z = _per_axis(zp, x, axis, block) if zp is not None else 0
    return [quantize(x, s, z, dtype)]


def _native_quantize(x, scale, zp, dtype: np.dtype) -> bool:
    """Whether the native QuantizeLinear computes this one (the input of an integer plan, issue 26)."""
    scale = np.asarray(scale)
    return (type(x) is np.ndarray and x.dtype == np.float32 and scale.dtype == np.float32 and scale.size == 1
            and (zp is None or np.asarray(zp).size == 1) and dtype in _BYTES and native.available())


@kernel("DequantizeLinear")
def dequantize_linear(inputs, attrs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    if _native_dequantize(x, scale, zp):  # per tensor, 8 bits to float32: one native pass, the same bits
        z = int(np.asarray(zp).reshape(-1)[0]) if zp is not None else 0
        return [qelementwise.dequantize(x, np.asarray(scale).reshape(-1)[0], z)]
    s = _per_axis(scale, x, axis, block)
    z = _per_axis(zp, x, axis, block).astype(np.float64) if zp is not None else 0.0
    return [((x.astype(np.float64) - z) * s).astype(np.asarray(scale).dtype)]


def _native_dequantize(x, scale, zp) -> bool:
    """Whether the native DequantizeLinear computes this one (the output of an integer plan, issue 26)."""
    scale = np.asarray(scale)
    return (type(x) is np.ndarray and x.dtype in _BYTES and scale.dtype == np.float32 and scale.size == 1
            and (zp is None or (np.asarray(zp).size == 1 and np.asarray(zp).dtype == x.dtype)) and native.available())


@kernel("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs):
    x = inputs[0].astype(np.float32, copy=False)
    scale, zp = dynamic_quant_params(x)
    return [quantize(x, scale, zp, np.dtype(np.uint8)), np.asarray(scale, np.float32), np.asarray(zp, np.uint8)]


def dynamic_quant_params(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """Scale and uint8 zero point of DynamicQuantizeLinear, in float32 as onnxruntime computes
    them (its GetQuantizationParameter): the range always includes 0."""
    return _params_of_range(x.min(initial=np.float32(0)), x.max(initial=np.float32(0)))


def _params_of_range(lo: Any, hi: Any) -> tuple[np.float32, np.uint8]:
    """``dynamic_quant_params`` from the tensor's min and max (float32), widened to include 0.  The
    zero point's clip and round run on one Python float (round() rounds half to even, as rint):
    numpy's scalar clip cost more than the whole product of a small layer."""
    zero = np.float32(0)
    lo, hi = np.minimum(zero, np.float32(lo)), np.maximum(zero, np.float32(hi))
    if hi > lo:
        scale = (hi - lo) / np.float32(255)
        v = float(zero - lo / scale)  # NaN where the range is infinite: zero point 0, as numpy casts NaN
        zp = np.uint8(round(min(max(v, 0.0), 255.0)) if v == v else 0)
    else:  # all zeros, or no elements: scale 1 as onnxruntime (a later division by it stays finite)
        scale, zp = np.float32(1.0), np.uint8(0)
    return np.float32(scale), zp


def _out_dtype(zero_point) -> np.dtype:
    return np.asarray(zero_point).dtype if zero_point is not None else np.dtype(np.uint8)


def _centered(x: np.ndarray, zp, axis: int = 1, dtype: type = np.float64) -> np.ndarray:
    """(x - zero point) as floats: exact for every 8/16-bit integer in float32 or float64."""
    xf = x.astype(dtype)
    if zp is not None:
        xf -= _per_axis(zp, x, axis).astype(dtype)
    return xf


# float32 adds integers exactly while every partial sum stays below 2**24: a product of K
# centred 8-bit values whose sum of |terms| is under that bound runs through float32 BLAS (BLAS
# may reorder and fuse: every intermediate is still an exact integer), else through float64.
_FLOAT32_EXACT = float(2 ** 24)


def _span(centred: np.ndarray) -> float:
    """max |x - zero point| (one pass over the data: cheap beside the product it decides on)."""
    return float(max(centred.max(initial=0), -centred.min(initial=0)))


def int_matmul(a: np.ndarray, azp, b: np.ndarray, bzp) -> np.ndarray:
    """The exact integer product (a - azp) @ (b - bzp): float32 when exact, else float64."""
    # A's zero point is per tensor or per row (axis -2), B's per tensor or per column (axis -1).
    ac, bc = _centered(a, azp, -2 if a.ndim > 1 else -1, np.float32), _centered(b, bzp, -1, np.float32)
    if a.shape[-1] * _span(ac) * _span(bc) < _FLOAT32_EXACT:
        return np.matmul(ac, bc)
    return np.matmul(ac.astype(np.float64), bc.astype(np.float64))


def int_conv(x: np.ndarray, xzp, w: np.ndarray, wzp, attrs: dict, bias: np.ndarray | None = None) -> np.ndarray:
    """The exact integer convolution of (x - xzp) and (w - wzp), plus an int32 bias: float32 when
    every partial sum is exact in it, else float64.  Depthwise, pointwise or im2col, like Conv."""
    attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    xc, wc = _centered(x, xzp, 1, np.float32), _centered(w, wzp, 0, np.float32)
    bound = int(np.prod(w.shape[1:])) * _span(xc) * _span(wc)
    bound += float(np.abs(bias).max()) if bias is not None and bias.size else 0.0
    if bound >= _FLOAT32_EXACT:
        y = conv_im2col([xc.astype(np.float64), wc.astype(np.float64), None], attrs)[0]
    elif _is_depthwise(attrs, tuple(w.shape)):
        y = conv_depthwise([xc, wc, None], attrs)[0]
    elif _is_pointwise(attrs, tuple(w.shape)):
        y = conv_1x1([xc, wc, None], attrs)[0]
    else:
        y = conv_im2col([xc, wc, None], attrs)[0]
    if bias is not None:
        y += bias.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


@kernel("QLinearConv")
def qlinear_conv(inputs, attrs):
    x, xs, xzp, w, ws, wzp, ys, yzp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    acc = int_conv(x, xzp, w, wzp, dict(attrs), bias)
    return [requantize(acc, _per_axis(output_scale(xs, ws, ys), acc, 1), yzp, _out_dtype(yzp))]


@kernel("QLinearMatMul")
def qlinear_matmul(inputs, attrs):
    a, as_, azp, b, bs, bzp, ys, yzp = inputs[:8]
    acc = int_matmul(a, azp, b, bzp)
    multiplier = output_scale(as_, np.asarray(bs).reshape(-1), ys)
    return [requantize(acc, multiplier if multiplier.size > 1 else multiplier.reshape(()), yzp, _out_dtype(yzp))]


@kernel("ConvInteger")
def conv_integer(inputs, attrs):
    x, w = inputs[0], inputs[1]
    xzp = inputs[2] if len(inputs) > 2 else None
    wzp = inputs[3] if len(inputs) > 3 else None
    return [np.rint(int_conv(x, xzp, w, wzp, dict(attrs))).astype(np.int32)]


@kernel("MatMulInteger")
def matmul_integer(inputs, attrs):
    a, b = inputs[0], inputs[1]
    azp = inputs[2] if len(inputs) > 2 else None
    bzp = inputs[3] if len(inputs) > 3 else None
    return [np.rint(int_matmul(a, azp, b, bzp)).astype(np.int32)]


@kernel("FakeQuant", domain=OPTCLI_DOMAIN)
def fake_quant(inputs, attrs):
    """Quantize to [qmin, qmax] with a per-tensor scale and zero point, then dequantize."""
    return [fake_quantize(inputs[0], float(attrs["scale"]), float(attrs.get("zero_point", 0.0)),
                          float(attrs.get("qmin", -128)), float(attrs.get("qmax", 127)))]


@kernel("DynamicQuantizeMatMul", domain=OPTCLI_DOMAIN)
def dynamic_quantize_matmul(inputs, attrs):
    """DynamicQuantizeLinear(A) -> MatMulInteger(A_q, B) -> Cast -> Mul(a_scale * b_scale) (-> Add bias)
    in one step: what onnxruntime's quantize_dynamic writes for every MatMul, and what its
    DynamicQuantizeMatMul / MatMulIntegerToFloat fusions compute.  Inputs: A (float), B (int8 or
    uint8, [K, N]), b_scale (scalar or [N]), b_zero_point (optional, same shape), bias
    (optional, [N], float).  Each float operation rounds in float32 where the unfused graph's did,
    so the result is the unfused graph's bit for bit."""
    a, b, b_scale = inputs[0], inputs[1], np.asarray(inputs[2], np.float32)
    b_zp = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    a = a.astype(np.float32, copy=False)
    fast = _dynamic_quantize_matmul_f32(a, b, b_scale, b_zp, bias, attrs)
    if fast is not None:
        return [fast]
    a_scale, a_zp = dynamic_quant_params(a)
    acc = int_matmul(quantize(a, a_scale, a_zp, np.dtype(np.uint8)), a_zp, b, b_zp)  # exact integers
    y = acc.astype(np.float32) * (a_scale * b_scale)  # the Mul of the two scales, then the Mul by it
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    return [np.asarray(y, np.float32)]


def _dynamic_quantize_matmul_f32(a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zp: Any, bias: Any,
                                 attrs: dict[str, Any]) -> np.ndarray | None:
    """``dynamic_quantize_matmul`` with the same float32 operations in the same order, without its
    detours: A's centred values straight from ``clip(rint(A / scale), -zp, 255 - zp)`` (the uint8
    tensor minus its zero point, never made), the leading dims folded into one 2-D product, B
    centred once per step (the step's memo), the scales and bias applied in place.  A speech
    model's [1, 100, 64] x [64, 29] layer: 69 -> 46 us (same process; onnxruntime ~11).  None where it does not apply (a
    non-finite A, whose quantization the general path defines; an empty one; B not a 2-D 8-bit
    matrix), and the caller takes the general path."""
    n = b.shape[-1] if b.ndim else 0
    if not (a.ndim >= 1 and a.size and b.ndim == 2 and b.dtype in (np.int8, np.uint8) and a.shape[-1] == b.shape[0]
            and b_scale.size in (1, n) and (bias is None or np.shape(bias) in ((n,), (1, n)))):
        return None
    bc, b_span = _centred_weight(attrs, b, b_zp)
    exact = b.shape[0] * 255.0 * b_span < _FLOAT32_EXACT
    if exact and native.available():  # one C pass for the range, one for the values, and the native GEMM
        made = native_recurrent.dynamic_quantize(np.ascontiguousarray(a.reshape(-1, a.shape[-1])))
        if made is None:  # a non-finite A: the general path defines its quantization
            return None
        q, a_scale = made[0], made[1]
        packed = _dot_weight(attrs, b, b_zp, bc)
        if packed is not None:  # AVX-512 VNNI: the product in int32, scales and bias in the same pass
            out = np.empty((q.shape[0], n), np.float32)
            col = b_scale.reshape(-1) if b_scale.size > 1 else np.full(n, b_scale.reshape(()), np.float32)
            b_vec = None if bias is None else np.ascontiguousarray(np.asarray(bias, np.float32).reshape(-1))
            if native_recurrent.dynamic_qrows(q, a_scale, made[2], packed, 0, np.ascontiguousarray(col), b_vec, out):
                return out.reshape(a.shape[:-1] + (n,))
        acc = native.gemm_conv(q, bc[None])[0]
    else:
        lo, hi = a.min(), a.max()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        a_scale, a_zp = _params_of_range(lo, hi)
        q = np.divide(a.reshape(-1, a.shape[-1]), a_scale)  # float32, as quantize divides
        np.rint(q, out=q)
        zp = np.float32(a_zp)
        np.maximum(q, -zp, out=q)  # == clip(rint + zp, 0, 255) - zp, exactly (np.clip: 4 us more)
        np.minimum(q, np.float32(255) - zp, out=q)
        acc = np.matmul(q, bc) if exact else np.matmul(q.astype(np.float64), bc.astype(np.float64)).astype(np.float32)
    np.multiply(acc, a_scale * b_scale.reshape(-1) if b_scale.size > 1 else a_scale * b_scale.reshape(()), out=acc)
    if bias is not None:
        np.add(acc, np.asarray(bias, np.float32).reshape(-1), out=acc)
    return acc.reshape(a.shape[:-1] + (b.shape[1],))


def _centred_weight(attrs: dict[str, Any], b: np.ndarray, b_zp: Any) -> tuple[np.ndarray, float]:
    """B minus its zero point in float32 and its span, kept in a bound step's memo while the same
    B and zero point arrays come back (a plan's constants)."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("centred weight") if memo is not None else None
    if hit is not None and hit[0] is b and hit[1] is b_zp:
        return hit[2], hit[3]
    bc = _centered(b, b_zp, -1, np.float32)
    span = _span(bc)
    if memo is not None:
        memo["centred weight"] = (b, b_zp, bc, span)
    return bc, span


def _dot_weight(attrs: dict[str, Any], b: np.ndarray, b_zp: Any, bc: np.ndarray) -> Any:
    """B's centred integers in vpdpbusd's int8 panels (``native_recurrent.dot_projection``), made once
    per bound step; None outside a plan's step (no memo to keep them in), where they do not fit int8
    or the CPU has no AVX-512 VNNI."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is None:
        return None
    hit = memo.get("dot weight")
    if hit is not None and hit[0] is b and hit[1] is b_zp:
        return hit[2]
    packed = native_recurrent.dot_projection(bc[None])
    memo["dot weight"] = (b, b_zp, packed)
    return packed


# ----------------------------------------------------------------------------- shape functions

shape_fn(["QuantizeLinear", "DequantizeLinear"])(first_input)
shape_fn("FakeQuant", domain=OPTCLI_DOMAIN)(first_input)


@shape_fn("DynamicQuantizeLinear")
def _dynamic_quantize_shape(args: ShapeArgs) -> list[Shape]:
    return [args.shape(0), (), ()]  # y, and a per-tensor scale and zero point


@shape_fn("QLinearConv")
def _qlinear_conv_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.conv import conv_shape

    return conv_shape(args, 0, 3, 8)


@shape_fn("ConvInteger")
def _conv_integer_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.conv import conv_shape

    return conv_shape(args, 0, 1, b_at=len(args.shapes))  # no bias


@shape_fn("QLinearMatMul")
def _qlinear_matmul_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.gemm import matmul_shape

    return [matmul_shape(args.shape(0), args.shape(3))]


@shape_fn("MatMulInteger")
def _matmul_integer_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.gemm import matmul_shape

    return [matmul_shape(args.shape(0), args.shape(1))]


@shape_fn("DynamicQuantizeMatMul", domain=OPTCLI_DOMAIN)
def _dynamic_quantize_matmul_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.gemm import matmul_shape

    out = matmul_shape(args.shape(0), args.shape(1))
    if out:
        check_length(args, 4, out[-1], "the bias")
    return [out]
