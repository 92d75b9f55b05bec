"""GPU kernel for a basic LSTM: forward direction, default activations, no peepholes, no
sequence_lens, constant W / R / B; initial_h / initial_c optional (constant or computed).
One launch per time step (``lstm_step``); the state ping-pongs between two scratch buffers and
the last step writes Y_h / Y_c directly."""

from __future__ import annotations

import numpy as np

from optcli.gpu.layout import pack, packed_elements
from optcli.gpu.ops_elementwise import data_check
from optcli.gpu.ops_tensor import source
from optcli.gpu.registry import Launch, gpu_kernel, input_of
from optcli.ir import Graph, Node

_DEFAULT_ACTS = ["sigmoid", "tanh", "tanh"]


def _check(node: Node, graph: Graph) -> str | None:
    attrs = node.attrs
    if attrs.get("direction", "forward") != "forward":
        return f"LSTM direction {attrs.get('direction')} (the GPU kernel runs forward only)"
    if attrs.get("activations") and [a.lower() for a in attrs["activations"]] != _DEFAULT_ACTS:
        return f"LSTM activations {attrs['activations']}"
    for name, default in (("clip", None), ("input_forget", 0), ("layout", 0)):
        if attrs.get(name, default) != default:
            return f"LSTM {name}={attrs[name]}"
    if input_of(node, 4):
        return "LSTM with sequence_lens"
    if input_of(node, 7):
        return "LSTM with peepholes (P)"
    for i, what in ((1, "W"), (2, "R"), (3, "B")):
        if input_of(node, i) and graph.const(node.inputs[i]) is None:
            return f"LSTM {what} must be a constant"
    data = [n for n in (node.inputs[0], input_of(node, 5), input_of(node, 6)) if n]
    return data_check(node, graph, data)


@gpu_kernel("LSTM", check=_check)
def lstm(ctx, node) -> list[Launch]:
    x = node.inputs[0]
    seq, batch, inp = ctx.shape(x)
    hidden = int(node.attrs["hidden_size"])
    w = np.asarray(ctx.const(node.inputs[1]), np.float32).reshape(4 * hidden, inp)
    r = np.asarray(ctx.const(node.inputs[2]), np.float32).reshape(4 * hidden, hidden)
    b = ctx.const(input_of(node, 3))
    bias = np.zeros(4 * hidden, np.float32) if b is None else np.asarray(b, np.float32).reshape(2, 4 * hidden).sum(0)
    state_shape = (1, batch, hidden)
    elements = packed_elements(state_shape)

    def initial(index: int, what: str):
        name = input_of(node, index)
        if not name:
            return ctx.weight(f"{node.name}/{what}0", np.zeros(elements, np.float32))
        value = ctx.const(name)
        return ctx.tensor(name) if value is None else ctx.weight(f"{node.name}/{what}0",
                                                                 pack(np.asarray(value, np.float32)))

    def states(what: str, out_index: int) -> list:
        pingpong = [ctx.temp(f"{node.name}/{what}{k}", elements) for k in ((0, 1) if seq > 1 else (0,))]
        chain = [pingpong[t % 2] for t in range(seq)]
        out = node.outputs[out_index] if out_index < len(node.outputs) else ""
        if out:
            chain[-1] = ctx.tensor(out)
        return [initial(5 if what == "h" else 6, what), *chain]

    hs, cs = states("h", 1), states("c", 2)
    y = node.outputs[0] if node.outputs and node.outputs[0] else ""
    y_ref = ctx.tensor(y) if y else ctx.temp(f"{node.name}/y_unused", 4)
    args = [ctx.weight(f"{node.name}/w", w), ctx.weight(f"{node.name}/r", r), ctx.weight(f"{node.name}/b", bias)]
    grid = (hidden, (batch + 3) // 4 * 4)
    x_ref = source(ctx, node, 0)
    return [Launch("lstm.cl", "lstm_step", [x_ref, *args, hs[t], cs[t], hs[t + 1], cs[t + 1], y_ref, t, batch, inp,
                                            hidden, int(bool(y))], grid) for t in range(seq)]
