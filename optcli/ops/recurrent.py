"""Recurrent ops: LSTM, GRU and RNN on the host, every attribute of the ONNX spec, and their shape rules.

How a layer runs: the input projection of all time steps is one GEMM (``X @ W^T`` per direction,
the biases folded in), then the time loop, which cannot be batched over time, runs in the native
library (``kernels/host/recurrent.c``: one call for the whole layer, directions and batch rows on
the pool).  Where the library is absent, the data is not float32, or an activation has no native
code (Affine, ThresholdedRelu, ScaledTanh, Elu, Softsign, Softplus), the same loop runs here in
numpy: the reference the native loop is tested against, and correct for every attribute.

Why not onnx's reference implementation (what ran before): it ignores ``activations``,
``activation_alpha``/``beta``, ``clip`` and ``sequence_lens`` (wrong answers for models that set
them) and costs ~10 numpy calls per time step.  The semantics here follow onnxruntime, which the
tests compare against: rows past their sequence length give zeros in Y and keep their last state
in Y_h / Y_c (a row of length 0: zeros), and the reverse direction of such a row starts at its
last step.

The GPU runs all three with the same attributes (``optcli.gpu.ops_recurrent``), its buffers sized
from these rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from optcli import native
from optcli.native import recurrent as native_recurrent
from optcli.ops.registry import kernel
from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, is_int, same_dim, shape_fn


@dataclass(frozen=True)
class Cell:
    """One recurrent op's layout: gates per step, activations per direction and their defaults."""

    op: str
    gates: int
    default_activations: tuple[str, ...]

    @property
    def n_activations(self) -> int:
        return len(self.default_activations)


CELLS = {
    "LSTM": Cell("LSTM", 4, ("Sigmoid", "Tanh", "Tanh")),  # gates i, o, f, c
    "GRU": Cell("GRU", 3, ("Sigmoid", "Tanh")),  # gates z, r, h
    "RNN": Cell("RNN", 1, ("Tanh",)),
}


@dataclass(frozen=True)
class RecurrentActivation:
    """One ONNX recurrent activation: its numpy form, what alpha / beta default to when the
    attribute lists run out, and its code in the native library (None: numpy only)."""

    fn: Any  # (x, alpha, beta) -> array
    uses_alpha: bool
    uses_beta: bool
    default_alpha: float
    default_beta: float
    native: str | None


def _sigmoid(x, a, b):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# Keys are lower case: the spec's names are matched without case, as onnxruntime does.  The spec
# gives no defaults for alpha and beta; these are onnxruntime's (0 but for LeakyRelu, HardSigmoid
# and Elu, the defaults of the stand-alone ops), so a model that leaves them out means the same.
ACTIVATIONS: dict[str, RecurrentActivation] = {
    "relu": RecurrentActivation(lambda x, a, b: np.maximum(x, 0), False, False, 0, 0, "relu"),
    "tanh": RecurrentActivation(lambda x, a, b: np.tanh(x), False, False, 0, 0, "tanh"),
    "sigmoid": RecurrentActivation(_sigmoid, False, False, 0, 0, "sigmoid"),
    "affine": RecurrentActivation(lambda x, a, b: a * x + b, True, True, 0, 0, None),
    "leakyrelu": RecurrentActivation(lambda x, a, b: np.where(x >= 0, x, a * x), True, False, 0.01, 0, "leaky_relu"),
    "thresholdedrelu": RecurrentActivation(lambda x, a, b: np.where(x > a, x, 0), True, False, 0, 0, None),
    "scaledtanh": RecurrentActivation(lambda x, a, b: a * np.tanh(b * x), True, True, 0, 0, None),
    "hardsigmoid": RecurrentActivation(lambda x, a, b: np.clip(a * x + b, 0, 1), True, True, 0.2, 0.5,
                                       "hard_sigmoid"),
    "elu": RecurrentActivation(lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), True, False,
                               1.0, 0, None),
    "softsign": RecurrentActivation(lambda x, a, b: x / (1 + np.abs(x)), False, False, 0, 0, None),
    "softplus": RecurrentActivation(lambda x, a, b: np.logaddexp(0, x), False, False, 0, 0, None),
}


