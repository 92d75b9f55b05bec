"""onnxruntime's dynamically quantized LSTM (``com.microsoft.DynamicQuantizeLSTM``, what its
``quantize_dynamic`` makes of every LSTM), with onnxruntime's numerics.

Why not the float LSTM of the dequantized weights (what ran before): onnxruntime does not run that.
Its two GEMMs (onnxruntime/core/providers/cpu/rnn/rnn_helpers.cc, ``ComputeGemm`` with uint8
weights; uni_directional_lstm.cc) quantize their float operand to uint8 on the fly and multiply it
by the 8-bit weights with integer accumulation, and that rounding of X and of h every step moved a
speech model's output ~1e-1 of its scale from the float LSTM's, twice the int8 budget.  So here:

- A's range is [min(A, 0), max(A, 0)] over the whole operand of one GEMM call (scale = range / 255,
  1 for an all-zero A; zero point = round-half-even(-min / scale)), and A's values go to
  ``clip(rint(A / scale), -zp, 255 - zp)`` (as MLAS: divide, clamp, round to nearest even).
- The input projection is one GEMM over the first max(sequence_lens) steps of X, every batch row;
  each direction's call sees the same values (the reverse one reordered), so one quantization
  serves both.  Its result, ``float(acc) * (x_scale * w_scale[col])``, gets the biases Wb + Rb.
- Each step's recurrence is one GEMM of h(t-1) for the batch's rows together (a row past its length
  contributes zeros, as its Y row is; the first step takes initial_h as given, zeros quantizing to
  zero exactly), added as ``float(acc) * (h_scale * r_scale[col])``.  onnxruntime splits the batch
  rows over its threads where batch >= 2 and hidden <= 256, each group with its own range: this
  follows its single-threaded run, which is the same whatever the machine.
- The weight's zero point is centred per column (onnxruntime takes the first and requires the rest
  to equal it, or int8 weights to be symmetric: the same numbers wherever it runs).

How it runs: the integer products are float32 sums of integers (the centred 8-bit values), exact
while every partial sum stays below 2**24 (K * 255 * max|w - zp|: inputs and hidden sizes up to
~500 with 8-bit weights, ~1000 with 7-bit ones), else float64.  The projection runs in the native
GEMM, or where the CPU has AVX-512 VNNI and W fits int8 by vpdpbusd in int32 (the same numbers:
``native_recurrent.dynamic_qrows``); the time loop natively for batch 1 (``kernels/host/recurrent.c``
with QUANTIZE_H: one row is then the whole batch) and where its activations have native code, else
in the numpy loop here, the reference the native one is tested against.  Why not the float LSTM on
X and h quantized and back (the same values up to float32 rounding, and no slower): a rounding
difference flips a quantization tie now and then, and over a 100-step speech model that left 6e-4
(3e-3 of the output's scale) from onnxruntime, where integer sums leave 3e-8.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli import native
from optcli.errors import ModelError
from optcli.native import recurrent as native_recurrent
from optcli.ops.quant import _FLOAT32_EXACT, _params_of_range
from optcli.ops.recurrent import (
    ACTIVATIONS,
    CELLS,
    _direction,
    _native_activations,
    _sequence_lengths,
    gate_activation,
    lstm_gates,
    recurrent_shape,
    resolve_activations,
)
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, shape_fn

MS = "com.microsoft"
# What a DynamicQuantizeLSTM whose weights do not fit each other can do about it.
_FIX = ": the model's quantized LSTM weights are inconsistent; quantize or export the model again"


def quantized_operand(a: np.ndarray, seen: np.ndarray | None = None) -> tuple[np.ndarray, np.float32]:
    """``a`` (float32) as onnxruntime's dynamic GEMM quantizes it: (uint8 values minus the zero
    point, exact integers in float32; the scale).  The range is ``seen``'s (default ``a``'s): the
    part of X the projection GEMM reads."""
    seen = a if seen is None else seen
    scale, zp = _params_of_range(seen.min(initial=np.float32(0)), seen.max(initial=np.float32(0)))
    q = np.divide(a, scale, dtype=np.float32)
    np.rint(q, out=q)
    np.clip(q, -np.float32(zp), np.float32(255) - np.float32(zp), out=q)
    return q, scale


def centred_weight(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
                   what: str) -> tuple[np.ndarray, np.ndarray]:
    """A DynamicQuantizeLSTM weight [dirs, k, 4H] (int8 / uint8; scale and zero point per direction
    [dirs] or per column [dirs, 4H]) as (q - zp in float32 [dirs, k, 4H], the scale per column
    [dirs, 4H] float32).  A scale or zero point of another shape is the model's fault: ModelError."""
    q = np.asarray(q)
    scale = np.asarray(scale, np.float32)
    zp = np.zeros(scale.shape, np.int32) if zero_point is None else np.asarray(zero_point).astype(np.int32)
    if q.ndim != 3 or q.dtype not in (np.int8, np.uint8):
        raise ModelError(f"DynamicQuantizeLSTM {what} is {q.dtype} of shape {list(q.shape)}; [dirs, k, 4H] "
                         f"int8 or uint8 is expected{_FIX}")
    dirs, _, cols = q.shape
    if scale.shape not in ((dirs,), (dirs, cols)) or zp.shape != scale.shape:
        raise ModelError(f"DynamicQuantizeLSTM {what}_scale has shape {list(scale.shape)} and its zero point "
                         f"{list(zp.shape)}; [{dirs}] or [{dirs}, {cols}] are expected{_FIX}")
    per_col = (lambda a: a[:, None, :]) if scale.ndim == 2 else (lambda a: a[:, None, None])
    centred = (q.astype(np.int32) - per_col(zp)).astype(np.float32)
    return np.ascontiguousarray(centred), np.ascontiguousarray(np.broadcast_to(per_col(scale)[:, 0], (dirs, cols)))


