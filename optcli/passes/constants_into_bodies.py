"""Give the bodies of If/Loop/Scan the graph's constants they read, as initializers of their own.

A body reads outer values by name; when those are constants (weights of the main graph read
inside a branch, as torch's script exporter writes a voice detector), the control-flow executor
(``ops/control_flow.py``) sees them only as values arriving at run time and cannot fold what the
body computes from them: torch's LSTM gate reordering (Slice and Concat of the weights) ran on
every call, 0.8 ms a run of such a detector.  Copied into the body, they are the body's
constants, folded once when the body is compiled.

A constant nothing else in the graph reads is moved (the graph's initializer goes); one the
graph also reads stays there too.  The step's implicit inputs are recomputed from the new proto.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import numpy_helper

from optcli.ir import Graph, subgraph_outer_refs
from optcli.ops.reference import CONTROL_FLOW
from optcli.passes._helpers.graph_queries import remove_unused_initializers

NAME = "constants_into_bodies"
DESCRIPTION = "copy the constants If/Loop/Scan bodies read from the graph into the bodies, to fold there"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    copied = 0
    for node in graph.nodes:
        if node.proto is None or node.op_type not in CONTROL_FLOW or node.domain:
            continue
        proto = onnx.NodeProto()
        proto.ParseFromString(node.proto)
        explicit = set(proto.input)
        consts = {name: graph.const(name) for name in sorted(subgraph_outer_refs(node.proto))
                  if name not in explicit and graph.const(name) is not None}
        if not consts:
            continue
        for attr in proto.attribute:
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else (
                list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else [])
            for body in bodies:
                own = {t.name for t in body.initializer}
                reads = _reads(body)
                for name, value in consts.items():
                    if name in reads and name not in own:
                        body.initializer.append(numpy_helper.from_array(value, name))
                        copied += 1
        node.proto = proto.SerializeToString(deterministic=True)
        node.inputs = list(proto.input) + sorted(subgraph_outer_refs(node.proto) - explicit)
    if copied:
        remove_unused_initializers(graph)
    return {"copied": copied}


def _reads(body: onnx.GraphProto) -> set[str]:
    """Every name the body's nodes, or graphs nested in them, read."""
    names: set[str] = {o.name for o in body.output}
    for n in body.node:
        names.update(i for i in n.input if i)
        for attr in n.attribute:
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                names |= _reads(g)
    return names
