"""The GEMM convs: 1x1 convs and FullyConnected as ``act(W @ X + bias + residual)``, the implicit
GEMM of the other convs, and W.T's panels for small planes (kernels/host/gemm.c)."""

from __future__ import annotations

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.caches import _geom
from optcli.native.library import _check, require


def gemm_conv(w: np.ndarray, x: np.ndarray, bias: np.ndarray | None = None, activation: str | None = None,
              alpha: float = 0.0, beta: float = 0.0, residual: np.ndarray | None = None,
              out: np.ndarray | None = None, panels: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """``act(w @ x[b] + bias[:, None] + residual[b])`` for each image ``b`` of float32 ``x`` [B, K, N],
    with ``w`` [M, K]: the product and its epilogue in one pass over the output (kernels/host/gemm.c), where
    BLAS needs a second pass for bias and activation.  ``bias`` and ``residual`` [B, M, N] may be
    None; ``out`` (C-contiguous float32 [B, M, N], not overlapping the inputs) is written if given;
    ``panels`` (``pack_panels(w)``) lets products of 16 to 256 columns run transposed."""
    require(library._lib is not None and w.ndim == 2 and x.ndim == 3 and w.shape[1] == x.shape[1] >= 1, 'gemm conv')
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    (m, k), (b, _, n) = w.shape, x.shape
    if out is None:
        out = np.empty((b, m, n), dtype=np.float32)
    else:
        require(out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (b, m, n), 'gemm conv')
    bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    require(bias is None or bias.shape == (m,), 'gemm conv')
    r = None if residual is None else np.ascontiguousarray(residual, dtype=np.float32)
    require(r is None or r.shape == out.shape, 'gemm conv')
    if panels is not None:  # W.T's panels (pack_panels): small planes taken transposed
        nr, wt = panels
        require(wt.dtype == np.float32 and wt.flags.c_contiguous and wt.size == m * k, 'gemm conv')
        _check(library.function("optcli_gemm_conv_t_f32")(w, wt, nr, x, bias, r, out, b, m, k, n,
                                                           ACTIVATION_CODES[activation], alpha, beta), "GEMM conv")
        return out
    _check(library.function("optcli_gemm_conv_f32")(w, x, bias, r, out, b, m, k, n, ACTIVATION_CODES[activation],
                                                     alpha, beta), "GEMM conv")
    return out


def prepared_gemm_conv(w: np.ndarray, bias: np.ndarray | None, activation: str | None, alpha: float, beta: float,
                       panels: tuple[int, np.ndarray] | None, images: int, columns: int, shape: tuple[int, ...]):
    """``gemm_conv`` for one plan step, worked out once: a function of ``x`` ([images, K, columns],
    C-contiguous float32) that returns the product in a new array of ``shape``.  The weights, bias
    and panels are the step's own (kept alive by the function); per call one output array and one
    C call, where ``gemm_conv`` checks and converts every argument again (~4 us of a 1x1 conv that
    takes 20-40 us on a MobileNet's late layers)."""
    require(library._lib is not None and w.ndim == 2 and w.dtype == np.float32 and w.flags.c_contiguous,
            'prepared gemm conv')
    require(bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[0],) and bias.flags.c_contiguous),
            'prepared gemm conv')
    m, k = w.shape
    code = ACTIVATION_CODES[activation]
    if panels is not None:
        fn, head = library.function("optcli_gemm_conv_t_f32"), (w, panels[1], panels[0])
    else:
        fn, head = library.function("optcli_gemm_conv_f32"), (w,)
    empty, f32 = np.empty, np.float32

    def call(x: np.ndarray) -> np.ndarray:
        y = empty(shape, f32)
        rc = fn(*head, x, bias, None, y, images, m, k, columns, code, alpha, beta)
        if rc:
            _check(rc, "GEMM conv")
        return y

    return call


