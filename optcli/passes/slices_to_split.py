"""Slices that cut one tensor into consecutive pieces along one axis become one Split.

Exporters write ``torch.chunk`` / ``x[:, :n], x[:, n:]`` as a Slice per piece (a mel front end's
real and imaginary halves, a GRU's gates, a detector's box and score channels); each Slice reads
the whole input again and is a step and a launch of its own. Where the pieces tile the axis
exactly (sorted, no gap, no overlap, unit steps, constant bounds, the axis' length known), one
Split writes them all in one pass, as onnxruntime's optimizer also does. The Slices' outputs keep
their names, so readers (subgraphs included) need no change.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Graph, Node

NAME = "slices_to_split"
DESCRIPTION = "Slices tiling one axis of the same tensor -> one Split"


def _piece(graph: Graph, node: Node) -> tuple[int, int, int] | None:
    """(axis, start, end) of a Slice with constant bounds, one axis and unit step, normalised to
    the input's rank and the axis' static length; None when it is not such a Slice."""
    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    shape = graph.shape_of(node.input(0))
    if shape is None:
        return None
    if node.input(1):  # opset 10+: bounds are inputs
        starts, ends = graph.const(node.input(1)), graph.const(node.input(2))
        axes = graph.const(node.input(3)) if node.input(3) else np.arange(len(shape))
        steps = graph.const(node.input(4)) if node.input(4) else None
        if starts is None or ends is None or axes is None or (node.input(4) and steps is None):
            return None
    else:  # opset 1-9: attributes
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes, steps = node.attrs.get("axes", list(range(len(shape)))), None
        if starts is None or ends is None:
            return None
    starts, ends, axes = (np.asarray(v, dtype=np.int64).reshape(-1) for v in (starts, ends, axes))
    if not (len(starts) == len(ends) == len(axes) == 1):
        return None
    if steps is not None and (np.asarray(steps).size != 1 or int(np.asarray(steps).reshape(-1)[0]) != 1):
        return None
    axis = int(axes[0]) + (len(shape) if int(axes[0]) < 0 else 0)
    if not 0 <= axis < len(shape) or not isinstance(shape[axis], int):
        return None
    dim = shape[axis]
    start, end = int(starts[0]), int(ends[0])
    start = min(max(start + dim if start < 0 else start, 0), dim)  # ONNX's clamping, unit step
    end = min(max(end + dim if end < 0 else end, 0), dim)
    if end <= start:
        return None
    return axis, start, end


def _split_node(graph: Graph, data: str, axis: int, pieces: list[tuple[int, int, Node]]) -> Node:
    sizes = np.array([end - start for start, end, _ in pieces], dtype=np.int64)
    outputs = [slice_node.outputs[0] for _, _, slice_node in pieces]
    name = f"{pieces[0][2].name or data}_split"
    if graph.opsets.get("", 1) >= 13:  # the sizes are an input from opset 13 on
        return Node("Split", [data, graph.add_initializer(f"{data}_split_sizes", sizes)], outputs,
                    {"axis": axis}, name=name)
    return Node("Split", [data], outputs, {"axis": axis, "split": [int(s) for s in sizes]}, name=name)


def run(graph: Graph, ctx) -> dict[str, int]:
    groups: dict[tuple[str, int], list[tuple[int, int, Node]]] = {}
    for node in graph.nodes:
        piece = _piece(graph, node)
        if piece is not None:
            axis, start, end = piece
            groups.setdefault((node.input(0), axis), []).append((start, end, node))
    merged = 0
    for (data, axis), pieces in groups.items():
        if len(pieces) < 2:
            continue
        pieces.sort(key=lambda p: p[0])
        dim = graph.shape_of(data)[axis]
        tiles = pieces[0][0] == 0 and pieces[-1][1] == dim and all(
            a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        if not tiles:
            continue
        # The Split takes the place of the first Slice: every reader of a piece came after it.
        first = min(graph.nodes.index(p[2]) for p in pieces)
        graph.nodes[first] = _split_node(graph, data, axis, pieces)
        for _, _, slice_node in pieces:
            if slice_node in graph.nodes:
                graph.nodes.remove(slice_node)
        merged += len(pieces)
    return {"Slice": merged} if merged else {}
