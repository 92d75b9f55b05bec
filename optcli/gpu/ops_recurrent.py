"""GPU kernels for the recurrent layers LSTM, GRU and RNN (``kernels/gpu/recurrent.cl``), with the
host's semantics (``optcli.ops.recurrent``, onnxruntime's): directions forward, reverse and
bidirectional, layout 0 and 1, sequence_lens (constant or data), initial states (constant or
data), LSTM peepholes and input_forget, GRU linear_before_reset 0 and 1, clip, and the activations
that have a fused code (Sigmoid, Tanh, Relu, LeakyRelu, HardSigmoid, with alpha / beta).  The host
runs what does not fit, and says why.  W, R, B and P are re-laid for the kernels once at load where
they are constants, else on the device by a ``recurrent_weights`` launch before each run.  A
sequence_lens given as data is not checked on the device (where the host refuses a length outside
0..seq, the kernel runs a longer one for the whole sequence and a negative one as 0).

Launches: the input projection of every step and direction (one GEMM-like launch), the initial
states, then the recurrence, both directions in the same launch.  Up to ``WHOLE_SEQUENCE_HIDDEN``
hidden units it is one ``recurrent_steps`` launch for the whole sequence: a work-group per batch
row and direction loops over the steps with a barrier between them.  A step of a speech model is
a few hundred multiply-adds per unit, and a launch per step cost more than its work: on an H100
the corpus's LSTM took 4.5 ms of kernels for a layer stack the host runs in 0.55 ms.  Wider
layers give one work-group too much work per step, so they take one launch per step, spread over
the whole GPU (GRU with linear_before_reset 0: two, as the h gate needs r * h(t-1) whole).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.activation_codes import ACTIVATION_CODES
from optcli.gpu.layout import pack
from optcli.gpu.ops_elementwise import data_check
from optcli.gpu.ops_tensor import source
from optcli.gpu.registry import Launch, gpu_kernel, input_of
from optcli.ir import Graph, Node
from optcli.ops.recurrent import CELLS, Cell, resolve_activations
from optcli.ops.shape_functions import ShapeDerivationError

# The recurrent activations the kernel computes (ONNX name, lower case, -> fused-epilogue name):
# recurrent_act in recurrent.cl switches on their ACTIVATION_CODES.
GPU_ACTIVATIONS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "leakyrelu": "leaky_relu",
                   "hardsigmoid": "hard_sigmoid"}
CELL_CODES = {"LSTM": 0, "GRU": 1, "RNN": 2}

# The bits of the kernels' ``flags`` argument (recurrent.cl's head comment).
REVERSE, LENS, PEEPHOLES, INPUT_FORGET, LINEAR_BEFORE_RESET, BATCH_FIRST = (1 << k for k in range(6))
WRITE_Y, WRITE_YH, WRITE_YC, INITIAL_H, INITIAL_C, BIAS = (1 << k for k in range(6, 12))

_SOURCE = "recurrent.cl"

# The widest layer whose whole sequence runs in one launch, one work-group per (batch row,
# direction), and that work-group's size (work items SEQUENCE_GROUP apart share the hidden units).
# Measured on an H100 (benchmarks/gpu_recurrent_sweep.py, 100 steps, docs/benchmarks-gpu.md): one
# launch wins up to 256 units (LSTM 64: 0.72 against 1.51 ms; 256: 3.98 against 4.25 ms); from
# 512 a launch per step does (LSTM 512: 7.8 against 14.3 ms; 1024: 14.6 against 55 ms).
WHOLE_SEQUENCE_HIDDEN = 256
SEQUENCE_GROUP = 256
RESET, UPDATE = 1, 2  # recurrent_steps' phases


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _directions(node: Node) -> tuple[str, int]:
    direction = _text(node.attrs.get("direction", "forward"))
    return direction, 2 if direction == "bidirectional" else 1


def _check(cell: Cell, node: Node, graph: Graph) -> str | None:
    op = node.op_type
    direction, dirs = _directions(node)
    if direction not in ("forward", "reverse", "bidirectional"):
        return f"{op} direction '{direction}'"
    try:
        acts = resolve_activations(cell, node.attrs, dirs)
    except ShapeDerivationError as exc:
        return str(exc)
    missing = sorted({name for name, _, _ in acts if name not in GPU_ACTIVATIONS})
    if missing:
        return (f"{op} activation {', '.join(missing)} has no GPU code (the GPU kernel runs Sigmoid, Tanh, Relu, "
                f"LeakyRelu and HardSigmoid; the host runs the others)")
    states = (5, 6) if cell.op == "LSTM" else (5,)
    data = [input_of(node, k) for k in (0, *(i for i, _ in _weight_inputs(cell)), *states)]
    reason = data_check(node, graph, [n for n in data if n])
    return reason or _lens_check(node, graph)


def _lens_check(node: Node, graph: Graph) -> str | None:
    """sequence_lens: int32 of static shape; a constant one within 0..seq (the host reports the rest)."""
    lens = input_of(node, 4)
    if not lens:
        return None
    x_shape = graph.shape_of(node.inputs[0])
    seq = x_shape[1] if int(node.attrs.get("layout", 0)) == 1 else x_shape[0]
    if seq > 2048:  # lengths travel in the storage float: exact up to 2048 in half
        return f"{node.op_type} sequence_lens with {seq} steps (the GPU kernel takes at most 2048)"
    value = graph.const(lens)
    if value is not None:
        if value.size and (value.min() < 0 or value.max() > seq):
            return f"{node.op_type} sequence_lens holds values outside 0..{seq}"
        return None
    shape, dtype = graph.shape_of(lens), graph.dtype_of(lens)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return f"'{lens}' has a dynamic shape (pin it with --input_shapes)"
    if dtype != "int32":
        return f"'{lens}' is {dtype} (sequence_lens is int32)"
    return None


def _check_lstm(node: Node, graph: Graph) -> str | None:
    return _check(CELLS["LSTM"], node, graph)


def _check_gru(node: Node, graph: Graph) -> str | None:
    return _check(CELLS["GRU"], node, graph)


def _check_rnn(node: Node, graph: Graph) -> str | None:
    return _check(CELLS["RNN"], node, graph)


def _weight_inputs(cell: Cell) -> tuple[tuple[int, str], ...]:
    return ((1, "W"), (2, "R"), (3, "B"), *(((7, "P"),) if cell.op == "LSTM" else ()))


def _activation_table(cell: Cell, node, dirs: int) -> np.ndarray:
    """[dirs, 3, 3]: (code, alpha, beta) of each direction's activations (unused ones zero)."""
    acts = np.zeros((dirs, 3, 3), np.float32)
    resolved = resolve_activations(cell, node.attrs, dirs)
    for d in range(dirs):
        for k in range(cell.n_activations):
            name, alpha, beta = resolved[d * cell.n_activations + k]
            acts[d, k] = (ACTIVATION_CODES[GPU_ACTIVATIONS[name]], alpha, beta)
    return acts


