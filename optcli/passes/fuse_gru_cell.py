"""Fold a GRU cell written out as ops (an attention decoder's Loop body) into one ONNX ``GRU`` step.

Decoders that feed each step's output back (table-structure and OCR attention decoders, exported
by paddle2onnx, torch or onnxscript) cannot use a GRU op over a sequence: their cell is spelled out
inside a ``Loop`` body, and every iteration pays each of its ~12 nodes.  After ``fuse_matmul_add``
the cell reads

    gx = FullyConnected(x, Wx[K, 3H], bx)        gh = FullyConnected(h, Wh[H, 3H], bh)
    x0, x1, x2 = Split(gx)                        h0, h1, h2 = Split(gh)      (last axis, H each)
    r = Sigmoid(xi + hi)    z = Sigmoid(xj + hj)    n = Tanh(xk + r * hk)
    h' = (1 - z) * n + z * h        or        h' = n + z * (h - n)    (paddle's, torch's form)

which is ONNX GRU with ``linear_before_reset = 1`` over one time step: the gates' chunks are found
by what each feeds (any order, each operand order), W, R and B are made from the weights in the
op's z, r, h order, and ``h' = Squeeze(GRU(Unsqueeze(x), ..., Unsqueeze(h)).Y_h)``.  The native
recurrent kernel then runs both products and the gates in one call (a 96-unit cell: ~62 -> ~30 us
an iteration, one core).

Only where every intermediate is read by the cell alone, the weights are float32 constants, the
FullyConnected layers carry no epilogue, and ``1`` is a constant one.  What a body's shapes cannot
rule out (they are known there only where they hold for every iteration), the GRU step refuses at
run time rather than computing something else: an ``x`` or ``h`` of another rank than 2, and an
``h`` of batch 1 against an ``x`` of batch B (or the reverse), which the written-out cell would
broadcast (no exporter seen writes that: the state starts as zeros of the input's batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import opset, scalar_const

NAME = "fuse_gru_cell"
DESCRIPTION = "a GRU cell spelled out as FullyConnected/Split/Sigmoid/Tanh ops -> one ONNX GRU step"


class _Match:
    """The nodes of one cell while it is being matched, and what the replacement needs."""

    def __init__(self, graph: Graph, consumers: dict[str, list[Node]]):
        self.graph, self.consumers = graph, consumers
        self.nodes: list[Node] = []

    def only(self, name: str, op_types: tuple[str, ...]) -> Node | None:
        """The sole reader of ``name`` when it is a plain ONNX node of one of ``op_types``."""
        node = graph_queries.sole_consumer(self.graph, self.consumers, name)
        if node is None or node.op_type not in op_types or node.domain not in ("", "ai.onnx") or node.attrs:
            return None
        return node

    def readers(self, name: str) -> list[Node]:
        """Every reader of ``name`` when all are plain ONNX nodes and it is no graph output; else []."""
        found = self.consumers.get(name, [])
        if name in self.graph.output_names() or any(n.domain not in ("", "ai.onnx") or n.attrs for n in found):
            return []
        return found


def _other(node: Node, name: str) -> str | None:
    """The other input of a two-input node that reads ``name`` once."""
    if len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _dense(graph: Graph, producers: dict[str, Node], name: str) -> tuple[Node, np.ndarray, np.ndarray] | None:
    """The FullyConnected making ``name``: (node, W [K, 3H], b [3H]) for float32 constants, no epilogue."""
    fc = producers.get(name)
    if fc is None or fc.op_type != "FullyConnected" or fc.domain != OPTCLI_DOMAIN or fc.attrs:
        return None
    w = graph.const(fc.input(1))
    b = graph.const(fc.input(2)) if fc.input(2) else np.zeros(w.shape[1] if w is not None and w.ndim == 2 else 0,
                                                                np.float32)
    if w is None or w.dtype != np.float32 or w.ndim != 2 or w.shape[1] % 3 or b is None or b.dtype != np.float32:
        return None
    if b.size != w.shape[1] or graph.is_constant(fc.input(0)):
        return None
    return fc, w, b.reshape(-1)


def _chunks(graph: Graph, split: Node, width: int) -> list[str] | None:
    """The three outputs of a Split of the last axis (1 or -1 of a [batch, 3H]) into equal thirds."""
    if split.op_type != "Split" or split.domain not in ("", "ai.onnx") or len(split.outputs) != 3:
        return None
    if int(split.attrs.get("axis", 0)) not in (1, -1) or not all(split.outputs):
        return None
    sizes = graph.const(split.input(1)) if split.input(1) else split.attrs.get("split")
    if sizes is None:
        if split.attrs.get("num_outputs") not in (None, 3):
            return None
    elif [int(s) for s in np.asarray(sizes).reshape(-1)] != [width // 3] * 3:
        return None
    if any(k not in ("axis", "split", "num_outputs") for k in split.attrs):
        return None
    return list(split.outputs)


def _gates(m: _Match, xs: list[str], hs: list[str]):
    """(r, z, n) as (x chunk, h chunk, gate output) and the nodes, from the chunks' readers."""
    sig: dict[str, tuple[int, int, str]] = {}
    cand = None
    for i, xc in enumerate(xs):
        add = m.only(xc, ("Add",))
        other = _other(add, xc) if add is not None else None
        if other in hs:
            act = m.only(add.outputs[0], ("Sigmoid",))
            if act is None or m.only(other, ("Add",)) is not add:
                return None
            sig[act.outputs[0]] = (i, hs.index(other), act.outputs[0])
            m.nodes += [add, act]
            continue
        if other is None:
            return None
        mul = m.graph.producers().get(other)
        tanh = m.only(add.outputs[0], ("Tanh",))
        if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or mul.attrs or tanh is None \
                or cand is not None or m.only(other, ("Add",)) is not add:
            return None
        cand = (i, mul, tanh)
        m.nodes += [add, mul, tanh]
    if cand is None or len(sig) != 2:
        return None
    i, mul, tanh = cand
    r_out = next((o for o in mul.inputs if o in sig), None)
    h_chunk = _other(mul, r_out) if r_out is not None else None
    if h_chunk not in hs or m.only(r_out, ("Mul",)) is not mul or m.only(h_chunk, ("Mul",)) is not mul:
        return None
    r = sig.pop(r_out)
    z = next(iter(sig.values()))
    n = (i, hs.index(h_chunk), tanh.outputs[0])
    if sorted([r[1], z[1], n[1]]) != [0, 1, 2]:
        return None
    return r, z, n