def resolve_activations(cell: Cell, attrs: dict[str, Any], dirs: int) -> list[tuple[str, float, float]]:
    """The activations as (lower-case name, alpha, beta), ``cell.n_activations`` per direction.

    ``activations`` lists them for every direction (one direction's list is taken for both of a
    bidirectional layer, as onnxruntime does); ``activation_alpha`` / ``activation_beta`` are
    consumed in that order by the activations that take them, defaults once they run out.
    Raises ShapeDerivationError (a property of the model, reported at load) on anything else."""
    names = [str(n.decode() if isinstance(n, bytes) else n) for n in attrs.get("activations") or ()]
    n = cell.n_activations
    if not names:
        names = list(cell.default_activations) * dirs
    elif len(names) == n and dirs == 2:
        names = names * 2
    elif len(names) != n * dirs:
        raise ShapeDerivationError(f"{cell.op} lists {len(names)} activations; {n * dirs} are expected "
                                   f"({n} per direction, {dirs} direction{'s' if dirs > 1 else ''})")
    alphas = [float(a) for a in attrs.get("activation_alpha") or ()]
    betas = [float(b) for b in attrs.get("activation_beta") or ()]
    out = []
    for name in names:
        act = ACTIVATIONS.get(name.lower())
        if act is None:
            raise ShapeDerivationError(f"{cell.op} activation '{name}' is not one of the spec's "
                                       f"({', '.join(sorted(ACTIVATIONS))})")
        alpha = alphas.pop(0) if act.uses_alpha and alphas else act.default_alpha
        beta = betas.pop(0) if act.uses_beta and betas else act.default_beta
        out.append((name.lower(), alpha, beta))
    return out


def _direction(cell: Cell, attrs: dict[str, Any]) -> tuple[str, int]:
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ShapeDerivationError(f"{cell.op} direction '{direction}' is not forward, reverse or bidirectional")
    return direction, 2 if direction == "bidirectional" else 1


# ---------------------------------------------------------------------------------------------
# Kernels


def _sequence_lengths(lens: np.ndarray | None, seq: int, batch: int) -> np.ndarray | None:
    """sequence_lens as int64 [batch], or None when every row runs the whole sequence.  A length
    outside [0, seq] is the input's fault: IndexError, which the executor reports as such."""
    if lens is None:
        return None
    lens = np.asarray(lens)
    if lens.shape != (batch,) or lens.dtype.kind not in "iu":
        raise IndexError(f"sequence_lens has shape {list(lens.shape)} ({lens.dtype}); [{batch}] int32 is expected")
    if lens.size and (lens.min() < 0 or lens.max() > seq):
        raise IndexError(f"sequence_lens holds {int(lens.min())}..{int(lens.max())}, outside 0..{seq} "
                         "(the sequence's length)")
    lens = lens.astype(np.int64)
    return None if bool(np.all(lens == seq)) else lens


def _transposed_r(r: np.ndarray, work: type) -> np.ndarray:
    """R [dirs, G*H, H] as [dirs, H, G*H] (the native loop's form), made once per constant R."""
    def make(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a, dtype=work).transpose(0, 2, 1))

    made = native.derived(r, f"recurrent_rt_{np.dtype(work).name}", make) if native.available() else None
    return made if made is not None else make(r)


@dataclass
class _Weights:
    """What a layer derives from its weights and attributes, once per bound step (kept in the
    step's ``memo`` while the same weight arrays come back, as a plan's constants do)."""

    source: tuple  # the (W, R, B) arrays it was made from, compared by identity
    w: np.ndarray
    folded: np.ndarray  # [dirs, G*H]: the biases added to the input projection
    rt: np.ndarray  # [dirs, H, G*H]: R transposed
    wt: np.ndarray  # [dirs, I, G*H]: W transposed, for the native input projection
    rbh: np.ndarray | None  # GRU: [dirs, H], Rb of the h gate
    acts: list
    native_acts: tuple | None  # (codes, alphas, betas), None where an activation has no native code
    clip: float | None
    flags: int
    call: Any = None  # the native time loop, prepared (native_recurrent.prepared_recurrent), or None


