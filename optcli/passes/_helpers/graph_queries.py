"""Small queries the rewrite passes share: who reads a value, is it constant, may we fuse.

Kept here so every pass applies the same safety rules: a value that is a graph output or has
other readers is never rewritten away, and a fused epilogue is only produced when every target
in the context can run it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Node, subgraph_outer_refs

EPILOGUE_ATTRS = ("activation", "activation_alpha", "activation_beta")


def sole_consumer(graph: Graph, consumers: dict[str, list[Node]], name: str) -> Node | None:
    """The only node reading ``name``, or None when it has several readers or is a graph output."""
    readers = consumers.get(name, [])
    if len(readers) != 1 or name in graph.output_names():
        return None
    return readers[0]


def is_unused(graph: Graph, consumers: dict[str, list[Node]], name: str) -> bool:
    """True when ``name`` is absent, or nobody reads it and it is not a graph output."""
    return not name or (name not in consumers and name not in graph.output_names())


def activation_allowed(ctx: Any, activation: str) -> bool:
    """May a pass produce this fused epilogue?  Only when every target lists it."""
    targets = getattr(ctx, "targets", None) or []
    return all(activation in t.fused_activations for t in targets)


def has_epilogue(node: Node) -> bool:
    return bool(node.attrs.get("activation"))


def static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    """The shape of ``name`` when every dimension is a known integer, else None."""
    shape = graph.shape_of(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def rank_of(graph: Graph, name: str) -> int | None:
    shape = graph.shape_of(name)
    return None if shape is None else len(shape)


def scalar_const(graph: Graph, name: str) -> float | None:
    """The value of a constant holding a single element (any shape), else None."""
    c = graph.const(name)
    if c is None or c.size != 1:
        return None
    return float(c.reshape(-1)[0])


def is_close(value: float | None, target: float, tol: float = 1e-6) -> bool:
    return value is not None and abs(value - target) <= tol * max(1.0, abs(target))


def opset(graph: Graph) -> int:
    return int(graph.opsets.get("", graph.opsets.get("ai.onnx", 17)))


def is_float(array: np.ndarray | None) -> bool:
    return array is not None and np.issubdtype(array.dtype, np.floating)


def drop_values(graph: Graph, *names: str) -> None:
    """Forget the type/shape records of values that no longer exist."""
    for name in names:
        graph.values.pop(name, None)


def remove_nodes(graph: Graph, *nodes: Node) -> None:
    ids = {id(n) for n in nodes}
    graph.nodes = [n for n in graph.nodes if id(n) not in ids]


def replace_node(graph: Graph, old: Node, new: Node) -> None:
    """Put ``new`` where ``old`` was in the node order."""
    graph.nodes[next(i for i, n in enumerate(graph.nodes) if n is old)] = new


def become(node: Node, op_type: str, inputs: list[str], domain: str = "", attrs: dict | None = None) -> None:
    """Turn ``node`` into another op in place (keeps its name, outputs and list position)."""
    node.op_type, node.domain, node.inputs = op_type, domain, inputs
    node.attrs = dict(attrs or {})
    node.proto = node.kernel = node.target = None


def broadcast_keeps_shape(shape: tuple | None, other: tuple[int, ...]) -> bool:
    """True when broadcasting a tensor of ``shape`` with a constant of shape ``other`` leaves
    ``shape`` unchanged (known rank, and each constant dim is 1 or equal to a known dim)."""
    if shape is None or len(other) > len(shape):
        return False
    for d, c in zip(reversed(shape), reversed(other)):
        if c != 1 and not (isinstance(d, int) and d == c):
            return False
    return True


def channel_vector(c: np.ndarray, rank: int | None, axis: int, channels: int) -> np.ndarray | None:
    """``c`` as a vector of ``channels`` values when adding it to a tensor of ``rank`` only varies
    along ``axis`` (negative counts from the end) and does not grow the result; else None."""
    if rank is None:
        # Unknown rank: only a vector added along the last axis is safe.
        if c.ndim > 1 or axis != -1:
            return None
        rank = 1
    if c.ndim > rank:
        return None
    axis = axis % rank
    aligned = (1,) * (rank - c.ndim) + tuple(c.shape)
    for i, d in enumerate(aligned):
        if d != 1 and not (i == axis and d == channels):
            return None
    return np.broadcast_to(c.reshape(-1), (channels,)).copy() if c.size in (1, channels) else None


def sync_proto(node: Node) -> None:
    """Rewrite a node's kept NodeProto after its attributes changed.

    Nodes without a native kernel run through the ONNX reference from ``node.proto``; a pass
    that edits ``node.attrs`` must keep that copy in step or the edit would be ignored there.
    """
    if node.proto is None:
        return
    import onnx
    from onnx import helper, numpy_helper

    old = onnx.NodeProto()
    old.ParseFromString(node.proto)
    A = onnx.AttributeProto
    opaque = (A.GRAPH, A.GRAPHS, A.SPARSE_TENSOR, A.SPARSE_TENSORS, A.TYPE_PROTO, A.TYPE_PROTOS)
    kept = [a for a in old.attribute if a.name not in node.attrs and a.type in opaque]
    new = onnx.NodeProto()
    new.CopyFrom(old)
    del new.attribute[:]
    new.attribute.extend(kept)
    for key, value in node.attrs.items():
        if isinstance(value, np.ndarray):
            value = numpy_helper.from_array(value)
        new.attribute.append(helper.make_attribute(key, value))
    del new.input[:]
    new.input.extend(node.inputs)
    del new.output[:]
    new.output.extend(node.outputs)
    node.proto = new.SerializeToString(deterministic=True)


# ---------------------------------------------------------------- values read by subgraphs
# The IR lists a node's explicit inputs only, but the subgraphs of If/Loop/Scan (kept in
# ``node.proto``) may read outer values by name.  Such a value must not be renamed, removed, or
# fused away, so passes count the subgraph's node as one more reader of it.


def implicit_inputs(node: Node) -> frozenset[str]:
    """Outer-scope values the node's subgraphs read (empty for nodes without subgraphs)."""
    return subgraph_outer_refs(node.proto) if node.proto is not None else frozenset()


def consumers(graph: Graph) -> dict[str, list[Node]]:
    """``graph.consumers()`` plus subgraph-holding nodes as readers of the outer values they use."""
    result = graph.consumers()
    for n in graph.nodes:
        for name in implicit_inputs(n):
            readers = result.setdefault(name, [])
            if not any(r is n for r in readers):
                readers.append(n)
    return result


def implicit_refs(graph: Graph) -> set[str]:
    """Every value some subgraph reads from the main graph."""
    return {name for n in graph.nodes for name in implicit_inputs(n)}


def remove_unused_initializers(graph: Graph) -> int:
    """Like ``Graph.remove_unused_initializers`` but keeps initializers read only by subgraphs."""
    used = {i for n in graph.nodes for i in n.inputs} | graph.output_names() | implicit_refs(graph)
    dead = [k for k in graph.initializers if k not in used]
    for k in dead:
        del graph.initializers[k]
    return len(dead)
