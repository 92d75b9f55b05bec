"""Recurrent ops: LSTM's shape rule.

The host runs LSTM through the reference fallback (no numpy kernel here); the GPU has a kernel
(``optcli.gpu.ops_lstm``), whose buffers the runtime sizes from this rule.
"""

from __future__ import annotations

from optcli.ops.shape_functions import Shape, ShapeArgs, ShapeDerivationError, fixed, same_dim, shape_fn


@shape_fn("LSTM")
def lstm_shape(args: ShapeArgs) -> list[Shape]:
    """Y [seq, dirs, batch, hidden] and Y_h, Y_c [dirs, batch, hidden] (``layout`` 1: batch first)."""
    x, w = args.shape(0), args.shape(1)
    for name, s in (("X", x), ("W", w)):
        if s is not None and len(s) != 3:
            raise ShapeDerivationError(f"{name} has rank {len(s)}, not 3")
    dirs = 2 if args.attrs.get("direction", "forward") == "bidirectional" else 1
    hidden = args.attrs.get("hidden_size")
    if hidden is None and w is not None and fixed(w[1]) is not None:
        hidden = fixed(w[1]) // 4
    if w is not None:
        same_dim(w[0], dirs, "W's first dim against the directions")
        if x is not None:
            same_dim(w[2], x[2], "W's input size against X's")
    batch_first = int(args.attrs.get("layout", 0)) == 1
    seq, batch = (None, None) if x is None else ((x[1], x[0]) if batch_first else (x[0], x[1]))
    if batch_first:
        return [(batch, seq, dirs, hidden), (batch, dirs, hidden), (batch, dirs, hidden)]
    return [(seq, dirs, batch, hidden), (dirs, batch, hidden), (dirs, batch, hidden)]
