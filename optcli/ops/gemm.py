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

from optcli import native
from optcli.ir import OPTCLI_DOMAIN
from optcli.ops.activation import activate, apply_output_quant, epilogue, fake_quantize, output_quant
from optcli.ops.registry import StepAttrs, kernel
from optcli.ops.shape_functions import (
    Shape,
    ShapeArgs,
    ShapeDerivationError,
    broadcast,
    check_length,
    same_dim,
    shape_fn,
    show,
)
from optcli.ops.spatial import compute_dtype, prod


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul`` semantics, as one GEMM when ``b`` is a single matrix."""
    if a.ndim >= 3 and b.ndim == 2:
        rows = prod(a.shape[:-1])  # not -1: ambiguous when K is 0
        return np.matmul(a.reshape(rows, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[-1],))
    return np.matmul(a, b)


def _opt(inputs: list[np.ndarray | None], i: int) -> np.ndarray | None:
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


# OpenBLAS (numpy's BLAS) runs a product on one thread up to this many multiply-adds
# (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD); above it, at 2 threads or
# more, its workers wake for the product and spin after it, fighting the native pool's for the
# cores, and a worker that another process keeps off its core stalls the whole product: on a
# 2-core machine shared with two compilers a mel front end's [98, 201] @ [201, 40] took 14.7 ms
# through BLAS at 2 threads against 29 us at 1 and 47 us in the native GEMM on the pool.  So
# larger products run in the native GEMM when the pool has threads to give (docs/design.md).
BLAS_ONE_THREAD_MACS = 65536 * 4


def on_the_pool(rows: int, k: int, n: int, dtype: np.dtype) -> bool:
    """Whether ``[rows, K] @ [K, N]`` in ``dtype`` runs in the native GEMM on the pool
    (``pool_matmul``) rather than in BLAS: float32, above BLAS's one-thread size, with a pool of
    2 threads or more (at 1 thread BLAS's kernels are the faster on these shapes)."""
    return (dtype == np.float32 and rows * k * n > BLAS_ONE_THREAD_MACS and native.available()
            and native.get_num_threads() > 1)


def pool_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for float32 ``a`` [rows, K] and ``b`` [K, N] in the native GEMM (its thin path:
    the rows of ``a`` against ``b`` streamed once), split over the native pool."""
    return native.gemm_conv(a, b[None])[0]


@kernel("MatMul")
def matmul(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """numpy matmul semantics, including 1-D operands and batch broadcasting."""
    a, b = inputs[0], inputs[1]
    if a.ndim >= 2 and b.ndim == 2 and a.dtype == b.dtype and a.shape[-1] == b.shape[0] \
            and on_the_pool(prod(a.shape[:-1]), b.shape[0], b.shape[1], a.dtype):
        y = pool_matmul(a.reshape(-1, a.shape[-1]), b)
        return [y.reshape(a.shape[:-1] + (b.shape[1],))]
    if a.dtype is _F32 and b.dtype is _F32:  # nothing to cast: ~1.5 us of casts and checks less a call
        y = _matmul(a, b)  # (a decoder's attention context, [1, 1, T] x [1, T, C], every step)
        return [y if type(y) is np.ndarray else np.asarray(y)]  # 1-D x 1-D: numpy gives a scalar
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
    y = activate(y, *epilogue(attrs))
    return [apply_output_quant(y.astype(inputs[0].dtype, copy=False), attrs)]


# A product runs in numpy's matmul where OpenBLAS (numpy's BLAS) keeps it on one thread: a gemv of
# fewer than 2304 x 4 weights (interface/gemv.c), a gemm of at most BLAS_ONE_THREAD_MACS.  Above,
# at 2 threads, its worker spins on the other core for the rest of the run (a decoder's Loop took
# twice the CPU time), so larger layers keep the native call.
_SMALL_FC = 2304 * 4  # W's elements: fewer than this
_SMALL_FC_MACS = BLAS_ONE_THREAD_MACS  # rows x K x N: at most this


@kernel("FullyConnected", domain=OPTCLI_DOMAIN)
def fully_connected(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """``X @ W + B`` over the last axis of X (W is [K, N]), then the fused activation epilogue."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    rows_fc = _fc_rows(attrs, w, bias)
    if rows_fc is not None:
        y = rows_fc(x)
        if y is not None:
            return [y]
    small = _small_fc(attrs, w, bias)
    if small is not None and type(x) is np.ndarray and x.dtype is _F32 and 0 < x.size and x.ndim \
            and x.shape[-1] == w.shape[0] and x.size * w.shape[1] <= _SMALL_FC_MACS:
        return [small(x)]
    fast = _prepared_fc(attrs, x, w, bias)
    if fast is not None:
        return [fast(x)]
    ct = compute_dtype(x.dtype)
    rows = prod(x.shape[:-1])
    if rows >= _GEMM_FC_ROWS:
        gemm_fc = _gemm_fc(attrs, w, bias)
        y = None if gemm_fc is None else gemm_fc(x)
        if y is not None:
            return [y]
    if native.available() and ct == np.float32 and w.ndim == 2 and 1 <= rows < 16 and x.shape[-1] \
            and w.shape[1] and (bias is None or bias.shape in ((w.shape[1],), (1, w.shape[1]))):
        # A classifier's head in the native GEMM: a BLAS call here would leave BLAS's threads
        # spinning into the next run, stealing the cores from the native pool
        b = None if bias is None else bias.astype(ct, copy=False).reshape(-1)
        xr = x.astype(ct, copy=False).reshape(rows, x.shape[-1])
        # W.T [N, K], made once per weight (a constant: fuse_matmul_add makes the op only for one)
        wt = native.derived(w, "fc.T", lambda w: np.ascontiguousarray(w.T, dtype=np.float32))
        if wt is not None:
            # Y.T = W.T @ X.T: each output a dot product of two contiguous rows, in the narrow
            # path (rows of W.T split across the threads); memory-bound on W, which this reads
            # front to back where [K, N] has each thread stride through every row of W
            y = native.gemm_conv(wt, xr.T[None], b, *epilogue(attrs))[0].T
            if rows == 1:
                _prepare_fc(attrs, x, w, bias, wt, b)
        else:  # the thin path (Y's rows in L1 while W streams through once)
            res = None if b is None else np.broadcast_to(b, (1, rows, w.shape[1]))
            y = native.gemm_conv(xr, w.astype(ct, copy=False)[None], None, *epilogue(attrs), residual=res)
        return [apply_output_quant(y.reshape(x.shape[:-1] + (w.shape[1],)).astype(x.dtype, copy=False), attrs)]
    if w.ndim == 2 and x.ndim >= 1 and x.shape[-1] == w.shape[0] and w.dtype == x.dtype \
            and on_the_pool(rows, w.shape[0], w.shape[1], ct):
        y = pool_matmul(x.reshape(rows, w.shape[0]), w).reshape(x.shape[:-1] + (w.shape[1],))
    else:
        y = np.asarray(_matmul(x.astype(ct, copy=False), w.astype(ct, copy=False)))
    if bias is not None:
        b = bias.astype(ct, copy=False)
        if np.broadcast_shapes(y.shape, b.shape) == y.shape:
            y += b
        else:
            y = y + b
    y = activate(y, *epilogue(attrs))
    return [apply_output_quant(np.asarray(y).astype(x.dtype, copy=False), attrs)]


_F32 = np.dtype(np.float32)


def _fc_rows(attrs: dict[str, Any], w: Any, bias: Any) -> Any:
    """The step's product over 1 to ``native.gemm.FC_ROWS_MAX`` rows in the native library
    (``native.prepared_fc_rows``: one C call with bias and activation, W as the model holds it) as a
    function of X giving None for an X it does not take, or None where it does not apply (see
    ``_native_fc``; also where W is larger than that kernel takes: a large head keeps the GEMM's
    threads).  Small plain layers take it too: through the fast call path the C call costs ~0.7
    us less than numpy's product and bias (``_small_fc``: a decoder's 96x30 logits 2.4 against
    1.7 us)."""
    return _native_fc(attrs, w, bias, "fc rows", native.prepared_fc_rows)


_GEMM_FC_ROWS = 16  # rows from which the GEMM's tiles take a layer (fewer: fc_rows, or W.T's dot products below)


def _gemm_fc(attrs: dict[str, Any], w: Any, bias: Any) -> Any:
    """The step's product over ``_GEMM_FC_ROWS`` rows or more in the native GEMM (``native.prepared_fc``:
    bias and activation in its tiles' epilogue, split over the pool), as ``_native_fc`` makes it.
    A transformer's layers on 16+ tokens took numpy's product (BLAS: one thread, or its own
    spinning workers beside the pool's), a bias Add and a numpy activation: 64 us for BERT-tiny's
    [32, 128] @ [128, 512] + GELU, 43 in one call here."""
    return _native_fc(attrs, w, bias, "gemm fc", native.prepared_fc)


def _native_fc(attrs: dict[str, Any], w: Any, bias: Any, tag: str, make: Any) -> Any:
    """``make(W, bias, *epilogue)``'s function of X (followed by the step's fused FakeQuant), kept in
    the step's memo under ``tag`` while the same weight and bias arrays come back (a Loop body's
    cell every iteration); None where it does not apply: ``make`` None or giving None, no library,
    no step memo, W not a float32 matrix, a bias not of N floats."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is None:
        return None
    hit = memo.get(tag)
    if hit is not None and hit[0] is w and hit[1] is bias:
        return hit[2]
    run = None
    if make is not None and native.available() and type(w) is np.ndarray and w.ndim == 2 and w.dtype is _F32 \
            and w.size and (bias is None or (type(bias) is np.ndarray and bias.dtype is _F32
                                             and bias.shape in ((w.shape[1],), (1, w.shape[1])))):
        b = None if bias is None else np.ascontiguousarray(bias.reshape(-1))
        call = make(np.ascontiguousarray(w), b, *epilogue(attrs))
        quant = output_quant(attrs)
        run = call if quant is None or call is None else _then_fake_quantize(call, quant)
    memo[tag] = (w, bias, run)
    return run


def _then_fake_quantize(call: Any, quant: tuple) -> Any:
    """``call`` followed by the step's fused FakeQuant (a quantized model's head)."""

    def run(x: np.ndarray) -> np.ndarray | None:
        y = call(x)
        return None if y is None else fake_quantize(y, *quant)

    return run


def _small_fc(attrs: dict[str, Any], w: Any, bias: Any) -> Any:
    """The product of a small float32 layer (W below ``_SMALL_FC`` elements) as a function of X, or
    None: numpy's matmul, the bias added in place, the epilogue.  A recurrent cell's gates or an
    attention score in a decoder's Loop run it every step on one row or a few: there numpy takes
    ~3 us where the native call cost ~8 us of argument passing around a product of 1 us, and
    checking the weights, bias and epilogue again each call ~4 us more (a bound step keeps the
    function in its memo while the same weight and bias arrays come back)."""
    memo = attrs.memo if type(attrs) is StepAttrs else None
    if memo is not None:
        hit = memo.get("small fc")
        if hit is not None and hit[0] is w and hit[1] is bias:
            return hit[2]
    run = None
    if type(w) is np.ndarray and w.ndim == 2 and w.size < _SMALL_FC and w.dtype is _F32 \
            and (bias is None or (type(bias) is np.ndarray and bias.dtype is _F32
                                  and bias.shape in ((w.shape[1],), (1, w.shape[1])))):
        b = None if bias is None else bias.reshape(-1)
        act, quant, n = epilogue(attrs), output_quant(attrs), w.shape[1]

        def run(x: np.ndarray) -> np.ndarray:
            y = np.matmul(x if x.ndim == 2 else x.reshape(-1, x.shape[-1]), w)
            if b is not None:
                np.add(y, b, out=y)
            if act[0] is not None:
                y = activate(y, *act)
            if x.ndim != 2:
                y = y.reshape(x.shape[:-1] + (n,))
            return y if quant is None else fake_quantize(y, *quant)

    if memo is not None:
        memo["small fc"] = (w, bias, run)
    return run


def _prepared_fc(attrs: dict[str, Any], x: Any, w: Any, bias: Any) -> Any:
    """The step's one-row product worked out once (``_prepare_fc``), if it applies to this input:
    the same weights, bias and input shape, a C-contiguous float32 array."""
    if type(attrs) is not StepAttrs or type(x) is not np.ndarray or x.dtype != np.float32 \
            or not x.flags.c_contiguous:
        return None
    hit = attrs.memo.get("prepared fc")
    if hit is None or hit[0] is not w or hit[1] is not bias or hit[2] != x.shape or not native.available():
        return None
    return hit[3]


def _prepare_fc(attrs: dict[str, Any], x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, wt: np.ndarray,
                b: np.ndarray | None) -> None:
    """Remember a classifier head's product (one row: Y.T = W.T @ X.T in the narrow path) for this
    input shape: the derived W.T, the checks and conversions of every argument cost ~40 us a call
    around a product of microseconds (a face detector's four heads on [1, 576] and [1, 128])."""
    if type(attrs) is not StepAttrs or x.dtype != np.float32:
        return
    if b is not None and not (b.dtype == np.float32 and b.flags.c_contiguous):
        return
    n, k = wt.shape
    call = native.prepared_gemm_conv(wt, b, *epilogue(attrs), None, 1, 1, (1, n, 1))
    shape, quant = x.shape[:-1] + (n,), output_quant(attrs)

    def run(x: np.ndarray) -> np.ndarray:
        y = call(x.reshape(1, k, 1)).reshape(shape)
        # the fused FakeQuant of a quantized model's head (its logits' QuantizeLinear -> DequantizeLinear)
        return y if quant is None else fake_quantize(y, *quant)

    attrs.memo["prepared fc"] = (w, bias, x.shape, run)


# ----------------------------------------------------------------------------- shape functions

def matmul_shape(a: Shape, b: Shape) -> Shape:
    """numpy's matmul: 1-D operands promoted and the promoted axis dropped, batch dims broadcast,
    the inner dims equal."""
    if a is None or b is None:
        return None
    if not a or not b:
        raise ShapeDerivationError("MatMul does not take scalars")
    same_dim(a[-1], b[0] if len(b) == 1 else b[-2], f"the inner dims of {show(a)} and {show(b)} differ")
    batch = broadcast(tuple(a[:-2]), tuple(b[:-2]))
    return (*batch, *a[-2:-1], *(b[-1:] if len(b) > 1 else ()))


@shape_fn("MatMul")
def _matmul_shape(args: ShapeArgs) -> list[Shape]:
    return [matmul_shape(args.shape(0), args.shape(1))]


def gemm_shape(args: ShapeArgs, a_at: int = 0, b_at: int = 1, c_at: int = 2) -> list[Shape]:
    """Gemm's [M, N] from its 2-D A and B (transposed as ``transA``/``transB`` say); C must
    broadcast to [M, N] (shared with QGemm, whose operands sit at other positions)."""
    a, b = args.shape(a_at), args.shape(b_at)
    for name, s in (("A", a), ("B", b)):
        if s is not None and len(s) != 2:
            raise ShapeDerivationError(f"Gemm's {name} has rank {len(s)}, not 2")
    if a is None or b is None:
        return [(None, None)]
    if int(args.attrs.get("transA", 0)):
        a = a[::-1]
    if int(args.attrs.get("transB", 0)):
        b = b[::-1]
    same_dim(a[1], b[0], f"the inner dims of A {show(a)} and B {show(b)} differ")
    out = (a[0], b[1])
    c = args.shape(c_at) if args.has(c_at) else None
    if c is not None:
        grown = broadcast(out, c)
        if len(c) > 2 or any(isinstance(g, int) and isinstance(o, int) and g != o for g, o in zip(grown, out)):
            raise ShapeDerivationError(f"C {show(c)} does not broadcast to {show(out)}")
    return [out]


shape_fn("Gemm")(gemm_shape)


@shape_fn("FullyConnected", domain=OPTCLI_DOMAIN)
def _fully_connected_shape(args: ShapeArgs) -> list[Shape]:
    out = matmul_shape(args.shape(0), args.shape(1))
    if out is not None and out:
        check_length(args, 2, out[-1], "the bias", allow_one=True)
    return [out]
