"""Integer convolutions (kernels/host/qgemm.c): u8 / s8 activations by s8 weights, accumulated exactly in
int32 and requantized to u8 / s8 in the same pass, as onnxruntime's QLinearConv.  ``prepared_qconv``
works one step out once (weights packed, geometry and quantization parameters as C arrays) and
returns the call a plan step makes on every run."""

from __future__ import annotations

import numpy as np

from optcli.native import library
from optcli.native.caches import _ptr
from optcli.native.library import _check, require

MAX_K = 65536  # the int32 accumulator's bound in qgemm.c: K * 255 * 128 < 2**31


def pack_pairs(w: np.ndarray) -> np.ndarray:
    """int8 ``w`` [M, ...] as [M, ceil(K / 2)] int32, each the int16 pair (w[m, 2j] low, w[m, 2j + 1] high):
    the operand vpmaddwd broadcasts.  Built with shifts, not a view, so it holds on any byte order."""
    m = w.shape[0]
    flat = w.reshape(m, -1).astype(np.int32)
    if flat.shape[1] % 2:
        flat = np.concatenate([flat, np.zeros((m, 1), np.int32)], axis=1)
    low, high = flat[:, 0::2] & 0xFFFF, flat[:, 1::2]
    return np.ascontiguousarray(high * 65536 + low, dtype=np.int32)  # in int32 range: |high| <= 128


def variant(which: int = -1) -> int:
    """The dot-product path in use (1 plain C, 2 AVX2, 3 AVX2 with the stride-1 3x3 depthwise convs of
    wide rows summed exactly in float32 by FMA); ``which`` 1, 2 or 3 forces one (tests, A/B timings), 0 picks
    by the CPU again (3 where it has AVX2 and FMA).  -1 where refused or without the library."""
    return library._lib.optcli_qgemm_variant(int(which)) if library._lib is not None else -1


def prepared_qconv(xshape: tuple[int, int, int, int], x_dtype: np.dtype, w: np.ndarray, bias: np.ndarray | None,
                   mult: np.ndarray, geom: tuple[int, ...], qp: tuple[int, ...], y_dtype: np.dtype):
    """A function of ``x`` (C-contiguous, ``x_dtype``, ``xshape``) returning the requantized convolution
    [N, M, OH, OW] in ``y_dtype``.  ``geom`` and ``qp`` as optcli_qconv2d_gemm takes them; a step whose
    groups each hold one input channel runs the direct depthwise kernel, the others the GEMM."""
    require(library._lib is not None and w.ndim == 4 and w.dtype == np.int8, "prepared qconv")
    m = w.shape[0]
    require(len(geom) == 16 and len(qp) == 6 and geom[4] == m and tuple(geom[:4]) == tuple(xshape), "prepared qconv")
    require(np.dtype(x_dtype) in (np.dtype(np.uint8), np.dtype(np.int8)), "prepared qconv")
    require(np.dtype(y_dtype) in (np.dtype(np.uint8), np.dtype(np.int8)), "prepared qconv")
    require(mult.dtype == np.float32 and mult.shape == (m,), "prepared qconv")
    require(bias is None or (bias.dtype == np.int32 and bias.shape == (m,)), "prepared qconv")
    require(int(np.prod(w.shape[1:])) <= MAX_K, "prepared qconv")
    # the C reads C / group * KH * KW weights per output channel: they must be w's (a crafted file's
    # group or window would otherwise send it past the weight array)
    group = int(geom[15])
    require(group >= 1 and xshape[1] == w.shape[1] * group and m % group == 0 and tuple(geom[5:7]) == w.shape[2:],
            "prepared qconv")
    # the direct depthwise kernel keeps up to 64 taps in registers' reach; larger windows go to the GEMM
    depthwise = w.shape[1] == 1 and geom[15] == geom[1] and w.shape[2] * w.shape[3] <= 64
    weights = np.ascontiguousarray(w.reshape(m, -1)) if depthwise else pack_pairs(w)
    fn = library._lib.optcli_qconv2d_depthwise if depthwise else library._lib.optcli_qconv2d_gemm
    bias = None if bias is None else np.ascontiguousarray(bias)
    mult = np.ascontiguousarray(mult)
    geom_array = np.array(geom, dtype=np.int64)
    qp_array = np.array(qp, dtype=np.int32)
    shape = (xshape[0], m, int(geom[13]), int(geom[14]))
    head = (_ptr(weights), None if bias is None else _ptr(bias), _ptr(mult))
    tail = (_ptr(geom_array), _ptr(qp_array))
    x_dtype, y_dtype, xshape = np.dtype(x_dtype), np.dtype(y_dtype), tuple(xshape)
    empty = np.empty

    def call(x: np.ndarray) -> np.ndarray:
        require(type(x) is np.ndarray and x.dtype == x_dtype and x.shape == xshape and x.flags.c_contiguous,
                "qconv")
        y = empty(shape, y_dtype)
        rc = fn(_ptr(x), *head, _ptr(y), *tail)
        if rc:
            _check(rc, "integer conv")
        return y

    call.keep = (weights, bias, mult, geom_array, qp_array)  # what the addresses point into
    return call
