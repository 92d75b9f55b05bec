"""The squeeze-excite block of a quantized model in integers: optcli.QGlobalAveragePool and optcli.QMul.

A QDQ MobileNetV3's squeeze-excite block dequantizes its feature map for a GlobalAveragePool and again for
the Mul by the per-channel gate, then quantizes both results (issue 26).  ``passes/fuse_qdq_se.py`` turns
DequantizeLinear -> GlobalAveragePool -> QuantizeLinear into QGlobalAveragePool and DequantizeLinear x2 ->
Mul -> QuantizeLinear with a [N, C, 1, 1] operand into QMul; the bytes go from conv to conv.

QGlobalAveragePool: x (u8 / s8, [N, C, spatial...]) -> y [N, C, 1...], onnxruntime's QLinearGlobalAveragePool:
the exact integer sum of x - x_zero_point per channel, times x_scale / (y_scale * pixels) in float32, rounded
half to even, plus y_zero_point, clamped to [qmin, qmax].

QMul: x (u8 / s8 [N, C, spatial...]) and a gate g (u8 / s8 [N, C, 1...]) -> y of x's shape, onnxruntime's
QLinearMul: the exact integer product (x - x_zp) * (g - g_zp), times x_scale * g_scale / y_scale in float32,
rounded half to even, plus y_zero_point, clamped.

Attributes (numbers, checked at load: runtime/step_checks.py): the scales, zero points and signedness (0 uint8,
1 int8) of each input and of y, qmin and qmax.  Both agree with the float island they replace (dequantize, float
op, quantize) to within one quantization step: the float island rounds the dequantized values and the mean or
product before quantizing, these round once.  The numpy functions are the reference; kernels/host/qelementwise.c
computes the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import NbFormatError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qelementwise
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, shape_fn

_F32 = np.float32


def dtype_of(signed: Any) -> np.dtype:
    return np.dtype(np.int8) if int(signed) else np.dtype(np.uint8)


def _finish(v: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """rint, plus y's zero point, clamped to [qmin, qmax], in y's dtype (float32 throughout, as the C code)."""
    y = np.rint(v) + _F32(int(attrs["y_zero_point"]))
    return np.clip(y, int(attrs["qmin"]), int(attrs["qmax"])).astype(dtype_of(attrs.get("y_signed", 0)))


def _check_input(x: np.ndarray, attrs: dict[str, Any], which: str, op: str) -> None:
    want = dtype_of(attrs.get(f"{which}_signed", 0))
    if x.dtype != want or x.ndim < 3:
        raise NbFormatError(f"{op} reads a {want} tensor [N, C, spatial...] as '{which}', got {x.dtype} "
                            f"{list(x.shape)}: the plan is corrupted or crafted (only optcli's passes make {op})")


# ----------------------------------------------------------------------------- QGlobalAveragePool

def gap_multiplier(attrs: dict[str, Any], pixels: int) -> np.float32:
    return _F32(attrs["x_scale"]) / (_F32(attrs["y_scale"]) * _F32(pixels))


def gap_reference(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    axes = tuple(range(2, x.ndim))
    pixels = int(np.prod(x.shape[2:]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(attrs["x_zero_point"]) * pixels
    return _finish(acc.astype(_F32) * gap_multiplier(attrs, pixels), attrs)


@kernel("QGlobalAveragePool", domain=OPTCLI_DOMAIN)
def qglobal_average_pool(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The per-channel mean of a u8 / s8 tensor, requantized as onnxruntime's QLinearGlobalAveragePool."""
    x = inputs[0]
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("qgap") if memo is not None else None
    if hit is not None and hit[0] == x.shape and hit[1] == x.dtype and x.flags.c_contiguous:
        return [hit[2](x)]
    _check_input(x, attrs, "x", "QGlobalAveragePool")
    pixels = int(np.prod(x.shape[2:]))
    if not native.available() or pixels > 1 << 23:
        native.note_unavailable()
        return [gap_reference(x, attrs)]
    params = np.array([gap_multiplier(attrs, pixels), attrs["qmin"], attrs["qmax"]], _F32)
    zps = np.array([attrs["x_zero_point"], attrs["y_zero_point"], attrs.get("x_signed", 0)], np.int32)
    call = qelementwise.prepared_qgap(x.shape, x.dtype, params, zps, dtype_of(attrs.get("y_signed", 0)))
    if memo is not None:
        memo["qgap"] = (x.shape, x.dtype, call)
    return [call(np.ascontiguousarray(x))]


@shape_fn("QGlobalAveragePool", domain=OPTCLI_DOMAIN)
def _qgap_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.pool import global_pool_shape

    return [global_pool_shape(args.shape(0))]


# ----------------------------------------------------------------------------- QMul

def mul_multiplier(attrs: dict[str, Any]) -> np.float32:
    return _F32(attrs["x_scale"]) * _F32(attrs["g_scale"]) / _F32(attrs["y_scale"])


def mul_reference(x: np.ndarray, g: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    prod = (x.astype(np.int32) - int(attrs["x_zero_point"])) * (g.astype(np.int32) - int(attrs["g_zero_point"]))
    return _finish(prod.astype(_F32) * mul_multiplier(attrs), attrs)


@kernel("QMul", domain=OPTCLI_DOMAIN)
def qmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A u8 / s8 feature map times a per-channel u8 / s8 gate, requantized as onnxruntime's QLinearMul."""
    x, g = inputs[0], inputs[1]
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("qmul") if memo is not None else None
    if hit is not None and hit[0] == (x.shape, g.shape) and hit[1] == (x.dtype, g.dtype) and x.flags.c_contiguous \
            and g.flags.c_contiguous:
        return [hit[2](x, g)]
    _check_input(x, attrs, "x", "QMul")
    _check_input(g, attrs, "g", "QMul")
    if g.shape != (*x.shape[:2], *([1] * (x.ndim - 2))):
        raise NbFormatError(f"QMul's gate must be [N, C, 1...] against its input {list(x.shape)}, got "
                            f"{list(g.shape)}: the plan is corrupted or crafted")
    if not native.available():
        native.note_unavailable()
        return [mul_reference(x, g, attrs)]
    params = np.array([mul_multiplier(attrs), attrs["qmin"], attrs["qmax"]], _F32)
    zps = np.array([attrs["x_zero_point"], attrs["g_zero_point"], attrs["y_zero_point"], attrs.get("x_signed", 0),
                    attrs.get("g_signed", 0)], np.int32)
    call = qelementwise.prepared_qmul(x.shape, x.dtype, g.dtype, params, zps, dtype_of(attrs.get("y_signed", 0)))
    if memo is not None:
        memo["qmul"] = ((x.shape, g.shape), (x.dtype, g.dtype), call)
    return [call(np.ascontiguousarray(x), np.ascontiguousarray(g))]


@shape_fn("QMul", domain=OPTCLI_DOMAIN)
def _qmul_shape(args: ShapeArgs) -> list[Shape]:
    x, g = args.shape(0), args.shape(1)
    if x is not None and g is not None and (len(x) != len(g) or any(
            fixed(a) is not None and fixed(b) is not None and fixed(a) != fixed(b) for a, b in zip(x[:2], g[:2]))):
        raise ShapeDerivationError(f"QMul's gate {list(g)} is not [N, C, 1...] against {list(x)}")
    return [x]