def _weights(cell: Cell, w, r, b, attrs: dict[str, Any], dirs: int, work: type) -> _Weights:
    memo = getattr(attrs, "memo", None)
    key = ("recurrent", work)
    hit = memo.get(key) if memo is not None else None
    if hit is not None and all(a is c for a, c in zip(hit.source, (w, r, b))):
        return hit
    hidden = r.shape[-1]
    gh = cell.gates * hidden
    bias = np.zeros((dirs, 2 * gh), work) if b is None else np.asarray(b, dtype=work)
    wb, rb = bias[:, :gh], bias[:, gh:]
    if cell.op == "GRU":  # Rb of the h gate stays apart: with linear_before_reset it sits inside r * (...)
        folded = wb + np.concatenate([rb[:, :2 * hidden], np.zeros((dirs, hidden), work)], axis=1)
    else:
        folded = wb + rb
    acts = resolve_activations(cell, attrs, dirs)
    clip = attrs.get("clip")
    made = _Weights(
        source=(w, r, b), w=np.asarray(w, dtype=work), folded=folded, rt=_transposed_r(r, work),
        wt=np.ascontiguousarray(np.asarray(w, dtype=work).transpose(0, 2, 1)),
        rbh=np.ascontiguousarray(rb[:, 2 * hidden:]) if cell.op == "GRU" else None, acts=acts,
        native_acts=(_native_activations(cell, acts, dirs) if all(ACTIVATIONS[n].native for n, _, _ in acts)
                     else None),
        clip=None if clip is None else float(clip),
        flags=(native_recurrent.INPUT_FORGET if int(attrs.get("input_forget", 0)) else 0)
        | (native_recurrent.LINEAR_BEFORE_RESET if int(attrs.get("linear_before_reset", 0)) else 0))
    if work is np.float32 and made.native_acts is not None and native.available():
        made.call = native_recurrent.prepared_recurrent(cell.op, made.rt, made.rbh, _direction(cell, attrs)[0],
                                                        *made.native_acts, made.clip, made.flags)
    if memo is not None:
        memo[key] = made
    return made


_ABSENT_INPUTS = (None,) * 8
_F32 = np.dtype(np.float32)


def run_recurrent(cell: Cell, inputs: list[np.ndarray | None], attrs: dict[str, Any],
                  use_native: bool = True) -> list[np.ndarray]:
    """Y, Y_h (and Y_c for LSTM) of one recurrent layer; ``use_native=False`` runs the numpy loop
    (the tests compare the two)."""
    # the inputs padded to eight by slicing (a GRU step in a decoder's Loop runs this every
    # iteration: a generator over a getter cost ~1 us of its ~8)
    x, w, r, b, lens, h0, c0, p = (*inputs[:8], *_ABSENT_INPUTS[len(inputs):])
    if cell.op != "LSTM":
        c0 = p = None
    if use_native and lens is None and type(x) is np.ndarray and x.dtype is _F32 and x.ndim == 3:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)  # a transposed view (an exporter's Transpose before the layer): copied once
        layer = _prepared_layer(cell, x, w, r, b, p, h0, c0, attrs)
        if layer is not None:
            y, yh, yc = layer(x, p, h0, c0)
            return [y, yh] if yc is None else [y, yh, yc]
    dtype = x.dtype
    work = np.float64 if dtype == np.float64 else np.float32
    batch_first = int(attrs.get("layout", 0)) == 1
    direction, dirs = _direction(cell, attrs)
    x = np.asarray(x, dtype=work)
    if batch_first:
        x = x.transpose(1, 0, 2)
        h0 = None if h0 is None else np.asarray(h0).transpose(1, 0, 2)
        c0 = None if c0 is None else np.asarray(c0).transpose(1, 0, 2)
    seq, batch, size = x.shape
    prepared = _weights(cell, w, r, b, attrs, dirs, work)
    gh = prepared.folded.shape[1]
    lens = _sequence_lengths(lens, seq, batch)
    # The input projection of every step: one GEMM per direction.  Natively where the time loop is
    # native: numpy's BLAS threads spin after the product and fight the native pool's for the
    # cores (a speech LSTM's median run went from 1.3 to 33 ms on a busy 2-core machine, its
    # minimum staying 0.9 ms).
    xp = np.empty((dirs, seq, batch, gh), work)
    x2 = np.ascontiguousarray(x.reshape(seq * batch, size))
    in_native = use_native and work == np.float32 and native.available() and seq * batch > 0 and size > 0
    for d in range(dirs):
        out = xp[d].reshape(seq * batch, gh)
        if in_native:
            native.gemm_conv(x2, prepared.wt[d][None], out=out[None])
        else:
            np.matmul(x2, prepared.w[d].T, out=out)
        out += prepared.folded[d]
    if use_native and prepared.call is not None and native.available():
        y, yh, yc = prepared.call(xp, p, h0, c0, lens)
    else:
        if use_native and work == np.float32 and not native.available():
            native.note_unavailable()
        y, yh, yc = _numpy_loop(cell, xp, prepared.rt, prepared.rbh, p, h0, c0, lens, direction, prepared.acts,
                                prepared.clip, prepared.flags)
    if batch_first:
        y = y.transpose(2, 0, 1, 3)
        yh = yh.transpose(1, 0, 2)
        yc = None if yc is None else yc.transpose(1, 0, 2)
    outs = [np.ascontiguousarray(y, dtype=dtype), np.ascontiguousarray(yh, dtype=dtype)]
    if yc is not None:
        outs.append(np.ascontiguousarray(yc, dtype=dtype))
    return outs


