"""Run the cleanup and fusion passes on the bodies of If/Loop/Scan, nested ones included.

A body runs on the host in optcli's control-flow executor (``ops/control_flow.py``), one step per
node, every iteration: a decoder's 500-step ``Loop`` pays each body node 500 times.  Left as
exported, a body keeps what the main graph's passes remove everywhere else: ``MatMul`` + ``Add``
pairs (one ``optcli.FullyConnected`` here), an activation after an ``Add`` (its fused epilogue),
``x * Sigmoid(x)`` (one ``Swish``), Identity and no-op nodes, repeated subexpressions.

Each body becomes an IR graph of its own (``_helpers/bodies.py``: outer reads as inputs, shapes
only where they hold for every iteration), goes through ``pipeline.BODY_PASSES`` (``ctx.body_passes``; it holds this
pass too: bodies nested in it are compiled the same way) and is written back into the node's
proto.  A body whose result holds a node the executor could not run (an ``optcli`` op without a
kernel that fits any node, a fused epilogue on an op only onnx.reference runs) is kept as it was.
Bodies run on the host: only the host targets' capabilities are asked.
"""

from __future__ import annotations

from typing import Any

import onnx

from optcli.ir import Graph, Names, Node, subgraph_outer_refs
from optcli.ops.control_flow import BODY_OPTCLI_OPS
from optcli.ops.reference import CONTROL_FLOW
from optcli.ops.registry import has_native_kernel, kernels_for
from optcli.passes._helpers import bodies
from optcli.passes._helpers.graph_queries import EPILOGUE_ATTRS

NAME = "compile_bodies"
DESCRIPTION = "run the cleanup and fusion passes on If/Loop/Scan bodies (MatMul+Add -> FC, epilogues, folding)"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    counts = {"bodies": 0, "nodes_before": 0, "nodes_after": 0, "kept": 0}
    if not getattr(ctx, "body_passes", None):
        return counts  # run outside pipeline.optimize, which says what bodies go through
    reserved: set[str] | None = None
    for node in graph.nodes:
        if node.proto is None or node.op_type not in CONTROL_FLOW or node.domain not in ("", "ai.onnx"):
            continue
        if reserved is None:
            reserved = set(Names(graph).taken)
        proto = onnx.NodeProto()
        proto.ParseFromString(node.proto)
        changed = False
        for attr in proto.attribute:
            for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                new = _compile(body, node.op_type, graph, ctx, reserved | _nested_names(proto, body), counts)
                if new is not None:
                    body.CopyFrom(new)
                    changed = True
        if changed:
            node.proto = proto.SerializeToString(deterministic=True)
            explicit = list(proto.input)
            node.inputs = explicit + sorted(subgraph_outer_refs(node.proto) - set(explicit))
    return counts


def _nested_names(node: onnx.NodeProto, body: onnx.GraphProto) -> set[str]:
    """The names of the node's other bodies (an If's two branches must not take each other's)."""
    return {n for g in bodies.subgraphs(node) if g is not body for n in bodies.all_names(g)}


def _compile(body: onnx.GraphProto, op_type: str, outer: Graph, ctx: Any, reserved: set[str],
             counts: dict[str, int]) -> onnx.GraphProto | None:
    scope = {v.name: v for v in outer.inputs} | dict(outer.values)
    sub = bodies.to_graph(body, op_type, outer.opsets, scope, reserved | bodies.all_names(body))
    if sub is None:
        return None
    before = len(body.node)
    body_ctx = _body_context(ctx)
    for p in body_ctx.body_passes:
        p.run(sub, body_ctx)
    counts["bodies"] += 1
    if not all(_runnable(n) for n in sub.nodes):
        counts["kept"] += 1
        return None
    counts["nodes_before"] += before
    counts["nodes_after"] += len(sub.nodes)
    return bodies.to_body(sub, body)


def _body_context(ctx: Any) -> Any:
    """The context the body passes run in: the host targets only, no quantization settings; the
    warnings go to the caller's."""
    from optcli.passes.base import PassContext

    targets = [t for t in getattr(ctx, "targets", []) if getattr(t, "device", "cpu") == "cpu"]
    body_ctx = PassContext(targets=targets, body_passes=ctx.body_passes)
    body_ctx.warnings = ctx.warnings
    return body_ctx


def _runnable(node: Node) -> bool:
    """Whether the control-flow executor runs the node as the passes left it: a kept proto runs as
    before; an ``optcli`` op or a fused epilogue needs optcli's kernel for any node of the op."""
    if node.proto is not None:
        return True
    fused = node.domain not in ("", "ai.onnx") or any(k in node.attrs for k in EPILOGUE_ATTRS)
    if node.domain not in ("", "ai.onnx") and node.op_type not in BODY_OPTCLI_OPS:
        return False
    generic = any(k.applies is None for k in kernels_for(node.op_type, node.domain))
    return not fused or (generic and has_native_kernel(node.op_type, node.domain, node.outputs))
