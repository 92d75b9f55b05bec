"""optcli.QConv: a quantized 2-D convolution whose input and output stay integers (u8 or s8), so that
consecutive quantized convs of a QDQ model hand each other bytes with no float in between
(``passes/fuse_qdq_conv.py`` makes them from DequantizeLinear -> Conv -> [Relu/Clip] ->
QuantizeLinear chains and from QLinearConv).

Inputs: x (uint8 or int8), w (int8 [M, C / group, KH, KW], symmetric: zero point 0), bias (int32 [M], in
units of x_scale * w_scale[m], optional).  Attributes: Conv's window (strides, pads, dilations, group,
kernel_shape, auto_pad) and the quantization, recorded as numbers so the load checks see them
(``runtime/step_checks.py``): x_scale, x_zero_point, w_scale (one per output channel, or one),
y_scale, y_zero_point, qmin, qmax (the output dtype's range narrowed by a fused Relu / Clip), x_signed
and y_signed (0: uint8, 1: int8).

The arithmetic is onnxruntime's QLinearConv: the exact integer sum of (x - x_zero_point) * w plus the
bias, float32(acc) * (x_scale * w_scale[m] / y_scale in float32), rounded half to even, plus
y_zero_point, clamped to [qmin, qmax].  The numpy function here is the reference; the native library
(kernels/host/qgemm.c) is the fast path and computes the same integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import NbFormatError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qgemm
from optcli.ops.quant import int_conv
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, shape_fn
from optcli.ops.spatial import window

QUANT_ATTRS = ("x_scale", "x_zero_point", "w_scale", "y_scale", "y_zero_point", "qmin", "qmax", "x_signed",
               "y_signed")
_INT32 = 2**31


def dtype_of(signed: Any) -> np.dtype:
    return np.dtype(np.int8) if int(signed) else np.dtype(np.uint8)


def check_bias_and_scales(op: str, bias: np.ndarray | None, n: int, attrs: dict[str, Any], unit: str) -> None:
    """An integer step's int32 bias [n] and its 1 or n weight scales (QConv: output channels, QMatMul:
    output columns): anything else comes from a corrupted or crafted plan, NbFormatError."""
    if bias is not None and (bias.dtype != np.int32 or bias.shape != (n,)):
        raise NbFormatError(f"{op}'s bias must be int32 [{n}], got {bias.dtype} {bias.shape}: the plan is "
                            "corrupted or crafted")
    if len(attrs["w_scale"]) not in (1, n):
        raise NbFormatError(f"{op} has {len(attrs['w_scale'])} weight scales for {n} {unit}: the plan is "
                            "corrupted or crafted")


def multiplier(attrs: dict[str, Any], m: int) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32, left to right, per output channel (onnxruntime's order)."""
    ws = np.asarray(attrs["w_scale"], np.float64).astype(np.float32).reshape(-1)
    mult = np.float32(attrs["x_scale"]) * ws / np.float32(attrs["y_scale"])
    return np.ascontiguousarray(np.broadcast_to(mult, (m,)), dtype=np.float32)


def _check_inputs(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> None:
    """QConv steps are made only by optcli's passes, with these dtypes: anything else comes from a
    corrupted or crafted plan (its fault, exit 2, not a bug of ours; the load checks catch the
    constants first, runtime/step_checks.py)."""
    if x.dtype != dtype_of(attrs.get("x_signed", 0)) or w.dtype != np.int8 or x.ndim != 4 or w.ndim != 4:
        raise NbFormatError(f"QConv takes a 4-D {dtype_of(attrs.get('x_signed', 0))} input and an int8 weight, "
                            f"got {x.dtype} {x.shape} and {w.dtype} {w.shape}: the plan is corrupted or crafted")
    check_bias_and_scales("QConv", bias, w.shape[0], attrs, "output channels")


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    """The exact integer convolution (float64 where float32 would not hold it) and the requantization."""
    conv_attrs = {k: v for k, v in attrs.items() if k not in QUANT_ATTRS}
    acc = int_conv(x, np.asarray(int(attrs["x_zero_point"])), w, None, conv_attrs, bias)
    mult = multiplier(attrs, w.shape[0]).reshape(1, -1, 1, 1)
    y = np.rint(acc.astype(np.float32) * mult) + np.float32(int(attrs["y_zero_point"]))
    return np.clip(y, int(attrs["qmin"]), int(attrs["qmax"])).astype(dtype_of(attrs.get("y_signed", 0)))


def _native_call(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> Any:
    """The prepared native call for this input, or None where the library is absent or the step is out
    of its reach (negative pads, an accumulator that could leave int32)."""
    if not native.available():
        native.note_unavailable()
        return None
    win = window(attrs, x.shape[2:], w.shape[2:])
    k = int(np.prod(w.shape[1:]))
    bound = k * 255 * 128 + (int(np.abs(bias.astype(np.int64)).max()) if bias is not None and bias.size else 0)
    if any(p < 0 for p in win.pad_begin) or k > qgemm.MAX_K or bound >= _INT32 or x.shape[0] == 0:
        return None
    geom = (*x.shape, w.shape[0], *w.shape[2:], *win.strides, *win.dilations, *win.pad_begin, *win.out,
            int(attrs.get("group", 1)))
    qp = tuple(int(attrs[a]) for a in ("x_zero_point", "y_zero_point", "qmin", "qmax")) + (
        int(attrs.get("x_signed", 0)), int(attrs.get("y_signed", 0)))
    return qgemm.prepared_qconv(x.shape, x.dtype, np.ascontiguousarray(w), bias, multiplier(attrs, w.shape[0]),
                                geom, qp, dtype_of(attrs.get("y_signed", 0)))


def run_memoized(key: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], check, native_call,
                 ref) -> list[np.ndarray]:
    """A weighted integer step's run (QConv, QMatMul): the native call prepared for this input's shape and dtype
    (weights packed) kept in the step's memo and reused while its weight and bias are the same arrays; else
    ``check`` the inputs and prepare it, or run the numpy reference ``ref`` where ``native_call`` gives None."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    memo = attrs.memo if type(attrs) is StepAttrs else None
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is w and hit[1] is bias and hit[2] == x.shape and hit[3] == x.dtype:
        return [hit[4](np.ascontiguousarray(x))]
    check(x, w, bias, attrs)
    call = native_call(x, w, bias, attrs)
    if call is None:
        return [ref(x, w, bias, attrs)]
    if memo is not None:
        memo[key] = (w, bias, x.shape, x.dtype, call)
    return [call(np.ascontiguousarray(x))]


@kernel("QConv", domain=OPTCLI_DOMAIN)
def qconv(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """A quantized 2-D conv from u8/s8 to u8/s8: exact int32 accumulation, onnxruntime's requantization."""
    return run_memoized("qconv", inputs, attrs, _check_inputs, _native_call, reference)


@shape_fn("QConv", domain=OPTCLI_DOMAIN)
def _qconv_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.conv import conv_shape

    out = conv_shape(args, 0, 1, 2)
    w, scales = args.shape(1), args.attrs.get("w_scale")
    m = fixed(w[0]) if w is not None else None
    if isinstance(scales, list) and m is not None and len(scales) not in (1, m):
        raise ShapeDerivationError(f"{len(scales)} weight scales for {m} output channels")
    return out