def _prepared_layer(cell: Cell, x: np.ndarray, w, r, b, p, h0, c0, attrs: dict[str, Any]):
    """The step's whole layer as one prepared call (``native_recurrent.prepared_layer``), made once
    per input shape and kept in the step's memo beside its weights, where it applies: a bound step
    of float32 weights the native loop runs, sequence-first, no ``sequence_lens``, float32 inputs
    (``x`` made C-contiguous by the caller, the states already so).  None elsewhere (the general
    path)."""
    memo = getattr(attrs, "memo", None)
    if memo is None or not native.available():
        return None
    for v in (h0, c0, p):
        if v is not None and (type(v) is not np.ndarray or v.dtype is not _F32 or not v.flags.c_contiguous):
            return None
    # One slot, the last input shape's: a model of dynamic sequence length (a streaming recogniser)
    # would otherwise keep a prepared layer, buffers and all, for every length it ever saw.
    key = (x.shape, p is None)
    hit = memo.get("recurrent layer")
    if hit is not None and hit[0] == key and hit[1][0] is w and hit[1][1] is r and hit[1][2] is b:
        return hit[2]  # made only where layout 0 held (an attribute: fixed for the step)
    if int(attrs.get("layout", 0)) == 1:
        return None
    direction, dirs = _direction(cell, attrs)
    seq, batch, size = x.shape
    if seq * batch * size == 0 or w.dtype != np.float32:
        return None
    prepared = _weights(cell, w, r, b, attrs, dirs, np.float32)
    hidden = prepared.rt.shape[1]
    state = (dirs, batch, hidden)
    if prepared.call is None or prepared.wt.shape[1] != size or any(
            v is not None and v.shape != want for v, want in ((h0, state), (c0, state), (p, (dirs, 3 * hidden)))):
        return None  # the general path (its checks say what is wrong)
    layer = native_recurrent.prepared_layer(cell.op, prepared.wt, prepared.folded, prepared.rt, prepared.rbh,
                                            direction, *prepared.native_acts, prepared.clip, prepared.flags,
                                            seq, batch, p is not None, loop=prepared.call)
    memo["recurrent layer"] = (key, (w, r, b), layer)
    return layer


