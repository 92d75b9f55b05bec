"""Merge nodes that compute the same thing: same op, same inputs, same attributes.

Exporters repeat work freely: PyTorch traces ``x.shape[0]`` afresh for every ``view`` (three
``Shape -> Gather -> Unsqueeze`` chains per attention block, each feeding an identical
``Concat``), TF-style 'same' padding casts the same dim twice, timm's attention takes the
square root of the same scale twice.  Each copy is a step to plan and run, and a copy left in
place also hides the chain from the shape fusions that follow.  onnxruntime does the same at its
basic level (CommonSubexpressionElimination).

One sweep in node order: each node's inputs are first renamed to the survivors of earlier
merges (so whole duplicated chains collapse in the same sweep), then the node is looked up by
its key and either becomes the survivor for that key or is removed, its readers reading the
survivor's outputs.  Small constants are compared by value, so ``Unsqueeze(x, axes=[0])`` with
two different ``[0]`` initializers still match.

Never merged: random ops (two draws must differ), nodes with subgraphs, nodes whose outputs are
graph outputs or read by a subgraph (neither can be renamed), nodes without outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from optcli.ir import Graph, Node
from optcli.passes._helpers.graph_queries import drop_values, implicit_inputs, implicit_refs

NAME = "eliminate_common_subexpressions"
DESCRIPTION = "merge nodes with the same op, inputs and attributes (repeated shape chains, casts, scales)"

NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
     "Dropout"}
)
# Binary ops whose result does not depend on the operand order, bit for bit.
COMMUTATIVE = frozenset({"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "BitwiseAnd", "BitwiseOr",
                         "BitwiseXor"})
BY_VALUE_ELEMENTS = 1024  # constants up to this size match by value; bigger ones by name


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an attribute value that is equal exactly when the values are."""
    if isinstance(value, np.ndarray):
        return ("nd", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, onnx.TensorProto):
        return ("tp", value.SerializeToString(deterministic=True))
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, float) and value != value:
        return ("nan",)
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__name__, repr(value))
    return (type(value).__name__, value)


def _has_subgraph(node: Node) -> bool:
    if node.proto is None:
        return False
    if implicit_inputs(node):
        return True
    proto = onnx.NodeProto()
    proto.ParseFromString(node.proto)
    kinds = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(a.type in kinds for a in proto.attribute)


class _Keys:
    """Input keys: a constant small enough stands for its value, anything else for its name."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.memo: dict[str, Any] = {}

    def of(self, name: str) -> Any:
        key = self.memo.get(name)
        if key is None:
            c = self.graph.const(name)
            if c is not None and c.size <= BY_VALUE_ELEMENTS and c.dtype != object:
                key = ("const", c.dtype.str, c.shape, c.tobytes())
            else:
                key = ("value", name)
            self.memo[name] = key
        return key


def _node_key(node: Node, keys: _Keys) -> Any:
    inputs = [keys.of(i) if i else ("absent",) for i in node.inputs]
    if node.op_type in COMMUTATIVE and node.domain in ("", "ai.onnx") and len(inputs) == 2:
        inputs.sort(key=repr)
    attrs = tuple(sorted((k, _freeze(v)) for k, v in node.attrs.items()))
    return (node.domain or "", node.op_type, tuple(inputs), attrs, len(node.outputs))


def _rename_inputs(node: Node, alias: dict[str, str]) -> None:
    if any(i in alias for i in node.inputs):
        node.inputs = [alias.get(i, i) for i in node.inputs]
        if node.proto is not None:
            # The reference fallback feeds the proto's inputs by name: rename its explicit ones
            # (node.inputs may go on with the subgraphs' outer reads, which the proto must not list).
            proto = onnx.NodeProto()
            proto.ParseFromString(node.proto)
            explicit = len(proto.input)
            del proto.input[:]
            proto.input.extend(node.inputs[:explicit])
            node.proto = proto.SerializeToString(deterministic=True)


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    outputs = graph.output_names()
    pinned = implicit_refs(graph)  # values subgraphs read by name: they cannot be renamed
    keys = _Keys(graph)
    alias: dict[str, str] = {}
    seen: dict[Any, Node] = {}
    removed: set[int] = set()
    for node in graph.nodes:
        if alias:
            _rename_inputs(node, alias)
        if not node.outputs or node.op_type in NONDETERMINISTIC or _has_subgraph(node):
            continue
        key = _node_key(node, keys)
        survivor = seen.get(key)
        if survivor is None:
            seen[key] = node
            continue
        mergeable = all(
            (not o) or (s and o not in outputs and o not in pinned)
            for o, s in zip(node.outputs, survivor.outputs)
        )
        if not mergeable:
            continue
        for o, s in zip(node.outputs, survivor.outputs):
            if o:
                alias[o] = s
                drop_values(graph, o)
        removed.add(id(node))
    if alias:
        # The sweep renamed every reader that comes after its producer; this catches a reader
        # listed before it, should a rewrite have left the order loose.
        for node in graph.nodes:
            _rename_inputs(node, alias)
    graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return {"merged": len(removed)}
