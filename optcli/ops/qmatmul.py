"""optcli.QMatMul: a quantized MatMul / Gemm whose input and output stay integers (u8 or s8): the dense layers
of a QDQ model (classifier heads, a transformer's projections) run on bytes, as its convs do (optcli.QConv).
``passes/fuse_qdq_matmul.py`` makes them from DequantizeLinear -> MatMul / Gemm -> [Add bias] ->
[Relu/Clip] -> QuantizeLinear chains.

Inputs: x (uint8 or int8 [..., K]), w (int8 [K, M], MatMul's own layout: a Gemm's transposed B is stored
untransposed by the pass, symmetric: zero point 0), bias (int32 [M], in units of x_scale * w_scale[m],
optional).  Attributes: QConv's quantization (x_scale, x_zero_point, w_scale: one or one per output
column, y_scale, y_zero_point, qmin, qmax, x_signed, y_signed), checked at load like QConv's
(``runtime/step_checks.py``).  Output: [..., M].

The arithmetic is onnxruntime's QLinearMatMul / QGemm: the exact integer sum of (x - x_zero_point) * w
plus the bias, float32(acc) * (x_scale * w_scale[m] / y_scale in float32), rounded half to even, plus
y_zero_point, clamped to [qmin, qmax].  The numpy function here is the reference.  The native kernel
(kernels/host/qmatmul.c, through ``qgemm.prepared_qmatmul``) reads x [R, K] and writes y [R, M] where they
lie, its vectors along the output columns (so a classifier head's single row fills them); its packed weights,
for the dot-product path in use (AVX-512 VNNI, AVX-VNNI, AVX2, plain C, aarch64 sdot), are made once per step,
on its first run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import NbFormatError
from optcli.ir import OPTCLI_DOMAIN
from optcli.native import qgemm
from optcli.ops.qconv import check_bias_and_scales, dtype_of, multiplier, run_memoized
from optcli.ops.quant import int_matmul
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, shape_fn

_INT32 = 2**31


def _check_inputs(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> None:
    """QMatMul steps are made only by optcli's pass, with these dtypes and shapes: anything else comes from a
    corrupted or crafted plan (exit 2; the load checks catch the constants first)."""
    if x.dtype != dtype_of(attrs.get("x_signed", 0)) or w.dtype != np.int8 or x.ndim < 1 or w.ndim != 2 \
            or x.shape[-1] != w.shape[0]:
        raise NbFormatError(f"QMatMul takes a {dtype_of(attrs.get('x_signed', 0))} input [..., K] and an int8 "
                            f"weight [K, M], got {x.dtype} {x.shape} and {w.dtype} {w.shape}: the plan is "
                            "corrupted or crafted")
    check_bias_and_scales("QMatMul", bias, w.shape[1], attrs, "output columns")


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    """The exact integer product (float32 where exact, else float64), the bias, the requantization."""
    acc = int_matmul(x, np.asarray(int(attrs["x_zero_point"])), w, None).astype(np.float64)
    if bias is not None:
        acc += bias.astype(np.float64)
    y = np.rint(acc.astype(np.float32) * multiplier(attrs, w.shape[1])) + np.float32(int(attrs["y_zero_point"]))
    return np.clip(y, int(attrs["qmin"]), int(attrs["qmax"])).astype(dtype_of(attrs.get("y_signed", 0)))


def _native_call(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any]) -> Any:
    """The prepared native call for inputs of x's shape and dtype, or None where the library is absent or the
    step is out of its reach (no rows or no K, an accumulator that could leave int32)."""
    if not native.available():
        native.note_unavailable()
        return None
    k, m = w.shape
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    bound = k * 255 * 128 + (int(np.abs(bias.astype(np.int64)).max()) if bias is not None and bias.size else 0)
    if k == 0 or m == 0 or rows == 0 or k > qgemm.MAX_K or bound >= _INT32:
        return None
    qp = tuple(int(attrs[a]) for a in ("x_zero_point", "y_zero_point", "qmin", "qmax")) + (
        int(attrs.get("x_signed", 0)), int(attrs.get("y_signed", 0)))
    rows_call = qgemm.prepared_qmatmul(rows, x.dtype, np.ascontiguousarray(w), bias, multiplier(attrs, m), qp,
                                       dtype_of(attrs.get("y_signed", 0)))
    out_shape = (*x.shape[:-1], m)
    return lambda v: rows_call(v).reshape(out_shape)


@kernel("QMatMul", domain=OPTCLI_DOMAIN)
def qmatmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """x [..., K] (u8/s8) by int8 w [K, M] to u8/s8: exact int32 accumulation, onnxruntime's requantization."""
    return run_memoized("qmatmul", inputs, attrs, _check_inputs, _native_call, reference)


@shape_fn("QMatMul", domain=OPTCLI_DOMAIN)
def _qmatmul_shape(args: ShapeArgs) -> list[Shape]:
    from optcli.ops.gemm import matmul_shape

    w, scales = args.shape(1), args.attrs.get("w_scale")
    if w is not None and len(w) != 2:
        raise ShapeDerivationError(f"QMatMul's weight has rank {len(w)}, not 2")
    m = fixed(w[1]) if w is not None else None
    if isinstance(scales, list) and m is not None and len(scales) not in (1, m):
        raise ShapeDerivationError(f"{len(scales)} weight scales for {m} output columns")
    return [matmul_shape(args.shape(0), w)]
