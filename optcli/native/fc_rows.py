"""A fully connected layer, ``act(x @ w + bias)`` with W as the model holds it: over a few rows
(kernels/host/fc_rows.c), and over any number of rows through the GEMM's tiles (``optcli_fc_f32``,
kernels/host/gemm.c)."""

from __future__ import annotations

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.native import library
from optcli.native.library import _check, require

FC_ROWS_MAX = 8  # rows of X up to which fc_rows runs (a Loop body's cell, a classifier's head)
FC_ROWS_MAX_WEIGHTS = 1 << 17  # W's elements (512 KiB) up to which it does: larger heads keep the GEMM


def _require_weights(w: np.ndarray, bias: np.ndarray | None, what: str) -> None:
    """W a C-contiguous float32 [K, N] with K, N >= 1; the bias None or N contiguous float32s."""
    require(library._lib is not None and w.ndim == 2 and w.dtype == np.float32 and w.flags.c_contiguous
            and 1 <= w.shape[0] and 1 <= w.shape[1], what)
    require(bias is None or (bias.dtype == np.float32 and bias.shape == (w.shape[1],) and bias.flags.c_contiguous),
            what)


def prepared_fc_rows(w: np.ndarray, bias: np.ndarray | None, activation: str | None, alpha: float, beta: float):
    """``act(x @ w + bias)`` for x of 1 to ``FC_ROWS_MAX`` rows over its last axis (kernels/host/fc_rows.c),
    worked out once for one weight: a function of ``x`` (float32, last axis K) that returns
    [..., N], or None where x is not such an array; None instead of a function where W holds more
    than ``FC_ROWS_MAX_WEIGHTS`` elements.  W [K, N] and the bias are taken as the model
    holds them (no W.T made); per call one output array and one C call, where
    numpy took three calls (product, bias, activation) and the GEMM conv ~8 us of argument
    passing around a product of ~1 us (a decoder's GRU gates in a Loop)."""
    _require_weights(w, bias, 'fc rows')
    if w.size > FC_ROWS_MAX_WEIGHTS:
        return None
    k, n = w.shape
    fn, code = library.function("optcli_fc_rows_f32"), ACTIVATION_CODES[activation]
    empty, f32, nd = np.empty, np.float32, np.ndarray

    def call(x: np.ndarray) -> np.ndarray | None:
        if type(x) is not nd or x.dtype != f32 or not x.ndim or x.shape[-1] != k:
            return None
        rows = x.size // k
        if not 1 <= rows <= FC_ROWS_MAX:
            return None
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = empty(x.shape[:-1] + (n,), f32)
        rc = fn(x, w, bias, y, rows, k, n, code, alpha, beta)
        if rc:
            _check(rc, "fc rows")
        return y

    return call


def prepared_fc(w: np.ndarray, bias: np.ndarray | None, activation: str | None, alpha: float, beta: float):
    """``act(x @ w + bias)`` for x of any number of rows over its last axis (``optcli_fc_f32``: the
    GEMM's register tiles with x as their rows, the bias and activation in the tiles' epilogue, the
    columns split over the pool), worked out once for one weight: a function of ``x`` (float32,
    last axis K) that returns [..., N], or None where x is not such an array.  A transformer's
    layers on [tokens, 128..3072]: numpy's product, its bias Add and a numpy GELU were three passes
    and three calls, the GELU alone as long as the product."""
    _require_weights(w, bias, 'fc')
    k, n = w.shape
    fn, code = library.function("optcli_fc_f32"), ACTIVATION_CODES[activation]
    packed, nr = _packed(w)
    empty, f32, nd = np.empty, np.float32, np.ndarray

    def call(x: np.ndarray) -> np.ndarray | None:
        if type(x) is not nd or x.dtype != f32 or not x.ndim or x.shape[-1] != k:
            return None
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = empty(x.shape[:-1] + (n,), f32)
        rc = fn(x, w, bias, y, x.size // k, k, n, code, alpha, beta, packed, nr)
        if rc:
            _check(rc, "fc")
        return y

    return call


FC_PACK_MAX_WEIGHTS = 1 << 20  # W's elements (4 MiB) up to which a packed copy is kept beside it


def _packed(w: np.ndarray) -> tuple[np.ndarray | None, int]:
    """W packed once into the panels the GEMM's tiles read (``optcli_fc_pack_f32``) and their
    width, or (None, 0) where W is too narrow to be taken by the tiles (fewer columns than a
    panel: dot products), the library says no, or W is larger than ``FC_PACK_MAX_WEIGHTS``: the
    copy costs the weight's memory again (a plan's weights are mapped from the file, not copied),
    and the per-call packing it saves matters on a few dozen rows of a small layer, not on a large
    one (the GEMM then packs per call, as for any X)."""
    k, n = w.shape
    if w.size > FC_PACK_MAX_WEIGHTS:
        return None, 0
    pack = library.function("optcli_fc_pack_f32")
    nr = int(pack(w, None, k, n))
    if nr <= 0 or n < 16:
        return None, 0
    packed = np.empty(k * ((n + nr - 1) // nr * nr), np.float32)
    if int(pack(w, packed, k, n)) != nr:  # the variant changed in between (the tests switch it)
        return None, 0
    return packed, nr