def _native_activations(cell: Cell, acts: list[tuple[str, float, float]], dirs: int):
    """The activation codes, alphas and betas in the native loop's form: 3 per direction."""
    codes = np.zeros(3 * dirs, np.int32)
    alphas = np.zeros(3 * dirs, np.float32)
    betas = np.zeros(3 * dirs, np.float32)
    n = cell.n_activations
    for d in range(dirs):
        for k in range(n):
            name, alpha, beta = acts[d * n + k]
            codes[3 * d + k] = native.ACTIVATION_CODES[ACTIVATIONS[name].native]
            alphas[3 * d + k], betas[3 * d + k] = alpha, beta
    return codes, alphas, betas


def gate_activation(acts: list, d: int, n: int, clip: float | None, work: type):
    """Activation ``k`` of direction ``d`` as ``act(k, v)``: the ONNX function with its alpha and
    beta, the gate pre-activations (k < 2; not LSTM's h(c)) clipped first where ``clip`` is set."""
    def act(k: int, v: np.ndarray) -> np.ndarray:
        name, alpha, beta = acts[d * n + k]
        if clip is not None and k < 2:
            v = np.clip(v, -clip, clip)
        return np.asarray(ACTIVATIONS[name].fn(v, work(alpha), work(beta)), dtype=work)

    return act


def lstm_gates(g: np.ndarray, c: np.ndarray, p: np.ndarray | None, act: Any, flags: int):
    """(h(t), c(t)) of LSTM rows from their gate pre-activations ``g`` [rows, 4H] (i, o, f, c:
    x @ W^T + h(t-1) @ R^T + biases), c(t-1) and one direction's peepholes ``p`` [3H] or None."""
    hidden = c.shape[-1]
    gi, go, gf, gc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
    if p is not None:
        gi = gi + p[:hidden] * c
        gf = gf + p[2 * hidden:] * c
    i = act(0, gi)
    f = 1 - i if flags & native_recurrent.INPUT_FORGET else act(0, gf)
    c_new = f * c + i * act(1, gc)
    if p is not None:
        go = go + p[hidden:2 * hidden] * c_new
    return act(0, go) * act(2, c_new), c_new


def _numpy_loop(cell, xp, rt, rbh, p, h0, c0, lens, direction, acts, clip, flags):
    """The time loop in numpy, all batch rows at once: what the native loop computes."""
    dirs, seq, batch, gh = xp.shape
    hidden = rt.shape[1]
    work = xp.dtype.type
    y = np.zeros((seq, dirs, batch, hidden), work)
    yh = np.empty((dirs, batch, hidden), work)
    yc = np.empty((dirs, batch, hidden), work) if cell.op == "LSTM" else None
    n = cell.n_activations

    for d in range(dirs):
        act = gate_activation(acts, d, n, clip, work)
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        h = np.zeros((batch, hidden), work) if h0 is None else np.array(h0[d], dtype=work)
        c = np.zeros((batch, hidden), work) if c0 is None else np.array(c0[d], dtype=work)
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            g = xp[d, t].copy()
            if cell.op == "LSTM":
                g += h @ rt[d]
                h_new, c_new = lstm_gates(g, c, None if p is None else p[d], act, flags)
            elif cell.op == "GRU":
                zr = act(0, g[:, :2 * hidden] + h @ rt[d][:, :2 * hidden])
                z, rr = zr[:, :hidden], zr[:, hidden:]
                rh = rt[d][:, 2 * hidden:]
                if flags & native_recurrent.LINEAR_BEFORE_RESET:
                    hh = g[:, 2 * hidden:] + rr * (h @ rh + rbh[d])
                else:
                    hh = g[:, 2 * hidden:] + (rr * h) @ rh + rbh[d]
                h_new = (1 - z) * act(1, hh) + z * h
                c_new = c
            else:
                h_new = act(0, g + h @ rt[d])
                c_new = c
            if lens is not None:
                live = (t < lens)[:, None]
                h_new = np.where(live, h_new, h)
                c_new = np.where(live, c_new, c)
                y[t, d] = np.where(live, h_new, 0)
            else:
                y[t, d] = h_new
            h, c = h_new, c_new
        if lens is not None:  # a row of length 0 ends in zeros, not its initial state (onnxruntime)
            h = np.where((lens > 0)[:, None], h, 0)
            c = np.where((lens > 0)[:, None], c, 0)
        yh[d] = h
        if yc is not None:
            yc[d] = c
    return y, yh, yc


