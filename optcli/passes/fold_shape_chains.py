"""Collapse chains of layout-only ops into one.

* Consecutive ``Transpose`` nodes compose into one; when the composition is the identity both go.
* A ``Transpose`` that only moves size-1 axes (the data order is unchanged) becomes a
  ``Reshape``, which is a free view on every target instead of a copy.
* Chains of ``Reshape``/``Flatten``/``Squeeze``/``Unsqueeze`` (each intermediate read only by the
  next) become a single ``Reshape`` to the final shape.

The new Reshape's shape is the final static shape.  With dynamic dims it uses ``0`` (copy the
input's dim at that index) only where the output dim is provably the input dim at the same
index, and ``-1`` for at most one other unknown dim (determined by the element count, which
reshapes preserve); otherwise the chain is left alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Dim, Graph, Node
from optcli.passes._helpers.graph_queries import (
    consumers,
    drop_values,
    remove_nodes,
    replace_node,
    sole_consumer,
    sync_proto,
)

NAME = "fold_shape_chains"
DESCRIPTION = "compose Transposes; size-1-only Transpose -> Reshape; reshape-like chains -> one Reshape"

RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def reshape_spec(out_shape: tuple[Dim, ...] | None, same: list[bool]) -> list[int] | None:
    """Reshape's shape argument producing ``out_shape``; ``same[i]``: out dim i is the input's dim i."""
    if out_shape is None:
        return None
    spec: list[int] = []
    for i, d in enumerate(out_shape):
        if isinstance(d, int):
            if d == 0:
                return None  # a 0 in the shape argument would mean "copy", not "empty"
            spec.append(d)
        elif same[i]:
            spec.append(0)
        else:
            spec.append(-1)
    return spec if spec.count(-1) <= 1 else None


def _perm(node: Node, rank: int | None) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    return None if rank is None else list(reversed(range(rank)))


def _rank(graph: Graph, name: str) -> int | None:
    shape = graph.shape_of(name)
    return None if shape is None else len(shape)


def _reshape_node(graph: Graph, like: Node, x: str, spec: list[int]) -> Node:
    base = like.name or "reshape"
    shape = graph.add_initializer(f"{base}_shape", np.array(spec, dtype=np.int64))
    return Node("Reshape", [x, shape], [like.outputs[0]], name=like.name)


def _merge_transposes(graph: Graph, t2: Node, t1: Node) -> bool:
    rank = _rank(graph, t1.inputs[0])
    p1, p2 = _perm(t1, rank), _perm(t2, rank)
    if p1 is None or p2 is None or len(p1) != len(p2):
        return False
    x = t1.inputs[0]
    remove_nodes(graph, t1)
    drop_values(graph, t1.outputs[0])
    t2.inputs[0] = x
    t2.attrs["perm"] = [p1[j] for j in p2]
    sync_proto(t2)
    if t2.attrs["perm"] == list(range(len(p1))):
        out = t2.outputs[0]
        if graph.bypass(t2, x):
            drop_values(graph, x if out in graph.output_names() else out)
    return True


def _transpose_to_reshape(graph: Graph, t: Node) -> bool:
    shape = graph.shape_of(t.inputs[0])
    perm = _perm(t, None if shape is None else len(shape))
    if shape is None or perm is None or len(perm) != len(shape) or perm == list(range(len(perm))):
        return False
    moved = [p for p in perm if shape[p] != 1]
    if moved != sorted(moved):
        return False
    out_shape = tuple(shape[p] for p in perm)
    same = [perm[i] == i or (isinstance(d, str) and d == shape[i]) for i, d in enumerate(out_shape)]
    spec = reshape_spec(out_shape, same)
    if spec is None:
        return False
    replace_node(graph, t, _reshape_node(graph, t, t.inputs[0], spec))
    return True


def _merge_reshapes(graph: Graph, r2: Node, r1: Node) -> bool:
    x = r1.inputs[0]
    in_shape, out_shape = graph.shape_of(x), graph.shape_of(r2.outputs[0])
    if out_shape is None:
        return False
    same = [
        in_shape is not None and i < len(in_shape) and isinstance(d, str) and d == in_shape[i]
        for i, d in enumerate(out_shape)
    ]
    spec = reshape_spec(out_shape, same)
    if spec is None:
        return False
    remove_nodes(graph, r1)
    drop_values(graph, r1.outputs[0])
    replace_node(graph, r2, _reshape_node(graph, r2, x, spec))
    return True


def _rewrite(
    graph: Graph, node: Node, producers: dict[str, Node], consumers: dict[str, list[Node]]
) -> str | None:
    if node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    prev = producers.get(node.inputs[0])
    chained = (
        prev is not None
        and prev.domain in ("", "ai.onnx")
        and len(prev.outputs) == 1
        and sole_consumer(graph, consumers, prev.outputs[0]) is node
    )
    if node.op_type == "Transpose":
        if chained and prev.op_type == "Transpose" and _merge_transposes(graph, node, prev):
            return "transposes"
        return "transpose_to_reshape" if _transpose_to_reshape(graph, node) else None
    if node.op_type in RESHAPES and chained and prev.op_type in RESHAPES:
        return "reshapes" if _merge_reshapes(graph, node, prev) else None
    return None


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"transposes": 0, "transpose_to_reshape": 0, "reshapes": 0}
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node.op_type not in RESHAPES and node.op_type != "Transpose":
                continue
            if not any(n is node for n in graph.nodes):
                continue  # merged away earlier in this sweep
            kind = _rewrite(graph, node, graph.producers(), consumers(graph))
            if kind:
                counts[kind] += 1
                changed = True
    return counts
