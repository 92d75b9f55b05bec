"""Fold the constant affine steps before a Conv into its weights and bias.

PaddlePaddle's PP-LCNetV3 (the backbone of PP-OCRv4's mobile detector and recogniser) ends every
stride-1 layer with ``HardSwish`` then a learnable affine ``x * a + b``: no pass can fold that
into the conv before it (HardSwish is in the way), but the next conv reads it.  A chain of
``Mul``/``Div``/``Add``/``Sub`` by constants that are scalars or vary only along the channels is
``s * x + t`` per input channel, and a conv is linear in its input:

* the scale goes into the filters (``W[o, i] * s[i]``) whatever the conv pads, since padding
  with zeros commutes with scaling;
* the shift becomes bias (``b[o] + sum over i, k of W[o, i, k] * t[i]``) only where the conv pads
  nothing: at a padded border the window would see ``t`` in place of the zeros.  Before a
  padded conv a shifted chain becomes one ``Add(x, t / s)`` (where ``s`` has no zero) and the
  scale still goes into the filters.

Only where each value of the chain is read by the next node alone (and is no graph output), no
step broadcasts its data larger, and the conv's weight (and bias) are float constants.  The
folded weights and biases are new initializers, so a weight shared with another conv is left
alone.  Runs after ``fuse_conv_scale``, which folds chains into the conv before them where it can
(exactly, whatever the padding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.affine import affine_step
from optcli.passes._helpers.graph_queries import (
    become,
    broadcast_keeps_shape,
    drop_values,
    is_float,
    sole_consumer,
    sync_proto,
)

NAME = "fold_affine_into_next_conv"
DESCRIPTION = ("fold Mul/Div/Add/Sub by scalar or per-channel constants before a Conv into its weights "
               "(and its bias where it pads nothing)")


def _pads_nothing(conv: Node) -> bool:
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    return auto_pad == "VALID" or (auto_pad == "NOTSET" and not any(conv.attrs.get("pads", [])))


def _chain(graph: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]], conv: Node,
           in_channels: int, rank: int) -> tuple[str, list[Node], np.ndarray, np.ndarray] | None:
    """(the value the chain starts from, its nodes in order, scale, shift), or None."""
    scale, shift = np.ones(in_channels), np.zeros(in_channels)
    nodes: list[Node] = []
    value = conv.input(0)
    while (node := producers.get(value)) is not None and sole_consumer(graph, consumers, value) is not None:
        data = [i for i in node.inputs if graph.const(i) is None]
        step = affine_step(graph, node, data[0], rank, 1, in_channels) if len(data) == 1 else None
        const = [graph.const(i) for i in node.inputs if i != data[0]]
        if step is None or not broadcast_keeps_shape(graph.shape_of(data[0]), const[0].shape):
            break
        # This step runs before those already taken: composite(x) = scale * (s * x + t) + shift.
        scale, shift = scale * step[0], scale * step[1] + shift
        nodes.insert(0, node)
        value = data[0]
    return (value, nodes, scale, shift) if nodes else None


def _grouped(vector: np.ndarray, w: np.ndarray, group: int) -> np.ndarray:
    """A per-input-channel vector laid out like the weight ``[C_out, C_in/group, 1...]``."""
    out_per_group, in_per_group = w.shape[0] // group, w.shape[1]
    index = (np.arange(w.shape[0]) // out_per_group)[:, None] * in_per_group + np.arange(in_per_group)
    return vector[index].reshape(index.shape + (1,) * (w.ndim - 2))


def _fold(graph: Graph, names: Names, conv: Node, chain: tuple, w: np.ndarray, b: np.ndarray | None) -> list[Node]:
    """Rewrite ``conv`` (and maybe the chain's last node); returns the chain nodes that go."""
    start, nodes, scale, shift = chain
    exact = _pads_nothing(conv) or not np.any(shift)
    if not exact and (not np.all(scale) or (np.all(scale == 1) and len(nodes) == 1)):
        return []  # a zero scale cannot carry the shift before it; a lone shift gains nothing
    group = int(conv.attrs.get("group", 1))
    s = _grouped(scale, w, group)
    w64 = w.astype(np.float64)
    scaled = w64 * s
    top = float(np.finfo(w.dtype).max)
    if not np.all(np.abs(scaled) < top):
        return []
    bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64).reshape(-1)
    if exact and np.any(shift):
        bias = bias + (w64 * _grouped(shift, w, group)).reshape(w.shape[0], -1).sum(axis=1)
        if not np.all(np.abs(bias) < top):
            return []
    base = conv.name or conv.op_type
    weight = conv.inputs[1] if np.all(scale == 1) else names.initializer(f"{base}_in_scaled_weight",
                                                                          scaled.astype(w.dtype))
    conv.inputs = [start, weight, names.initializer(f"{base}_in_shifted_bias", bias.astype(w.dtype))]
    if not exact:
        # The shift stays, as one Add before the conv: s * x + t = s * (x + t / s).
        last = nodes[-1]
        per_channel = shift / scale
        moved = per_channel.reshape((-1,) + (1,) * (w.ndim - 2)) if np.ptp(per_channel) else per_channel[:1]
        become(last, "Add", [start, names.initializer(f"{base}_in_shift", moved.astype(w.dtype))])
        conv.inputs[0] = last.outputs[0]
        nodes = nodes[:-1]
    sync_proto(conv)
    drop_values(graph, *(n.outputs[0] for n in nodes))
    return nodes


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    # A fold removes only its own chain, read by its own conv alone: one snapshot serves all.
    consumers = graph_queries.consumers(graph)
    producers = graph.producers()
    names = Names(graph)
    gone: set[int] = set()
    for conv in list(graph.nodes):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or conv.inputs.count(conv.input(0)) != 1:
            continue
        w = graph.const(conv.input(1))
        b = graph.const(conv.input(2)) if conv.input(2) else None
        if not is_float(w) or w.ndim < 3 or (conv.input(2) and (b is None or b.size != w.shape[0])):
            continue
        in_channels = w.shape[1] * int(conv.attrs.get("group", 1))
        chain = _chain(graph, producers, consumers, conv, in_channels, w.ndim)
        if chain is not None and not any(id(n) in gone for n in chain[1]):
            gone.update(id(n) for n in _fold(graph, names, conv, chain, w, b))
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return {"folded": len(gone)}