def _blend(m: _Match, z: str, n: str, h: str) -> tuple[Node, list[Node]] | None:
    """The final ``h'`` node and the blend's nodes: (1 - z) * n + z * h, or n + z * (h - n)."""
    z_readers, n_readers = m.readers(z), m.readers(n)
    if len(z_readers) == 2 and len(n_readers) == 1:  # (1 - z) * n + z * h
        sub = next((r for r in z_readers if r.op_type == "Sub" and r.inputs[1] == z), None)
        zh = next((r for r in z_readers if r.op_type == "Mul" and _other(r, z) == h), None)
        if sub is None or zh is None:
            return None
        one = m.graph.const(sub.inputs[0])
        if one is None or one.ndim > 2 or scalar_const(m.graph, sub.inputs[0]) != 1.0:
            return None  # (a one of rank 3 would broadcast [B, H] up to [1, B, H])
        sub_r = m.only(sub.outputs[0], ("Mul",))
        if sub_r is None or _other(sub_r, sub.outputs[0]) != n or n_readers[0] is not sub_r:
            return None
        final = m.only(sub_r.outputs[0], ("Add",))
        if final is None or _other(final, sub_r.outputs[0]) != zh.outputs[0] or m.only(zh.outputs[0], ("Add",)) \
                is not final:
            return None
        return final, [sub, zh, sub_r, final]
    if len(z_readers) == 1 and len(n_readers) == 2:  # n + z * (h - n)
        diff = next((r for r in n_readers if r.op_type == "Sub" and r.inputs == [h, n]), None)
        final = next((r for r in n_readers if r.op_type == "Add"), None)
        if diff is None or final is None:
            return None
        mul = m.only(diff.outputs[0], ("Mul",))
        if mul is None or _other(mul, diff.outputs[0]) != z or z_readers[0] is not mul:
            return None
        if m.only(mul.outputs[0], ("Add",)) is not final or _other(final, n) != mul.outputs[0]:
            return None
        return final, [diff, mul, final]
    return None


