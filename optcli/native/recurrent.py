"""The recurrent layers' time loop (kernels/host/recurrent.c): LSTM, GRU and RNN steps after the
input projection, for every direction and batch row on the pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.native import library
from optcli.native.caches import _geom, _ptr
from optcli.native.library import _check, require

CELLS = {"LSTM": 0, "GRU": 1, "RNN": 2}
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}
INPUT_FORGET, LINEAR_BEFORE_RESET, CLIP, QUANTIZE_H = 1, 2, 4, 8
PANEL, PANEL_PAD = 16, 1  # R^T's columns per panel and padding rows after each (recurrent.c)
_RESIDUAL_MAX = 1 << 16  # floats of a layer's projection up to which prepared_layer keeps its biases broadcast


def _f32(a: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` as a C-contiguous float32 array of ``shape`` (checked: the C reads exactly that much)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a, dtype=np.float32)
    require(a.shape == shape, "recurrent")
    return a


def _panels(rt: np.ndarray) -> np.ndarray:
    """R^T [dirs, K, N] in the C loop's panels of PANEL columns: [dirs, ceil(N / PANEL), K + PANEL_PAD,
    PANEL], the last panel's columns and the padding rows zero (recurrent.c's ``gemv_rows``: each
    block of the product then reads sequential streams, where plain R^T put its rows N floats apart)."""
    dirs, k, n = rt.shape
    panels = np.zeros((dirs, -(-n // PANEL), k + PANEL_PAD, PANEL), np.float32)
    padded = np.zeros((dirs, k, panels.shape[1] * PANEL), np.float32)
    padded[:, :, :n] = rt
    panels[:, :, :k] = padded.reshape(dirs, k, -1, PANEL).transpose(0, 2, 1, 3)
    return panels


def dynamic_quantize(a: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32] | None:
    """(q, scale, zero point): onnxruntime's dynamic quantization of a float32 operand, q the uint8
    values less the zero point as float32 (optcli_native.h); None where an element is not finite
    (the caller's numpy path defines those).  One C call in place of five numpy passes."""
    require(library._lib is not None and a.dtype == np.float32 and a.flags.c_contiguous, "dynamic quantize")
    q = np.empty(a.shape, np.float32)
    params = np.empty(2, np.float32)
    rc = library.function("optcli_dynamic_quantize_f32")(a, a.size, q, params)
    if rc == 1:
        return None
    _check(rc, "dynamic quantize")
    return q, params[0], params[1]


def _dot_panels(rt: np.ndarray, max_k: int = 1024) -> tuple[np.ndarray | None, np.ndarray | None]:
    """QUANTIZE_H's R^T integers [dirs, K, N] (or a projection's W^T) as int8 in vpdpbusd's panels,
    [dirs, ceil(N / 16), ceil(K / 4), 16, 4] zero-padded, and their column sums [dirs, N] int32
    (optcli_native.h); (None, None) where an integer does not fit int8 (uint8 weights with a zero
    point far from 128), or the layer is larger than the C path takes: the float product of the same
    integers runs there."""
    dirs, k, n = rt.shape
    if k > max_k or n > 4096 or rt.size == 0 or rt.min() < -128 or rt.max() > 127:
        return None, None
    k4, np16 = -(-k // 4), -(-n // 16)
    padded = np.zeros((dirs, k4 * 4, np16 * 16), np.int8)
    padded[:, :k, :n] = rt.astype(np.int8)
    rq = np.ascontiguousarray(padded.reshape(dirs, k4, 4, np16, 16).transpose(0, 3, 1, 4, 2))
    return rq, np.ascontiguousarray(rt.astype(np.int64).sum(axis=1).astype(np.int32))


def dot_projection(wc: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A DynamicQuantizeLSTM's W integers [dirs, K, N] packed for ``dynamic_qrows`` once, or None where
    they do not fit its int8 panels or the CPU has no AVX-512 VNNI (the float product runs)."""
    from optcli.native import qgemm

    rq, rqsum = _dot_panels(wc, max_k=4096)
    return None if rq is None or qgemm.variant() != 4 else (rq, rqsum)


def dynamic_qrows(q: np.ndarray, scale: np.float32, zp: np.float32, packed: tuple[np.ndarray, np.ndarray],
                  d: int, col_scale: np.ndarray, bias: np.ndarray | None, out: np.ndarray) -> bool:
    """out [rows, N] = float(q @ W[d]) * (scale * col_scale) (+ bias), the product by vpdpbusd (exact,
    the numbers of the float path); False (out untouched) where the CPU path was turned off since."""
    rq, rqsum = packed
    rows, k = q.shape
    n = rqsum.shape[1]
    require(out.shape == (rows, n) and out.flags.c_contiguous and out.dtype == np.float32, "dynamic qrows")
    qp = np.array([scale, zp], np.float32)
    rc = library.function("optcli_dynamic_qrows_f32")(q, qp, rq[d], rqsum[d], col_scale, bias, out,
                                                      _geom((rows, k, n)))
    if rc == -3:  # OPT_ENOTSUP: no AVX-512 VNNI (a test turned the dot-product path off)
        return False
    _check(rc, "dynamic quantized projection")
    return True


def recurrent(cell: str, xp: np.ndarray, rt: np.ndarray, rbh: np.ndarray | None, p: np.ndarray | None,
              h0: np.ndarray | None, c0: np.ndarray | None, lens: np.ndarray | None, direction: str,
              acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float | None, flags: int,
              want_y: bool = True) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Run the time loop of one layer.  ``xp`` [dirs, seq, batch, G * H] is the input projection with
    the folded biases, ``rt`` [dirs, H, G * H] R transposed (see optcli_native.h for the rest).
    Returns (Y [seq, dirs, batch, H] or None without ``want_y``, Y_h, Y_c or None) in float32."""
    return prepared_recurrent(cell, rt, rbh, direction, acts, alphas, betas, clip, flags)(xp, p, h0, c0, lens, want_y)


def prepared_recurrent(cell: str, rt: np.ndarray, rbh: np.ndarray | None, direction: str, acts: np.ndarray,
                       alphas: np.ndarray, betas: np.ndarray, clip: float | None, flags: int,
                       qscale: np.ndarray | None = None):
    """``recurrent`` for one layer's weights and attributes, worked out once: a function of
    ``(xp, p, h0, c0, lens, want_y)``.  The weights' arrays are checked and made contiguous here;
    per call only the inputs are (a voice detector's 16-step LSTM spends ~25 us in its C loop, and
    the per-call conversions of every argument took as long again).  ``qscale`` [dirs, 4H] with
    QUANTIZE_H in ``flags``: DynamicQuantizeLSTM's R scales per column, ``rt`` then R's integers less
    their zero point (optcli_native.h)."""
    require(library._lib is not None and cell in CELLS and direction in DIRECTIONS and rt.ndim == 3, "recurrent")
    dirs, hidden, gh = rt.shape
    require(gh == GATES[cell] * hidden and hidden >= 1, "recurrent")
    rt = _f32(rt, (dirs, hidden, gh))
    require((qscale is not None) == bool(flags & QUANTIZE_H) and (qscale is None or cell == "LSTM"), "recurrent")
    rq, rqsum = _dot_panels(rt) if qscale is not None else (None, None)
    rt = _panels(rt)
    rbh = _f32(rbh, (dirs, hidden))
    qscale = _f32(qscale, (dirs, gh))
    acts = np.ascontiguousarray(acts, dtype=np.int32)
    alphas = np.ascontiguousarray(alphas, dtype=np.float32)
    betas = np.ascontiguousarray(betas, dtype=np.float32)
    require(acts.shape == alphas.shape == betas.shape == (3 * dirs,), "recurrent")
    fn, code, way = library.function("optcli_recurrent_f32"), CELLS[cell], DIRECTIONS[direction]
    fixed = (rt, rbh, qscale, rq, rqsum)
    act_args = (acts, alphas, betas, 0.0 if clip is None else float(clip), flags | (CLIP if clip is not None else 0))
    lstm = cell == "LSTM"

    def call(xp: np.ndarray, p: np.ndarray | None, h0: np.ndarray | None, c0: np.ndarray | None,
             lens: np.ndarray | None, want_y: bool = True):
        require(xp.ndim == 4 and xp.shape[0] == dirs and xp.shape[3] == gh, "recurrent")
        seq, batch = xp.shape[1], xp.shape[2]
        xp = _f32(xp, (dirs, seq, batch, gh))
        p = _f32(p, (dirs, 3 * hidden))
        h0 = _f32(h0, (dirs, batch, hidden))
        c0 = _f32(c0, (dirs, batch, hidden))
        if lens is not None:
            lens = np.ascontiguousarray(lens, dtype=np.int32)
            require(lens.shape == (batch,), "recurrent")
        y = np.empty((seq, dirs, batch, hidden), np.float32) if want_y else None
        yh = np.empty((dirs, batch, hidden), np.float32)
        yc = np.empty((dirs, batch, hidden), np.float32) if lstm else None
        _check(fn(code, xp, *fixed, p, h0, c0, lens, y, yh, yc, _geom((dirs, seq, batch, hidden, way)), *act_args),
               f"{cell} time loop")
        return y, yh, yc

    call.code, call.fixed, call.act_args = code, fixed, act_args  # for prepared_layer
    return call


def prepared_layer(cell: str, wt: np.ndarray, folded: np.ndarray, rt: np.ndarray, rbh: np.ndarray | None,
                   direction: str, acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float | None,
                   flags: int, seq: int, batch: int, has_p: bool, loop: Any = None):
    """A whole layer for one plan step and one input shape, worked out once: a function of ``(x, p,
    h0, c0)`` (x [seq, batch, I], the others as ``recurrent`` takes them, all C-contiguous float32,
    checked each call) giving (Y, Y_h, Y_c or None).  The input projection (``wt`` [dirs, I, G * H],
    W transposed; ``folded`` [dirs, G * H] the biases) and the time loop are two C calls on one
    buffer holding the three outputs (and, for a small layer, the projection, whose biases then come
    in as the GEMM's residual, broadcast once), their addresses worked out from one: a voice
    detector's 16-step LSTM of 64 units spent ~40 us of its ~80 in the wrappers' checks,
    conversions and address lookups, around ~40 us of C."""
    require(library._lib is not None and cell in CELLS and direction in DIRECTIONS and rt.ndim == 3 and wt.ndim == 3,
            "recurrent layer")
    dirs, hidden, gh = rt.shape
    size = wt.shape[1]
    require(wt.shape == (dirs, size, gh) and folded.shape == (dirs, gh) and seq >= 1 and batch >= 1 and size >= 1,
            "recurrent layer")
    wt, folded = _f32(wt, wt.shape), _f32(folded, folded.shape).reshape(dirs, 1, 1, gh)
    if loop is None:  # the same layer's time loop, prepared already (its R packed once) where the caller has it
        loop = prepared_recurrent(cell, rt, rbh, direction, acts, alphas, betas, clip, flags)
    fn = library.function("optcli_recurrent_f32")
    gemm = library.function("optcli_gemm_conv_f32")
    code, fixed, act_args = loop.code, loop.fixed, loop.act_args
    lstm = cell == "LSTM"
    n_xp, n_y, n_h = dirs * seq * batch * gh, seq * dirs * batch * hidden, dirs * batch * hidden
    n_out = n_y + n_h * (2 if lstm else 1)
    small = n_xp <= _RESIDUAL_MAX  # a large layer's projection is not kept alive with its outputs
    geom_array = np.array((dirs, seq, batch, hidden, DIRECTIONS[direction]), np.int64)
    state, x_shape, p_shape = (dirs, batch, hidden), (seq, batch, size), (dirs, 3 * hidden)
    wt_addrs = [_ptr(wt) + 4 * d * size * gh for d in range(dirs)]
    # small layers take the biases as the GEMM's residual, made once for the shape (one pass less)
    biases = np.ascontiguousarray(np.broadcast_to(folded, (dirs, seq, batch, gh))) if small else None
    bias_addrs = [None] * dirs if biases is None else [_ptr(biases) + 4 * d * seq * batch * gh for d in range(dirs)]
    f32, nd, empty, add = np.dtype(np.float32), np.ndarray, np.empty, np.add

    def ok(a: np.ndarray | None, shape: tuple) -> bool:
        return a is None or (type(a) is nd and a.dtype is f32 and a.shape == shape and a.flags.c_contiguous)

    def call(x: np.ndarray, p: np.ndarray | None, h0: np.ndarray | None, c0: np.ndarray | None):
        # x and h0 checked inline (a decoder Loop's GRU step calls this every iteration), p and c0,
        # absent in most models, through ok
        if not (type(x) is nd and x.dtype is f32 and x.shape == x_shape and x.flags.c_contiguous
                and (h0 is None or (type(h0) is nd and h0.dtype is f32 and h0.shape == state
                                    and h0.flags.c_contiguous))
                and (p is None) != has_p and (p is None or ok(p, p_shape))
                and (c0 is None or (lstm and ok(c0, state)))):
            require(False, "recurrent layer")
        if small:
            buf = empty(n_xp + n_out, f32)
            base = _ptr(buf)
            out, y_addr = buf[n_xp:], base + 4 * n_xp
        else:
            buf, out = empty(n_xp, f32), empty(n_out, f32)
            base, y_addr = _ptr(buf), _ptr(out)
        for d in range(dirs):  # xp[d] = x @ W[d]^T: [seq * batch, I] @ [I, G * H]
            rc = gemm(x, wt_addrs[d], None, bias_addrs[d], base + 4 * d * seq * batch * gh, 1, seq * batch, size,
                      gh, 0, 0.0, 0.0)
            if rc:
                _check(rc, "recurrent input projection")
        if biases is None:
            xp = buf[:n_xp].reshape(dirs, seq, batch, gh)
            add(xp, folded, out=xp)
        yh_addr = y_addr + 4 * n_y
        rc = fn(code, base, *fixed, p, h0, c0, None, y_addr, yh_addr,
                yh_addr + 4 * n_h if lstm else None, geom_array, *act_args)
        if rc:
            _check(rc, f"{cell} time loop")
        y = out[:n_y].reshape(seq, dirs, batch, hidden)
        yh = out[n_y:n_y + n_h].reshape(state)
        yc = out[n_y + n_h:].reshape(state) if lstm else None
        return y, yh, yc

    call.keep = (wt, folded, biases, geom_array, loop)  # what the addresses point into
    return call
