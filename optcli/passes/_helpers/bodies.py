"""An If/Loop/Scan body (an ONNX GraphProto) as an IR graph the passes can rewrite, and back.

The IR does not model subgraphs: a control-flow node keeps its NodeProto, bodies included, and
the runtime compiles each body into steps of optcli's kernels (``ops/control_flow.py``).  To run
the cleanup and fusion passes on a body, ``to_graph`` makes it a ``Graph`` of its own:

* its formal inputs first, then every value it reads from the enclosing scopes as one more graph
  input (so dataflow, toposort and the passes see those reads like any other; ``to_body`` leaves
  them out again: they stay outer reads);
* shapes only where they are facts for every iteration: an outer value's shape (the enclosing
  graph's), a Loop's iteration number and condition (scalars).  A loop-carried value can change
  shape from one iteration to the next, and shapes onnx inferred or the exporter declared inside
  a body are taken from the first one, so they are dropped: a pass that folds ``Shape`` or drops a
  "no-op" Reshape must not see them.  Shape inference then derives what follows from facts.
  Element types are kept (ONNX fixes them across iterations);
* every name of the enclosing scopes and of nested bodies reserved (``Graph.values``), so a name a
  pass makes up cannot shadow one of them (ONNX scopes are single assignment across nesting).

``to_body`` writes the graph back as a GraphProto with the body's own inputs and outputs, its
constants as initializers and each node as ONNX (a kept NodeProto as it is; a fused node in the
``optcli`` domain or with its epilogue attributes).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from optcli.ir import Graph, Node, Value
from optcli.ops.reference import node_from_proto

_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                                                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])]


def all_names(body: onnx.GraphProto) -> set[str]:
    """Every name a body and the bodies nested in it use or define."""
    names = {v.name for v in [*body.input, *body.output, *body.value_info]} | {t.name for t in body.initializer}
    for n in body.node:
        names.update(n.input)
        names.update(n.output)
        names.add(n.name)
        for g in subgraphs(n):
            names |= all_names(g)
    names.discard("")
    return names


def _dtype(vi: onnx.ValueInfoProto) -> str:
    elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name if elem else "unknown"
    except Exception:  # noqa: BLE001 - bfloat16, float8...: a dtype numpy has no name for
        return "unknown"


def to_graph(body: onnx.GraphProto, op_type: str, opsets: dict[str, int], outer: dict[str, Value],
             reserved: set[str]) -> Graph | None:
    """The body as an IR graph (see the module docstring), or None for a body the IR cannot hold
    (sparse initializers, a value that is not a tensor)."""
    if body.sparse_initializer or any(not v.type.HasField("tensor_type") for v in [*body.input, *body.output]):
        return None
    initializers = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    values: dict[str, Value] = {name: Value(name, "unknown", None) for name in reserved}
    for vi in [*body.value_info, *body.output, *body.input]:
        values[vi.name] = Value(vi.name, _dtype(vi), None)
    inputs = [values[vi.name] for vi in body.input]
    if op_type == "Loop" and len(inputs) >= 2:
        inputs[0].shape, inputs[1].shape = (), ()  # the iteration number and the condition: scalars
    nodes: list[Node] = []
    used: set[str] = set()
    for k, proto in enumerate(body.node):
        name = proto.name or f"{proto.op_type}_{k}"
        while name in used:
            name = f"{name}_{k}"
        used.add(name)
        nodes.append(node_from_proto(proto, name))
    defined = {v.name for v in inputs} | set(initializers) | {o for n in nodes for o in n.outputs}
    reads = [i for n in nodes for i in n.inputs] + [v.name for v in body.output]
    for name in dict.fromkeys(r for r in reads if r and r not in defined):
        known = outer.get(name)
        value = Value(name, known.dtype, known.shape) if known is not None else Value(name, "unknown", None)
        values[name] = value
        inputs.append(value)
        defined.add(name)
    outputs = [values[vi.name] for vi in body.output]
    graph = Graph(body.name or "body", nodes, inputs, outputs, initializers, values, dict(opsets))
    graph.toposort()
    return graph


def to_body(graph: Graph, original: onnx.GraphProto) -> onnx.GraphProto:
    """The rewritten graph as the body that replaces ``original``: same inputs and outputs (their
    declarations as they were), no value_info (shapes inside are derived per run)."""
    body = onnx.GraphProto()
    body.name = original.name
    body.input.extend(original.input)
    body.output.extend(original.output)
    formal = {v.name for v in original.input}
    body.initializer.extend(numpy_helper.from_array(np.asarray(a), name)
                            for name, a in graph.initializers.items() if name not in formal)
    originals = {n.name: n for n in original.node if n.name}
    body.node.extend(_node_proto(n, originals) for n in graph.nodes)
    return body


def _node_proto(node: Node, originals: dict[str, onnx.NodeProto]) -> onnx.NodeProto:
    if node.proto is not None:
        proto = onnx.NodeProto()
        proto.ParseFromString(node.proto)
        explicit = len(proto.input)  # node.inputs goes on with its subgraphs' outer reads
        del proto.input[:]
        proto.input.extend(node.inputs[:explicit])
        del proto.output[:]
        proto.output.extend(node.outputs)
        return proto
    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain)
    like = originals.get(node.name)
    kinds = {a.name: a.type for a in like.attribute} if like is not None and like.op_type == node.op_type else {}
    for key, value in node.attrs.items():
        if key.startswith("_"):
            continue
        if isinstance(value, np.ndarray):
            value = numpy_helper.from_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            value = [numpy_helper.from_array(v) for v in value]
        if isinstance(value, list) and not value:
            kind = kinds.get(key)
            if kind is None:
                raise ValueError(f"empty list attribute '{key}' of {node.describe()} has no type")
            proto.attribute.append(helper.make_attribute(key, value, attr_type=kind))
        else:
            proto.attribute.append(helper.make_attribute(key, value))
    return proto
