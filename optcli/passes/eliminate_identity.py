"""Remove nodes that return their input unchanged.

Exporters leave many of them behind (Identity, inference-time Dropout, Casts to the type the
tensor already has, reshapes to the shape it already has, zero pads, single-input Concats,
full Slices, ``x * 1`` and ``x + 0``).  Each costs a kernel launch and a buffer on a GPU, so
readers of the output are pointed at the input instead.  A graph output keeps its name: the
producer of the input is renamed when that is possible, otherwise the node stays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper

from optcli.ir import Graph, Node
from optcli.passes._helpers.graph_queries import (
    broadcast_keeps_shape,
    consumers,
    drop_values,
    implicit_refs,
    is_unused,
    static_shape,
)

NAME = "eliminate_identity"
DESCRIPTION = "remove Identity, Dropout, no-op Cast/Transpose/Reshape/Pad/Expand/Concat/Slice, x*1, x+0"

SAME_SHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})


def _same_static_shape(graph: Graph, a: str, b: str) -> bool:
    sa, sb = static_shape(graph, a), static_shape(graph, b)
    return sa is not None and sa == sb


def _same_dtype(graph: Graph, a: str, b: str) -> bool:
    da, db = graph.dtype_of(a), graph.dtype_of(b)
    return da is not None and da == db


def _ints(graph: Graph, node: Node, index: int, attr: str) -> list[int] | None:
    """An int-list argument given either as a constant input (new opsets) or an attribute."""
    if node.input(index):
        c = graph.const(node.input(index))
        return None if c is None else [int(v) for v in c.reshape(-1)]
    value = node.attrs.get(attr)
    return None if value is None else [int(v) for v in value]


def _pad_is_noop(graph: Graph, node: Node) -> bool:
    pads = _ints(graph, node, 1, "pads")
    return pads is not None and all(p == 0 for p in pads)


def _slice_is_noop(graph: Graph, node: Node) -> bool:
    # With unit steps, an output as long as the input on every axis can only be [0:dim].
    steps: list[int] | None = []
    if node.input(4):
        c = graph.const(node.input(4))
        steps = None if c is None else [int(v) for v in c.reshape(-1)]
    return steps is not None and all(s == 1 for s in steps) and _same_static_shape(
        graph, node.inputs[0], node.outputs[0]
    )


def _arith_source(graph: Graph, node: Node) -> str | None:
    """For x*1, 1*x, x/1, x+0, 0+x, x-0: the name of x when the constant cannot grow it."""
    neutral = 1.0 if node.op_type in ("Mul", "Div") else 0.0
    commutative = node.op_type in ("Mul", "Add")
    for x_index in (0, 1) if commutative else (0,):
        x, c_name = node.inputs[x_index], node.inputs[1 - x_index]
        c = graph.const(c_name)
        if c is None or graph.is_constant(x) or c.dtype == object or not np.all(c == neutral):
            continue
        keeps = broadcast_keeps_shape(graph.shape_of(x), tuple(c.shape))
        if keeps and _same_dtype(graph, x, node.outputs[0]):
            return x
    return None


def noop_source(graph: Graph, node: Node) -> str | None:
    """The input that ``node`` passes through unchanged, or None when it does real work."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or not node.inputs[0]:
        return None
    op, x, y = node.op_type, node.inputs[0], node.outputs[0]
    if op == "Identity":
        return x
    if op == "Dropout":
        mask_unused = len(node.outputs) < 2 or is_unused(graph, consumers(graph), node.outputs[1])
        training = graph.const(node.input(2)) if node.input(2) else np.array(False)
        if mask_unused and training is not None and not bool(training):
            return x
        return None
    if op == "Cast":
        to = node.attrs.get("to")
        src = graph.dtype_of(x)
        same = to is not None and src is not None and str(helper.tensor_dtype_to_np_dtype(int(to))) == src
        return x if same else None
    if op == "CastLike":
        return x if _same_dtype(graph, x, node.input(1)) else None
    if op == "Transpose":
        perm = node.attrs.get("perm")
        shape = graph.shape_of(x)
        if perm is None:
            return x if shape is not None and len(shape) <= 1 else None
        return x if list(perm) == list(range(len(perm))) else None
    if op == "Expand":
        # Expanding to all-ones of no higher rank is a no-op even when x's dims are unknown.
        c = graph.const(node.input(1))
        shape = graph.shape_of(x)
        if c is not None and shape is not None and c.size <= len(shape) and np.all(c == 1):
            return x
    if op in SAME_SHAPE_OPS:
        return x if _same_static_shape(graph, x, y) else None
    if op == "Pad":
        return x if _pad_is_noop(graph, node) else None
    if op == "Concat":
        return x if len([i for i in node.inputs if i]) == 1 else None
    if op == "Slice":
        return x if _slice_is_noop(graph, node) else None
    if op in ("Mul", "Div", "Add", "Sub") and len(node.inputs) == 2:
        return _arith_source(graph, node)
    return None


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    # Subgraphs read outer values by name, which bypassing cannot rename: leave those alone.
    pinned = implicit_refs(graph)
    for node in list(graph.nodes):
        src = noop_source(graph, node)
        if src is None or src in pinned or node.outputs[0] in pinned:
            continue
        out = node.outputs[0]
        if graph.bypass(node, src):
            # When ``out`` is a graph output, bypass renamed src's producer to produce it.
            drop_values(graph, src if out in graph.output_names() else out)
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