def prepared_conv2d_gemm(w: np.ndarray, bias: np.ndarray | None, xp_shape: tuple[int, ...], strides: tuple[int, int],
                         dilations: tuple[int, int], out: tuple[int, int], activation: str | None, alpha: float,
                         beta: float):
    """``conv2d_gemm`` (one group) for one plan step and one padded input shape, worked out once: a
    function of ``xp`` (that shape, C-contiguous float32) giving [N, M, *out].  The geometry array is
    made here; per call the shape is compared and one C call
    made, where ``conv2d_gemm`` converts and checks every argument again (with the window and
    padding worked out by its caller: ~100 us of Python around 5 us of arithmetic for a speech
    model's Conv1d of 35 K MACs inside an If)."""
    require(library._lib is not None and w.ndim == 4 and w.dtype == np.float32 and w.flags.c_contiguous,
            'prepared conv2d gemm')
    require(len(xp_shape) == 4 and w.shape[1] == xp_shape[1], 'prepared conv2d gemm')
    require(bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[0],) and bias.flags.c_contiguous),
            'prepared conv2d gemm')
    xp_shape = tuple(int(d) for d in xp_shape)
    geom_array = np.array((xp_shape[0], w.shape[0], *xp_shape[1:], *w.shape[2:], *strides, *dilations, *out),
                          dtype=np.int64)
    shape = (xp_shape[0], w.shape[0]) + tuple(out)
    fn, code = library.function("optcli_conv2d_gemm_f32"), ACTIVATION_CODES[activation]
    empty, f32 = np.empty, np.float32

    def call(xp: np.ndarray) -> np.ndarray:
        # the C code reads xp by the geometry above: its shape, dtype and layout are checked every call
        require(xp.shape == xp_shape and xp.dtype == f32 and xp.flags.c_contiguous, 'prepared conv2d gemm')
        y = empty(shape, f32)
        rc = fn(w, xp, bias, None, y, geom_array, code, alpha, beta)
        if rc:
            _check(rc, "conv GEMM")
        return y

    return call


def pack_panels(w: np.ndarray) -> tuple[int, np.ndarray] | None:
    """``w`` [M, K] packed into the panels of W.T that ``gemm_conv(panels=...)`` reads on small planes
    (kernels/host/gemm.c, optcli_gemm_pack_wt_f32): (the panel width, the M * K floats), or None where M is
    not a multiple of the GEMM's vector width."""
    require(library._lib is not None and w.ndim == 2, 'pack panels')
    w = np.ascontiguousarray(w, dtype=np.float32)
    wt = np.empty(w.size, dtype=np.float32)
    nr = library.function("optcli_gemm_pack_wt_f32")(w, wt, *w.shape)
    return (nr, wt) if nr else None


def conv2d_gemm(xp: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: tuple[int, int],
                dilations: tuple[int, int], out: tuple[int, int], activation: str | None = None, alpha: float = 0.0,
                beta: float = 0.0, group: int = 1) -> np.ndarray:
    """A 2-D convolution of the zero-padded float32 ``xp`` [N, C, HP, WP] by ``w`` [M, C / group, KH,
    KW] as an implicit GEMM: the im2col columns are gathered while packing (kernels/host/gemm.c), never
    formed, and bias and activation are applied in the GEMM's own pass; with ``group`` > 1 each
    group is a GEMM of its own, the groups of all images spread over the pool.  Returns [N, M, *out]."""
    require(library._lib is not None and xp.ndim == 4 and w.ndim == 4 and group >= 1, 'conv2d gemm')
    require(w.shape[1] * group == xp.shape[1] and w.shape[0] % group == 0, 'conv2d gemm')
    xp = np.ascontiguousarray(xp, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    require(b is None or b.shape == (w.shape[0],), 'conv2d gemm')
    y = np.empty((xp.shape[0], w.shape[0]) + tuple(out), dtype=np.float32)
    if group == 1:
        geom = _geom((xp.shape[0], w.shape[0], *xp.shape[1:], *w.shape[2:], *strides, *dilations, *out))
        _check(library.function("optcli_conv2d_gemm_f32")(w, xp, b, None, y, geom, ACTIVATION_CODES[activation], alpha,
                                                          beta), "conv GEMM")
        return y
    geom = _geom((xp.shape[0], w.shape[0] // group, w.shape[1], *xp.shape[2:], *w.shape[2:], *strides,
                              *dilations, *out))
    _check(library.function("optcli_conv2d_gemm_grouped_f32")(w, xp, b, y, geom, group, ACTIVATION_CODES[activation],
                                                              alpha, beta), "grouped conv GEMM")
    return y
