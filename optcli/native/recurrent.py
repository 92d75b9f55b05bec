"""The recurrent layers' time loop (kernels/host/recurrent.c): LSTM, GRU and RNN steps after the
input projection, for every direction and batch row on the pool."""

from __future__ import annotations

import numpy as np

from optcli.native import library
from optcli.native.caches import _geom, _ptr
from optcli.native.library import _check, require

CELLS = {"LSTM": 0, "GRU": 1, "RNN": 2}
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}
INPUT_FORGET, LINEAR_BEFORE_RESET, CLIP = 1, 2, 4


def _f32(a: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` as a C-contiguous float32 array of ``shape`` (checked: the C reads exactly that much)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a, dtype=np.float32)
    require(a.shape == shape, "recurrent")
    return a


def recurrent(cell: str, xp: np.ndarray, rt: np.ndarray, rbh: np.ndarray | None, p: np.ndarray | None,
              h0: np.ndarray | None, c0: np.ndarray | None, lens: np.ndarray | None, direction: str,
              acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float | None, flags: int,
              want_y: bool = True) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Run the time loop of one layer.  ``xp`` [dirs, seq, batch, G * H] is the input projection with
    the folded biases, ``rt`` [dirs, H, G * H] R transposed (see optcli_native.h for the rest).
    Returns (Y [seq, dirs, batch, H] or None without ``want_y``, Y_h, Y_c or None) in float32."""
    return prepared_recurrent(cell, rt, rbh, direction, acts, alphas, betas, clip, flags)(xp, p, h0, c0, lens, want_y)


def prepared_recurrent(cell: str, rt: np.ndarray, rbh: np.ndarray | None, direction: str, acts: np.ndarray,
                       alphas: np.ndarray, betas: np.ndarray, clip: float | None, flags: int):
    """``recurrent`` for one layer's weights and attributes, worked out once: a function of
    ``(xp, p, h0, c0, lens, want_y)``.  The weights' arrays and addresses are checked and taken here;
    per call only the inputs are (a voice detector's 16-step LSTM spends ~25 us in its C loop, and
    the per-call conversions of every argument took as long again)."""
    require(library._lib is not None and cell in CELLS and direction in DIRECTIONS and rt.ndim == 3, "recurrent")
    dirs, hidden, gh = rt.shape
    require(gh == GATES[cell] * hidden and hidden >= 1, "recurrent")
    rt = _f32(rt, (dirs, hidden, gh))
    rbh = _f32(rbh, (dirs, hidden))
    acts = np.ascontiguousarray(acts, dtype=np.int32)
    alphas = np.ascontiguousarray(alphas, dtype=np.float32)
    betas = np.ascontiguousarray(betas, dtype=np.float32)
    require(acts.shape == alphas.shape == betas.shape == (3 * dirs,), "recurrent")
    fn, code, way = library._lib.optcli_recurrent_f32, CELLS[cell], DIRECTIONS[direction]
    fixed = (_ptr(rt), _ptr(rbh))
    act_addrs = (_ptr(acts), _ptr(alphas), _ptr(betas), 0.0 if clip is None else float(clip),
                 flags | (CLIP if clip is not None else 0))
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
        geom, geom_addr = _geom((dirs, seq, batch, hidden, way))
        _check(fn(code, _ptr(xp), *fixed, _ptr(p), _ptr(h0), _ptr(c0), _ptr(lens), _ptr(y), _ptr(yh), _ptr(yc),
                  geom_addr, *act_addrs), f"{cell} time loop")
        del geom
        return y, yh, yc

    return call