def _try(graph: Graph, consumers: dict[str, list[Node]], producers: dict[str, Node], split_x: Node,
         split_h: Node) -> tuple[list[Node], list[Node]] | None:
    """(nodes to remove, nodes to add) for a cell of these two Splits, or None."""
    dx, dh = _dense(graph, producers, split_x.input(0)), _dense(graph, producers, split_h.input(0))
    if dx is None or dh is None:
        return None
    (fx, wx, bx), (fh, wh, bh) = dx, dh
    hidden = wh.shape[1] // 3
    if wx.shape[1] != 3 * hidden or wh.shape[0] != hidden:
        return None
    m = _Match(graph, consumers)
    sole = graph_queries.sole_consumer
    if sole(graph, consumers, fx.outputs[0]) is not split_x or sole(graph, consumers, fh.outputs[0]) is not split_h:
        return None
    xs, hs = _chunks(graph, split_x, wx.shape[1]), _chunks(graph, split_h, wh.shape[1])
    if xs is None or hs is None:
        return None
    gates = _gates(m, xs, hs)
    if gates is None:
        return None
    r, z, n = gates
    if sorted([r[0], z[0], n[0]]) != [0, 1, 2]:
        return None
    blend = _blend(m, z[2], n[2], fh.input(0))
    if blend is None:
        return None
    final, tail = blend
    names = Names(graph)
    gate = [z, r, n]  # ONNX GRU's order
    cols = lambda j: slice(j * hidden, (j + 1) * hidden)  # noqa: E731
    w = np.concatenate([wx[:, cols(g[0])].T for g in gate])[None]
    rr = np.concatenate([wh[:, cols(g[1])].T for g in gate])[None]
    b = np.concatenate([bx[cols(g[0])] for g in gate] + [bh[cols(g[1])] for g in gate])[None]
    base = final.name or "gru_cell"
    w_name, r_name, b_name = (names.initializer(f"{base}_{k}", np.ascontiguousarray(v, np.float32))
                              for k, v in (("W", w), ("R", rr), ("B", b)))
    xu, hu, yh = names.fresh(f"{base}_x"), names.fresh(f"{base}_h"), names.fresh(f"{base}_Y_h")
    if opset(graph) >= 13:
        zero = names.initializer(f"{base}_axis0", np.array([0], np.int64))
        unsq = lambda a, o: Node("Unsqueeze", [a, zero], [o], name=names.fresh(f"{base}_unsqueeze"))  # noqa: E731
        squeeze = Node("Squeeze", [yh, zero], [final.outputs[0]], name=names.fresh(f"{base}_squeeze"))
    else:
        unsq = lambda a, o: Node("Unsqueeze", [a], [o], {"axes": [0]}, name=names.fresh(f"{base}_unsqueeze"))  # noqa: E731
        squeeze = Node("Squeeze", [yh], [final.outputs[0]], {"axes": [0]}, name=names.fresh(f"{base}_squeeze"))
    gru = Node("GRU", [xu, w_name, r_name, b_name, "", hu], ["", yh],
               {"hidden_size": hidden, "linear_before_reset": 1}, name=names.fresh(f"{base}_gru"))
    added = [unsq(fx.input(0), xu), unsq(fh.input(0), hu), gru, squeeze]
    return [fx, fh, split_x, split_h, *m.nodes, *tail], added


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"gru_cells": 0}
    splits = [n for n in graph.nodes if n.op_type == "Split" and n.domain in ("", "ai.onnx")]
    if len(splits) < 2:
        return counts
    done: set[int] = set()
    for sx in splits:
        for sh in splits:
            if sx is sh or id(sx) in done or id(sh) in done:
                continue
            found = _try(graph, graph_queries.consumers(graph), graph.producers(), sx, sh)
            if found is None:
                continue
            removed, added = found
            ids = {id(n) for n in removed}
            done |= ids
            graph.nodes = [n for n in graph.nodes if id(n) not in ids] + added
            graph_queries.drop_values(graph, *(o for n in removed for o in n.outputs if o not in
                                               {a.outputs[0] for a in added}))
            counts["gru_cells"] += 1
    if counts["gru_cells"]:
        graph.toposort()
    return counts
