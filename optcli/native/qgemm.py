"""Integer convolutions (kernels/host/qgemm.c): u8 / s8 activations by s8 weights, accumulated exactly in
int32 and requantized to u8 / s8 in the same pass, as onnxruntime's QLinearConv.  ``prepared_qconv``
works one step out once (weights packed, geometry and quantization parameters as C arrays) and
returns the call a plan step makes on every run."""

from __future__ import annotations

import numpy as np

from optcli.native import library
from optcli.native.library import _check, require

MAX_K = 65536  # the int32 accumulator's bound in qgemm.c: K * 255 * 128 < 2**31
# The pointwise kernel's residual costs a row about what a row's share of a main step costs: past this
# fraction of (row, quad) entries with a residual it was no faster than the GEMM (MobileNetV2's 1x1
# convs of K 8-48, 15-40% residual quads, took 0.95-1.2x the GEMM's time; K 96 and up, 5-13%, 0.7-0.9x)
MAX_RESIDUAL = 0.14


def pack_pairs(w: np.ndarray) -> np.ndarray:
    """int8 ``w`` [M, ...] as [M, ceil(K / 2)] int32, each the int16 pair (w[m, 2j] low, w[m, 2j + 1] high):
    the operand vpmaddwd broadcasts.  Built with shifts, not a view, so it holds on any byte order."""
    m = w.shape[0]
    flat = w.reshape(m, -1).astype(np.int32)
    if flat.shape[1] % 2:
        flat = np.concatenate([flat, np.zeros((m, 1), np.int32)], axis=1)
    low, high = flat[:, 0::2] & 0xFFFF, flat[:, 1::2]
    return np.ascontiguousarray(high * 65536 + low, dtype=np.int32)  # in int32 range: |high| <= 128


def split_pairs(flat: np.ndarray, whole: bool) -> tuple[np.ndarray, np.ndarray]:
    """int32 weights [rows, even K] as (main, residual) summing to them, each byte pair (k even, k + 1) of main
    unable to clip vpmaddubsw's saturating int16 sum of two u8 x s8 products: its positive parts summing to at
    most 128 and its negative ones to at least -128 (255 * 128 < 2**15); a pair that could clip keeps its
    values clipped to [-64, 64] in main and the excess (within [-64, 63]: a pair's parts sum to 126 or -128 at
    most) in the residual.  ``whole``: no split (main the weights, the residual zeros)."""
    a, b = flat[:, 0::2], flat[:, 1::2]
    pos, neg = np.maximum(a, 0) + np.maximum(b, 0), np.minimum(a, 0) + np.minimum(b, 0)
    unsafe = np.repeat((pos > 128) | (neg < -128), 2, axis=1) & (not whole)  # both values of a pair that could clip
    main = np.where(unsafe, np.clip(flat, -64, 64), flat)
    return main, flat - main


