"""Gemm, MatMul and the fused FullyConnected op: thin wrappers that keep everything in one BLAS call.

numpy's ``matmul`` on a stack of matrices against one 2-D weight loops over the stack; folding
the leading dims into the row dimension turns that into a single large GEMM, which is what
makes transformer-style ``[B, S, K] @ [K, N]`` layers fast.  float16 goes through float32
(BLAS has no half precision, and numpy's fallback loop is very slow).

``FullyConnected`` (domain ``optcli``) is what the MatMul+Add fusion produces: inputs
``(X, W, B?)`` with ``W`` 2-D ``[K, N]`` and ``X`` of any rank >= 1, computing ``X @ W + B``
followed by the fused activation epilogue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN
from optcli.ops.activation import apply_activation, apply_output_quant, epilogue
from optcli.ops.registry import kernel
from optcli.ops.spatial import compute_dtype, prod


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` semantics, as one GEMM when ``b`` is a single matrix."""
    if a.ndim >= 3 and b.ndim == 2:
        rows = prod(a.shape[:-1])  # not -1: ambiguous when K is 0
        return np.matmul(a.reshape(rows, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[-1],))
    return np.matmul(a, b)


def _opt(inputs: list[np.ndarray | None], i: int) -> np.ndarray | None:
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


@kernel("MatMul")
def matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """numpy matmul semantics, including 1-D operands and batch broadcasting."""
    a, b = inputs[0], inputs[1]
    ct = compute_dtype(a.dtype)
    y = _matmul(a.astype(ct, copy=False), b.astype(ct, copy=False))
    return [np.asarray(y).astype(a.dtype, copy=False)]


@kernel("Gemm")
def gemm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``alpha * A' @ B' + beta * C`` (C broadcast), then the fused activation epilogue."""
    a, b, c = inputs[0], inputs[1], _opt(inputs, 2)
    ct = compute_dtype(a.dtype)
    a = a.astype(ct, copy=False)
    b = b.astype(ct, copy=False)
    if int(attrs.get("transA", 0)):
        a = a.T
    if int(attrs.get("transB", 0)):
        b = b.T
    y = a @ b
    alpha = float(attrs.get("alpha", 1.0))
    beta = float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y *= ct.type(alpha)
    if c is not None and beta != 0.0:
        c = c.astype(ct, copy=False)
        if beta != 1.0:
            c = c * ct.type(beta)
        if np.broadcast_shapes(y.shape, c.shape) == y.shape:
            y += c
        else:
            y = y + c
    y = apply_activation(y, *epilogue(attrs))
    return [apply_output_quant(y.astype(inputs[0].dtype, copy=False), attrs)]


@kernel("FullyConnected", domain=OPTCLI_DOMAIN)
def fully_connected(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``X @ W + B`` over the last axis of X (W is [K, N]), then the fused activation epilogue."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    ct = compute_dtype(x.dtype)
    y = _matmul(x.astype(ct, copy=False), w.astype(ct, copy=False))
    y = np.asarray(y)
    if bias is not None:
        b = bias.astype(ct, copy=False)
        if np.broadcast_shapes(y.shape, b.shape) == y.shape:
            y += b
        else:
            y = y + b
    y = apply_activation(y, *epilogue(attrs))
    return [apply_output_quant(np.asarray(y).astype(x.dtype, copy=False), attrs)]