def integer_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of centred 8-bit integers (float32), exactly: float32 while every partial sum is an
    integer below 2**24, else float64; float32 out."""
    if a.shape[-1] * 255.0 * float(np.abs(b).max(initial=0)) < _FLOAT32_EXACT:
        return np.matmul(a, b)
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


class QuantizedLSTM:
    """One DynamicQuantizeLSTM node's weights in the forms its runs need, made once per bound step
    (kept in the step's memo while the same weight arrays come back, as a plan's constants do)."""

    def __init__(self, inputs: list, attrs: dict[str, Any]):
        self.source = tuple(inputs[k] for k in (1, 2, 3, 8, 9, 10, 11))
        w, r, b, ws, wzp, rs, rzp = self.source
        self.direction, self.dirs = _direction(CELLS["LSTM"], attrs)
        self.wc, self.wscale = centred_weight(w, ws, wzp, "W")
        self.rc, self.rscale = centred_weight(r, rs, rzp, "R")
        dirs, size, gh = self.wc.shape
        self.hidden = gh // 4
        if self.rc.shape != (dirs, self.hidden, gh) or dirs != self.dirs or gh != 4 * self.hidden:
            raise ModelError(f"DynamicQuantizeLSTM W has shape {list(self.wc.shape)} and R {list(self.rc.shape)}; "
                             f"[{self.dirs}, input, 4H] and [{self.dirs}, H, 4H] are expected{_FIX}")
        bias = np.zeros((dirs, 2 * gh), np.float32) if b is None else np.asarray(b, np.float32)
        if bias.shape != (dirs, 2 * gh):
            raise ModelError(f"DynamicQuantizeLSTM B has shape {list(bias.shape)}; [{dirs}, {2 * gh}] is "
                             f"expected{_FIX}")
        self.folded = np.ascontiguousarray(bias[:, :gh] + bias[:, gh:])
        self.acts = resolve_activations(CELLS["LSTM"], attrs, dirs)
        clip = attrs.get("clip")
        self.clip = None if clip is None else float(clip)
        self.flags = native_recurrent.INPUT_FORGET if int(attrs.get("input_forget", 0)) else 0
        self.batch_first = int(attrs.get("layout", 0)) == 1
        # float32 sums the integer products exactly while every partial sum stays under 2**24
        self.x_exact = size * 255.0 * float(np.abs(self.wc).max(initial=0)) < _FLOAT32_EXACT
        r_exact = self.hidden * 255.0 * float(np.abs(self.rc).max(initial=0)) < _FLOAT32_EXACT
        # the projection's integer product by vpdpbusd, where the CPU has AVX-512 VNNI and W fits int8
        self.wdot = native_recurrent.dot_projection(self.wc) if native.available() and self.x_exact else None
        self.call = None  # the native time loop in its quantized-h mode, where it applies
        if native.available() and r_exact and all(ACTIVATIONS[n].native for n, _, _ in self.acts):
            self.call = native_recurrent.prepared_recurrent(
                "LSTM", self.rc, None, self.direction, *_native_activations(CELLS["LSTM"], self.acts, dirs),
                self.clip, self.flags | native_recurrent.QUANTIZE_H, qscale=self.rscale)

    def projection(self, x: np.ndarray, rows: int, use_native: bool) -> np.ndarray:
        """[dirs, seq, batch, 4H]: the input projection of X's first ``rows`` steps (the rest zero,
        never read) plus the biases.  The integer product natively where it is exact in float32 (numpy's
        BLAS threads would spin against the native pool's after it), else in numpy."""
        seq, batch, size = x.shape
        xp = np.empty((self.dirs, seq, batch, 4 * self.hidden), np.float32)
        xp[:, rows:] = 0
        if rows * batch == 0:
            return xp
        operand = np.ascontiguousarray(x[:rows].reshape(rows * batch, size))
        in_native = use_native and self.x_exact and native.available()
        made = native_recurrent.dynamic_quantize(operand) if in_native else None
        xq, xs = made[:2] if made is not None else quantized_operand(operand)
        if made is not None and self.wdot is not None and all(
                native_recurrent.dynamic_qrows(xq, xs, made[2], self.wdot, d, self.wscale[d], self.folded[d],
                                               xp[d, :rows].reshape(rows * batch, -1)) for d in range(self.dirs)):
            return xp
        for d in range(self.dirs):
            acc = xp[d, :rows].reshape(rows * batch, -1)
            if in_native:
                native.gemm_conv(xq, self.wc[d][None], out=acc[None])
            else:
                acc[...] = integer_product(xq, self.wc[d])
        head = xp[:, :rows]  # the scales and biases of every direction in one pass each
        head *= (xs * self.wscale)[:, None, None, :]
        head += self.folded[:, None, None, :]
        return xp

    def run(self, x: np.ndarray, lens: np.ndarray | None, h0, c0, p, use_native: bool = True) -> list[np.ndarray]:
        """Y, Y_h, Y_c.  The native time loop runs batch 1 (its per-row quantization of h is then the
        batch's); ``use_native=False`` runs the numpy loop (the tests compare the two)."""
        if self.batch_first:
            x = np.asarray(x).transpose(1, 0, 2)
            h0 = None if h0 is None else np.asarray(h0).transpose(1, 0, 2)
            c0 = None if c0 is None else np.asarray(c0).transpose(1, 0, 2)
        x = np.ascontiguousarray(x, np.float32)
        seq, batch, _ = x.shape
        lens = _sequence_lengths(lens, seq, batch)
        xp = self.projection(x, seq if lens is None else int(lens.max(initial=0)), use_native)
        h0, c0, p = (None if v is None else np.ascontiguousarray(v, np.float32) for v in (h0, c0, p))
        if use_native and batch == 1 and self.call is not None and native.available():
            y, yh, yc = self.call(xp, p, h0, c0, lens)
        else:
            y, yh, yc = self.numpy_loop(xp, lens, h0, c0, p)
        if self.batch_first:
            y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
        return [np.ascontiguousarray(v) for v in (y, yh, yc)]

    def numpy_loop(self, xp, lens, h0, c0, p):
        """The time loop, every batch row together at each step, as onnxruntime batches them: row b
        at step s is at time s (forward) or len_b - 1 - s (reverse)."""
        dirs, seq, batch, gh = xp.shape
        hidden = self.hidden
        lens = np.full(batch, seq, np.int64) if lens is None else lens
        y = np.zeros((seq, dirs, batch, hidden), np.float32)
        yh = np.zeros((dirs, batch, hidden), np.float32)
        yc = np.zeros((dirs, batch, hidden), np.float32)
        rows = np.arange(batch)
        for d in range(dirs):
            act = gate_activation(self.acts, d, 3, self.clip, np.float32)
            reverse = self.direction == "reverse" or d == 1
            h = np.zeros((batch, hidden), np.float32) if h0 is None else h0[d].copy()
            c = np.zeros((batch, hidden), np.float32) if c0 is None else c0[d].copy()
            operand = h  # what this step's recurrence GEMM quantizes: h(t-1), zeros for finished rows
            for s in range(int(lens.max(initial=0))):
                live = s < lens
                t = np.where(live, lens - 1 - s if reverse else s, 0)
                hq, hs = quantized_operand(operand)
                acc = integer_product(hq, self.rc[d])
                acc *= hs * self.rscale[d]
                g = xp[d, t, rows] + acc
                h_new, c_new = lstm_gates(g, c, None if p is None else p[d], act, self.flags)
                h = np.where(live[:, None], h_new, h)
                c = np.where(live[:, None], c_new, c)
                operand = np.where(live[:, None], h_new, np.float32(0))
                y[t[live], d, rows[live]] = h_new[live]
            ended = (lens > 0)[:, None]
            yh[d], yc[d] = np.where(ended, h, 0), np.where(ended, c, 0)
        return y, yh, yc


def _prepared(inputs: list, attrs: dict[str, Any]) -> QuantizedLSTM:
    memo = getattr(attrs, "memo", None)
    hit = memo.get("quantized lstm") if memo is not None else None
    source = tuple(inputs[k] if k < len(inputs) else None for k in (1, 2, 3, 8, 9, 10, 11))
    if hit is not None and all(a is b for a, b in zip(hit.source, source)):
        return hit
    made = QuantizedLSTM(list(inputs) + [None] * (12 - len(inputs)), attrs)
    if memo is not None:
        memo["quantized lstm"] = made
    return made


@kernel("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """onnxruntime's ``quantize_dynamic`` LSTM with its numerics: X and h quantized to uint8 per GEMM
    call, integer products with the 8-bit W and R (module docstring)."""
    def get(k: int) -> np.ndarray | None:
        return inputs[k] if k < len(inputs) else None

    return _prepared(inputs, attrs).run(get(0), get(4), get(5), get(6), get(7))


@shape_fn("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm_shape(args: ShapeArgs) -> list[Shape]:
    """The LSTM's rule, with W [dirs, input, 4H] and R [dirs, H, 4H] stored transposed."""
    def t(s: Shape) -> Shape:
        return None if s is None or len(s) != 3 else (s[0], s[2], s[1])

    shapes = list(args.shapes[:8]) + [None] * max(0, 8 - len(args.shapes))
    shapes[1], shapes[2] = t(args.shape(1)), t(args.shape(2))
    lstm_args = ShapeArgs(shapes, list(args.values[:8]), args.attrs, args.opset, list(args.present[:8]),
                          list(args.dims[:8]), args.n_outputs, "LSTM")
    return recurrent_shape(lstm_args)