def _host_weights(cell: Cell, ctx, node, dirs: int, inp: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """(projection weight [dirs, input + 1, G*H padded to float4s], step weight) from constant W,
    R, B and P, as recurrent.cl's head lays them out (``recurrent_weights`` makes the same from data)."""
    gh = cell.gates * hidden
    w = np.asarray(ctx.const(node.inputs[1]), np.float32).reshape(dirs, gh, inp)
    r = np.asarray(ctx.const(node.inputs[2]), np.float32).reshape(dirs, gh, hidden)
    b = ctx.const(input_of(node, 3))
    b = np.zeros((dirs, 2 * gh), np.float32) if b is None else np.asarray(b, np.float32).reshape(dirs, 2 * gh)
    wb, rb = b[:, :gh], b[:, gh:]
    folded = wb + rb
    rbh = np.zeros((dirs, hidden), np.float32)
    if cell.op == "GRU":  # the h gate's Rb is added inside (or under) the reset
        folded[:, 2 * hidden:] = wb[:, 2 * hidden:]
        rbh = rb[:, 2 * hidden:]
    projection = np.zeros((dirs, inp + 1, (gh + 3) // 4 * 4), np.float32)
    projection[:, :inp, :gh] = w.transpose(0, 2, 1)
    projection[:, inp, :gh] = folded
    p = ctx.const(input_of(node, 7)) if cell.op == "LSTM" else None
    p = np.zeros((dirs, 3 * hidden), np.float32) if p is None else np.asarray(p, np.float32).reshape(dirs, 3 * hidden)
    rt = r.transpose(0, 2, 1)  # R^T: a step's work items read it side by side
    step = np.concatenate([rt.ravel(), p.ravel(), rbh.ravel(), _activation_table(cell, node, dirs).ravel()])
    return projection, step


def _weights(cell: Cell, ctx, node, dirs: int, inp: int, hidden: int, none) -> tuple[list[Launch], Any, Any]:
    """(launches that make them, projection weight, step weight): re-laid on the host once where W,
    R, B and P are constants, else made on the device by ``recurrent_weights`` before each run."""
    name = node.name
    if all(ctx.const(input_of(node, i)) is not None for i, _ in _weight_inputs(cell) if input_of(node, i)):
        projection, step = _host_weights(cell, ctx, node, dirs, inp, hidden)
        return [], ctx.weight(f"{name}/projection", projection), ctx.weight(f"{name}/step", step)
    gh = cell.gates * hidden
    proj_n = dirs * (inp + 1) * ((gh + 3) // 4 * 4)
    step_n = dirs * (gh * hidden + 4 * hidden + 9)
    projection, step = ctx.temp(f"{name}/projection", proj_n), ctx.temp(f"{name}/step", step_n)
    acts = ctx.weight(f"{name}/activations", _activation_table(cell, node, dirs))
    given = {i: source(ctx, node, i) if input_of(node, i) else none for i, _ in _weight_inputs(cell)}
    flags = (PEEPHOLES if input_of(node, 7) and cell.op == "LSTM" else 0) | (BIAS if input_of(node, 3) else 0)
    launch = Launch(_SOURCE, "recurrent_weights", [given[1], given[2], given[3], given.get(7, none), acts, projection,
                                                   step, CELL_CODES[cell.op], inp, hidden, dirs, flags],
                    (proj_n + step_n,))
    return [launch], projection, step


def _flags(cell: Cell, node) -> int:
    """The ``flags`` every launch of the layer shares (recurrent.cl's head)."""
    attrs = node.attrs
    lstm = cell.op == "LSTM"
    chosen = {REVERSE: _directions(node)[0] == "reverse", LENS: bool(input_of(node, 4)),
              PEEPHOLES: lstm and bool(input_of(node, 7)), INPUT_FORGET: lstm and int(attrs.get("input_forget", 0)),
              LINEAR_BEFORE_RESET: cell.op == "GRU" and int(attrs.get("linear_before_reset", 0)),
              BATCH_FIRST: int(attrs.get("layout", 0)) == 1, WRITE_Y: bool(node.outputs and node.outputs[0])}
    return sum(bit for bit, on in chosen.items() if on)


def _launches(cell: Cell, ctx, node) -> list[Launch]:
    attrs = node.attrs
    dirs = _directions(node)[1]
    batch_first = int(attrs.get("layout", 0)) == 1
    shape = ctx.shape(node.inputs[0])
    seq, batch, inp = (shape[1], shape[0], shape[2]) if batch_first else shape
    hidden = ctx.shape(node.inputs[2])[-1]
    gh = cell.gates * hidden
    clip = float(attrs["clip"]) if attrs.get("clip") is not None else -1.0
    lstm, gru = cell.op == "LSTM", cell.op == "GRU"
    name = node.name

    def wanted(k: int) -> bool:
        return k < len(node.outputs) and bool(node.outputs[k])

    def output(k: int):
        return ctx.tensor(node.outputs[k]) if wanted(k) else ctx.temp(f"{name}/out{k}_unused", 4)

    def given(k: int) -> bool:
        return bool(input_of(node, k))

    none = ctx.weight(f"{name}/none", np.zeros(4, np.float32))  # stands in for an absent input
    launches, wproj, wts = _weights(cell, ctx, node, dirs, inp, hidden, none)
    lens = input_of(node, 4)
    lens_ref = none if not lens else (ctx.tensor(lens) if ctx.const(lens) is None else ctx.weight(
        f"{name}/lens", pack(np.asarray(ctx.const(lens), np.float32))))
    flags = _flags(cell, node)
    last = (WRITE_YH if wanted(1) else 0) | (WRITE_YC if lstm and wanted(2) else 0)

    state = dirs * batch * hidden
    hs = ctx.temp(f"{name}/h", 2 * state)  # h(t) at (t % 2) * state
    cs = ctx.temp(f"{name}/c", state) if lstm else ctx.temp(f"{name}/c_unused", 4)
    xp = ctx.temp(f"{name}/xp", dirs * seq * batch * gh)
    y, yh, yc = output(0), output(1), output(2)
    init_flags = flags | (INITIAL_H if given(5) else 0) | (INITIAL_C if lstm and given(6) else 0)
    launches += [
        Launch(_SOURCE, "recurrent_project", [source(ctx, node, 0), wproj, xp, seq, batch, inp, gh, dirs, flags],
               ((gh + 3) // 4, batch, (seq + 3) // 4 * dirs)),
        Launch(_SOURCE, "recurrent_init", [source(ctx, node, 5) if given(5) else none,
                                           source(ctx, node, 6) if lstm and given(6) else none,
                                           hs, cs, CELL_CODES[cell.op], batch, hidden, dirs, init_flags],
               (hidden, batch, dirs)),
    ]
    reset_first = gru and not flags & LINEAR_BEFORE_RESET
    rh = ctx.temp(f"{name}/rh", state) if reset_first else none
    step_flags = flags | last

    def steps(t0: int, t1: int, phases: int, grid: tuple[int, ...], local: tuple[int, ...] | None) -> Launch:
        return Launch(_SOURCE, "recurrent_steps", [xp, wts, lens_ref, hs, cs, rh, y, yh, yc, CELL_CODES[cell.op],
                                                   t0, t1, phases, seq, batch, hidden, dirs, step_flags, clip],
                      grid, local_size=local)

    if hidden <= WHOLE_SEQUENCE_HIDDEN and seq > 1:
        group = min(SEQUENCE_GROUP, -(-hidden // 32) * 32)
        launches.append(steps(0, seq, RESET | UPDATE if reset_first else UPDATE, (group, batch, dirs),
                              (group, 1, 1)))
        return launches
    for t in range(seq):
        if reset_first:
            launches.append(steps(t, t + 1, RESET, (hidden, batch, dirs), None))
        launches.append(steps(t, t + 1, UPDATE, (hidden, batch, dirs), None))
    return launches


@gpu_kernel("LSTM", check=_check_lstm, data_inputs=(4,))
def lstm(ctx, node) -> list[Launch]:
    return _launches(CELLS["LSTM"], ctx, node)


@gpu_kernel("GRU", check=_check_gru, data_inputs=(4,))
def gru(ctx, node) -> list[Launch]:
    return _launches(CELLS["GRU"], ctx, node)


@gpu_kernel("RNN", check=_check_rnn, data_inputs=(4,))
def rnn(ctx, node) -> list[Launch]:
    return _launches(CELLS["RNN"], ctx, node)
