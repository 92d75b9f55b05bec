"""Replace an ``If`` whose condition is a constant by the nodes of the branch it takes.

Exporters write ``If`` on values that are constants once the model is fixed: a traced
``if x.shape[-1] == 512`` that folds when ``--input_shapes`` pins the dim, a flag baked in as an
initializer, a sampling-rate branch where the rate is a constant.  Run as an ``If``, the taken
branch is a body in the control-flow executor (host only, one Python step per node); inlined, its
nodes are the graph's own: folded, fused, placed on the GPU, memory-planned like the rest.

The branch's values keep their names where nothing in the graph uses them already (ONNX keeps
names unique across nested graphs); a name that collides is renamed, unless a graph nested in the
branch reads it by name, in which case the ``If`` stays as it is.  The branch's outputs reach the
``If``'s outputs through ``Identity`` nodes, which ``eliminate_identity`` removes.  When anything
was inlined, constant folding runs again over the new nodes.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import numpy_helper

from optcli.ir import Graph, Names, Node, subgraph_outer_refs
from optcli.ops.reference import node_from_proto
from optcli.passes import fold_constants

NAME = "inline_constant_if"
DESCRIPTION = "replace an If on a constant condition by the nodes of the branch it takes"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    inlined, kept = 0, set()
    while True:  # a branch may hold another constant If: look again after each
        node = next((n for n in graph.nodes if id(n) not in kept and _constant_if(graph, n) is not None), None)
        if node is None:
            break
        if _inline(graph, node, _constant_if(graph, node)):
            inlined += 1
        else:
            kept.add(id(node))
    if inlined:
        graph.toposort()
        fold_constants.run(graph, ctx)
    return {"inlined": inlined}


def _constant_if(graph: Graph, node: Node) -> bool | None:
    """The branch a constant condition takes (True: then), or None when it is not known here."""
    if node.op_type != "If" or node.domain or node.proto is None or not node.inputs:
        return None
    cond = graph.const(node.inputs[0])
    if cond is None or cond.size != 1:
        return None
    return bool(cond.reshape(-1)[0])


def _inline(graph: Graph, node: Node, take_then: bool) -> bool:
    proto = onnx.NodeProto()
    proto.ParseFromString(node.proto)
    wanted = "then_branch" if take_then else "else_branch"
    branch = next((a.g for a in proto.attribute if a.name == wanted and a.type == onnx.AttributeProto.GRAPH), None)
    if branch is None or len(branch.output) < len([o for o in node.outputs if o]) or branch.sparse_initializer:
        return False  # malformed: left to the executor, which reports it
    names = Names(graph)
    own = [t.name for t in branch.initializer] + [o for n in branch.node for o in n.output if o]
    read_by_nested = set()
    for n in branch.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            read_by_nested |= subgraph_outer_refs(n.SerializeToString(deterministic=True))
    rename: dict[str, str] = {}
    for name in own:
        if name in names.taken:
            if name in read_by_nested:
                return False
            rename[name] = names.fresh(f"{node.name}/{name}")
        else:
            names.taken.add(name)
    for t in branch.initializer:
        graph.initializers[rename.get(t.name, t.name)] = numpy_helper.to_array(t).copy(order="C")
    new_nodes = []
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.input[:] = [rename.get(i, i) for i in inner.input]
        copy.output[:] = [rename.get(o, o) for o in inner.output]
        new_nodes.append(node_from_proto(copy, names.fresh(f"{node.name}/{inner.name or inner.op_type}")))
    for out, branch_out in zip(node.outputs, branch.output):
        if out:
            new_nodes.append(Node("Identity", [rename.get(branch_out.name, branch_out.name)], [out], {},
                                  names.fresh(f"{node.name}/{out}")))
    index = graph.nodes.index(node)
    graph.nodes[index:index + 1] = new_nodes
    return True