def pack_columns(w: np.ndarray, bias: np.ndarray | None, split: bool) -> tuple[np.ndarray, np.ndarray]:
    """The weights and auxiliary blob optcli_qmatmul_rows reads (kernels/host/qmatmul.c) for int8 ``w`` [K, M]:
    tiles of 16 columns, [tile][ceil(K / 4)][16 columns][4 k] int8 (zeros past K and M), split as
    ``split_pairs`` splits them where ``split`` (the AVX2 path's vpmaddubsw); and int32 column sums of w [M],
    the bias [M] (zeros for none), the residual entries' starts per tile [tiles + 1] and the entries (quad
    index, its 64 residual bytes as 16 int32: the bytes as they lie, read back as bytes)."""
    k, m = w.shape
    q, tiles = -(-k // 4), -(-m // 16)
    flat = np.zeros((tiles * 16, 4 * q), np.int32)
    flat[:m, :k] = w.T
    main, rest = split_pairs(flat, not split)

    def tiled(v: np.ndarray) -> np.ndarray:  # [tiles * 16, 4q] -> [tiles, q, 16, 4] bytes
        return np.ascontiguousarray(v.astype(np.int8).reshape(tiles, 16, q, 4).transpose(0, 2, 1, 3))

    rest_t = tiled(rest).reshape(tiles, q, 64)
    tile_of, quad_of = np.nonzero(rest_t.any(axis=2))  # row-major: in tile order
    starts = np.zeros(tiles + 1, np.int64)
    np.add.at(starts, tile_of + 1, 1)
    entries = np.concatenate([quad_of.astype(np.int32)[:, None],
                              np.ascontiguousarray(rest_t[tile_of, quad_of]).view(np.int32)], axis=1)
    wsum = w.sum(axis=0, dtype=np.int64).astype(np.int32)  # |sum| <= 65536 * 128
    b = np.zeros(m, np.int32) if bias is None else bias.astype(np.int32)
    aux = np.concatenate([wsum, b, np.cumsum(starts).astype(np.int32), entries.ravel()]).astype(np.int32)
    return tiled(main), np.ascontiguousarray(aux)


def pack_quads(w: np.ndarray, bias: np.ndarray | None, x_zero_point: int, x_signed: bool,
               group: int = 1, whole: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The weights and bias optcli_qconv2d_pointwise reads (kernels/host/qpointwise.c): int8 ``w`` [M, K, 1, 1]
    split into a main part whose byte pairs (k even, k + 1) cannot make vpmaddubsw's saturating int16 sum
    clip (positive parts summing to at most 128, negative parts to at least -128: 255 * 128 < 2**15) and
    a residual holding the rest of each pair that could (its halves, |w| - 64 at most, meet the same
    bound), so that the kernel's two sums add up to the exact integer sum; and the bias less
    ``zp * sum(w[m])`` (zp the zero point, plus 128 for s8 inputs, which the kernel reads as u8 by
    flipping their top bit), wrapped to int32 as the kernel's int32 sums wrap.  ``whole``: no split (the
    weights as they are, no residual), for CPUs with VNNI, whose vpdpbusd sums a quad's four products
    exactly into int32.  Returns (the int32 blob: its format, 1 whole or 0 split; main quads [M, Q], row
    starts [M + 1], (quad, residual quad) pairs; the bias)."""
    m = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    q = -(-k // 4)
    flat = np.zeros((m, 4 * q), np.int32)
    flat[:, :k] = w.reshape(m, k)
    main, rest = split_pairs(flat, whole)

    def quads(v: np.ndarray) -> np.ndarray:  # each 4 bytes as one int32, the first the lowest (any byte order)
        as_u8 = v.astype(np.int8).view(np.uint8).reshape(m, q, 4).astype(np.uint32)
        return (as_u8 << np.array([0, 8, 16, 24], np.uint32)).sum(axis=2, dtype=np.uint32).view(np.int32)

    main_q, rest_q = quads(main), quads(rest)
    rows, quads = np.nonzero(rest.reshape(m, q, 4).any(axis=2))  # row-major: in row order
    starts = np.zeros(m + 1, np.int64)
    np.add.at(starts, rows + 1, 1)
    entries = np.stack([quads.astype(np.int32), rest_q[rows, quads]], axis=1)
    blob = np.concatenate([[int(whole)], main_q.ravel(), np.cumsum(starts).astype(np.int32), entries.ravel()])
    blob = blob.astype(np.int32)
    zp = int(x_zero_point) + (128 if x_signed else 0)
    full = (np.zeros(m, np.int64) if bias is None else bias.astype(np.int64)) - zp * flat.sum(axis=1, dtype=np.int64)
    wrapped = ((full + 2**31) % 2**32 - 2**31).astype(np.int32)
    return np.ascontiguousarray(blob), wrapped


def route(w: np.ndarray, geom: tuple[int, ...]) -> str:
    """Which kernel takes a conv: "depthwise" (one input channel per group, at most 64 taps: the direct
    kernel keeps them in registers' reach), "pointwise" (1x1, unit strides, no padding: vpmaddubsw,
    qpointwise.c) or "gemm" (the rest)."""
    if w.shape[1] == 1 and geom[15] == geom[1] and w.shape[2] * w.shape[3] <= 64:
        return "depthwise"
    pointwise = (tuple(w.shape[2:]) == (1, 1) and tuple(geom[7:9]) == (1, 1) and tuple(geom[11:13]) == (0, 0)
                 and tuple(geom[13:15]) == tuple(geom[2:4]))
    return "pointwise" if pointwise else "gemm"


def prepared_weights(w: np.ndarray, bias: np.ndarray | None, geom: tuple[int, ...], qp: tuple[int, ...]):
    """(kernel, the weights as that kernel reads them, the bias it reads) for one conv: ``route``'s, except
    that a pointwise conv whose weight split leaves more than MAX_RESIDUAL of its quads a residual goes to
    the GEMM, and that on the AVX-512 VNNI path (variant 4) the GEMM's convs take the dense vpdpbusd kernel
    (kernels/host/qpointwise.c: optcli_qconv2d_dense) with the whole weights in quads."""
    kind = route(w, geom)
    if kind == "depthwise":
        return kind, np.ascontiguousarray(w.reshape(w.shape[0], -1)), bias
    if kind == "gemm" and variant() == 4:
        blob, b = pack_quads(w, bias, int(qp[0]), bool(qp[4]), whole=True)
        return "dense", blob, b
    if kind == "pointwise":
        blob, b = pack_quads(w, bias, int(qp[0]), bool(qp[4]), whole=variant() in (4, 5, 6, 7))
        m, quads = w.shape[0], -(-int(np.prod(w.shape[1:])) // 4)
        if blob[1 + m * quads + m] <= MAX_RESIDUAL * m * quads:
            return kind, blob, b
    return "gemm", pack_pairs(w), bias


def prepared_qmatmul(rows: int, x_dtype: np.dtype, w: np.ndarray, bias: np.ndarray | None, mult: np.ndarray,
                     qp: tuple[int, ...], y_dtype: np.dtype):
    """A function of ``x`` (C-contiguous, ``x_dtype``, ``rows`` * K elements) returning the requantized product
    [rows, M] in ``y_dtype`` (optcli_qmatmul_rows); int8 ``w`` [K, M] packed once, split for vpmaddubsw unless
    the path in use has VNNI or the dot product (an AVX2 path given whole weights runs plain C: still exact)."""
    require(library._lib is not None and w.ndim == 2 and w.dtype == np.int8, "prepared qmatmul")
    k, m = w.shape
    require(1 <= k <= MAX_K and m >= 1 and rows >= 0 and len(qp) == 6, "prepared qmatmul")
    require(np.dtype(x_dtype) in (np.dtype(np.uint8), np.dtype(np.int8)), "prepared qmatmul")
    require(np.dtype(y_dtype) in (np.dtype(np.uint8), np.dtype(np.int8)), "prepared qmatmul")
    require(mult.dtype == np.float32 and mult.shape == (m,), "prepared qmatmul")
    require(bias is None or (bias.dtype == np.int32 and bias.shape == (m,)), "prepared qmatmul")
    split = variant() not in (4, 5, 6)
    weights, aux = pack_columns(w, bias, split)
    fn = library.function("optcli_qmatmul_rows")
    mult = np.ascontiguousarray(mult)
    dims = np.array([rows, k, m, int(split)], dtype=np.int64)
    qp_array = np.array(qp, dtype=np.int32)
    x_dtype, y_dtype, size = np.dtype(x_dtype), np.dtype(y_dtype), rows * k
    empty = np.empty

    def call(x: np.ndarray) -> np.ndarray:
        require(type(x) is np.ndarray and x.dtype == x_dtype and x.size == size and x.flags.c_contiguous, "qmatmul")
        y = empty((rows, m), y_dtype)
        rc = fn(x, weights, aux, mult, y, dims, qp_array)
        if rc:
            _check(rc, "integer matmul")
        return y

    return call


def variant(which: int = -1) -> int:
    """The dot-product path in use (1 plain C, 2 AVX2, 3 AVX2 with the depthwise convs run channels in
    lanes and summed exactly in float32 by FMA, kernels/host/qdepthwise_lanes.c; 4 as 3 with the 1x1 and
    the dense convs by AVX-512 VNNI's vpdpbusd, kernels/host/qpointwise.c; 5 as 3 with the 1x1 convs by
    AVX-VNNI's 8-lane vpdpbusd, for CPUs that have it without AVX-512; 6 on aarch64 with the dot product, the
    1x1 convs by sdot);
    ``which`` 1 to 6 forces one (tests, A/B timings), 0 picks by the CPU again (4 over 5 over 3).  -1 where
    refused or without the library.  A step's weights are packed for the path in use when it is prepared
    (``prepared_weights``)."""
    return library._lib.optcli_qgemm_variant(int(which)) if library._lib is not None else -1


def prepared_qconv(xshape: tuple[int, int, int, int], x_dtype: np.dtype, w: np.ndarray, bias: np.ndarray | None,
                   mult: np.ndarray, geom: tuple[int, ...], qp: tuple[int, ...], y_dtype: np.dtype):
    """A function of ``x`` (C-contiguous, ``x_dtype``, ``xshape``) returning the requantized convolution
    [N, M, OH, OW] in ``y_dtype``.  ``geom`` and ``qp`` as optcli_qconv2d_gemm takes them; a step whose
    groups each hold one input channel runs the direct depthwise kernel, a 1x1 conv with unit strides and
    no padding the pointwise one, the others the GEMM (``route``)."""
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
    kind, weights, bias = prepared_weights(w, bias, geom, qp)
    fn = library.function(f"optcli_qconv2d_{kind}")
    bias = None if bias is None else np.ascontiguousarray(bias)
    mult = np.ascontiguousarray(mult)
    geom_array = np.array(geom, dtype=np.int64)
    qp_array = np.array(qp, dtype=np.int32)
    shape = (xshape[0], m, int(geom[13]), int(geom[14]))
    x_dtype, y_dtype, xshape = np.dtype(x_dtype), np.dtype(y_dtype), tuple(xshape)
    empty = np.empty

    def call(x: np.ndarray) -> np.ndarray:
        require(type(x) is np.ndarray and x.dtype == x_dtype and x.shape == xshape and x.flags.c_contiguous,
                "qconv")
        y = empty(shape, y_dtype)
        rc = fn(x, weights, bias, mult, y, geom_array, qp_array)
        if rc:
            _check(rc, "integer conv")
        return y

    return call
