"""optcli.QAdd: the residual Add of a quantized model with its inputs and output kept as integers (u8 or
s8), made by ``passes/fuse_qdq_add.py`` from DequantizeLinear, DequantizeLinear -> Add -> [Relu] ->
QuantizeLinear chains, so residual blocks hand bytes from integer conv to integer conv.

Inputs: a, b (uint8 or int8, the same shape).  Attributes: a_scale, a_zero_point, b_scale, b_zero_point,
y_scale, y_zero_point, qmin, qmax (the output dtype's range, narrowed by a fused Relu), a_signed, b_signed,
y_signed (0: uint8, 1: int8); checked at load (runtime/step_checks.py).

The arithmetic is onnxruntime's QLinearAdd (MLAS): scale ratios and zero points folded into float32
fused multiply-adds, rounded half to even (``optcli.ops.quant_contrib.qlinear_add``), with the clamp.
The numpy function is the reference; kernels/host/qelementwise.c computes the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import NbFormatError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qelementwise
from optcli.ops.quant_contrib import _fma
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, shape_fn


def _dtype(signed: Any) -> np.dtype:
    return np.dtype(np.int8) if int(signed) else np.dtype(np.uint8)


def params(attrs: dict[str, Any]) -> np.ndarray:
    """float32 [a_scale / y_scale, b_scale / y_scale, y_zp - (ratio_a * a_zp + ratio_b * b_zp), qmin, qmax],
    each rounded in float32 where onnxruntime's MLAS rounds it."""
    f = np.float32
    sy = f(attrs["y_scale"])
    ra, rb = f(attrs["a_scale"]) / sy, f(attrs["b_scale"]) / sy
    fixed = f(attrs["y_zero_point"]) - (ra * f(attrs["a_zero_point"]) + rb * f(attrs["b_zero_point"]))
    return np.array([ra, rb, fixed, attrs["qmin"], attrs["qmax"]], dtype=np.float32)


def reference(a: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    p = params(attrs)
    r = _fma(a.astype(np.float32), p[0], _fma(b.astype(np.float32), p[1], p[2]))
    return np.clip(np.rint(r), p[3], p[4]).astype(_dtype(attrs.get("y_signed", 0)))


@kernel("QAdd", domain=OPTCLI_DOMAIN)
def qadd(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A residual Add of u8/s8 tensors into u8/s8, requantized as onnxruntime's QLinearAdd."""
    a, b = inputs[0], inputs[1]
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get("qadd") if memo is not None else None
    if hit is not None and hit[0] == a.shape and native.available() and a.flags.c_contiguous \
            and b.flags.c_contiguous and (a.dtype, b.dtype) == hit[1]:
        return [hit[2](a, b)]
    want = (_dtype(attrs.get("a_signed", 0)), _dtype(attrs.get("b_signed", 0)))
    if (a.dtype, b.dtype) != want or a.shape != b.shape:
        raise NbFormatError(f"QAdd takes two {want[0]}/{want[1]} tensors of one shape, got {a.dtype} {a.shape} and "
                            f"{b.dtype} {b.shape}: the plan is corrupted or crafted (only optcli's passes make QAdd)")
    if native.available():
        p, y_dtype = params(attrs), _dtype(attrs.get("y_signed", 0))
        if memo is not None:  # the step's call, worked out once (qelementwise.prepared_qadd)
            call = qelementwise.prepared_qadd(a.shape, a.dtype, b.dtype, p, y_dtype)
            memo["qadd"] = (a.shape, (a.dtype, b.dtype), call)
        return [qelementwise.qadd(a, b, p, y_dtype)]
    native.note_unavailable()
    return [reference(a, b, attrs)]


@shape_fn("QAdd", domain=OPTCLI_DOMAIN)
def _qadd_shape(args: ShapeArgs) -> list[Shape]:
    a, b = args.shape(0), args.shape(1)
    if a is not None and b is not None and (len(a) != len(b) or any(
            fixed(x) is not None and fixed(y) is not None and fixed(x) != fixed(y) for x, y in zip(a, b))):
        raise ShapeDerivationError(f"QAdd's operands have shapes {list(a)} and {list(b)}; they must be equal")
    return [a if a is not None else b]