@kernel("LSTM")
def lstm(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """LSTM: input projection as one GEMM, the time loop native (numpy where it cannot be)."""
    return run_recurrent(CELLS["LSTM"], inputs, attrs)


@kernel("GRU")
def gru(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """GRU: input projection as one GEMM, the time loop native (numpy where it cannot be)."""
    return run_recurrent(CELLS["GRU"], inputs, attrs)


@kernel("RNN")
def rnn(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """RNN: input projection as one GEMM, the time loop native (numpy where it cannot be)."""
    return run_recurrent(CELLS["RNN"], inputs, attrs)


# ---------------------------------------------------------------------------------------------
# Shape rules


def _check_dims(what: str, shape: Shape, expected: tuple) -> None:
    """``shape`` has ``expected``'s rank and its dims where both are known."""
    if shape is None:
        return
    if len(shape) != len(expected):
        raise ShapeDerivationError(f"{what} has rank {len(shape)}, not {len(expected)}")
    for k, (have, want) in enumerate(zip(shape, expected)):
        if is_int(have) and is_int(want) and have != want:
            raise ShapeDerivationError(f"{what} has shape {list(shape)}: dim {k} should be {want}")


@shape_fn(["LSTM", "GRU", "RNN"])
def recurrent_shape(args: ShapeArgs) -> list[Shape]:
    """Y [seq, dirs, batch, hidden] and Y_h (Y_c) [dirs, batch, hidden]; ``layout`` 1: batch first,
    Y [batch, seq, dirs, hidden], the states [batch, dirs, hidden].  Checks every weight and state
    against the others, and the attributes the kernel reads, so a file's mistake is found at load."""
    cell = CELLS[args.op or "LSTM"]
    _, dirs = _direction(cell, args.attrs)
    resolve_activations(cell, args.attrs, dirs)
    clip = args.attrs.get("clip")
    if clip is not None and not float(clip) >= 0:
        raise ShapeDerivationError(f"{cell.op} clip {clip} is not a non-negative number")
    x, w, r = args.shape(0), args.shape(1), args.shape(2)
    for name, s in (("X", x), ("W", w), ("R", r)):
        if s is not None and len(s) != 3:
            raise ShapeDerivationError(f"{name} has rank {len(s)}, not 3")
    hidden = args.attrs.get("hidden_size")
    if hidden is not None:
        hidden = int(hidden)
        if hidden < 1:
            raise ShapeDerivationError(f"{cell.op} hidden_size {hidden} is not positive")
    if r is not None:
        hidden = same_dim(hidden, r[2], "hidden_size against R's last dim")
    if hidden is None and w is not None and fixed(w[1]) is not None:
        hidden = fixed(w[1]) // cell.gates
    gh = hidden * cell.gates if is_int(hidden) else None
    batch_first = int(args.attrs.get("layout", 0)) == 1
    seq, batch, size = (None, None, None) if x is None else ((x[1], x[0], x[2]) if batch_first else x)
    _check_dims("W", w, (dirs, gh, size))
    _check_dims("R", r, (dirs, gh, hidden))
    if args.has(3):
        _check_dims("B", args.shape(3), (dirs, None if gh is None else 2 * gh))
    if args.has(4):
        _check_dims("sequence_lens", args.shape(4), (batch,))
    state = (batch, dirs, hidden) if batch_first else (dirs, batch, hidden)
    for k, name in ((5, "initial_h"), (6, "initial_c")):
        if args.has(k) and (k == 5 or cell.op == "LSTM"):
            _check_dims(name, args.shape(k), state)
    if cell.op == "LSTM" and args.has(7):
        _check_dims("P", args.shape(7), (dirs, None if not is_int(hidden) else 3 * hidden))
    y = (batch, seq, dirs, hidden) if batch_first else (seq, dirs, batch, hidden)
    return [y, state, state] if cell.op == "LSTM" else [y, state]
