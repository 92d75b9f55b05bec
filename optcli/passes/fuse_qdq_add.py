"""Integer residual Adds on the host: DequantizeLinear(a), DequantizeLinear(b) -> Add -> [Relu] ->
QuantizeLinear chains (onnxruntime's quantize_static QDQ output) become one ``optcli.QAdd`` step.

After ``fuse_qdq_conv`` a residual block's convs run in integers, but its Add still dequantized both
operands, added floats and quantized the sum: three steps and two float tensors per block.  A QAdd
reads the two quantized tensors and writes the quantized sum (onnxruntime's QLinearAdd arithmetic).
Only for plans with no GPU target, per-tensor parameters, 8-bit tensors and operands of one static
shape (no broadcasting); anything else is left to ``fold_qdq``'s float view.
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import clamp, dequantized, is_std, replace_chains, requantized
from optcli.passes.base import PassContext

NAME = "fuse_qdq_add"
DESCRIPTION = "turn DequantizeLinear x2 -> Add -> [Relu] -> QuantizeLinear chains into integer optcli.QAdd steps " \
              "(host-only plans)"


def _same_static_shape(graph: Graph, a: str, b: str) -> bool:
    sa, sb = graph.shape_of(a), graph.shape_of(b)
    return sa is not None and sa == sb and all(isinstance(d, int) for d in sa)


def _from_qdq(graph: Graph, add: Node, producers: dict, consumers: dict, names: Names) -> tuple[Node, list] | None:
    if len(add.inputs) != 2 or len(add.outputs) != 1:
        return None
    a, b = dequantized(graph, producers, add.input(0)), dequantized(graph, producers, add.input(1))
    out = requantized(graph, consumers, add.outputs[0])
    if a is None or b is None or out is None or not _same_static_shape(graph, a[0], b[0]):
        return None
    act, q, yq = out
    if act is not None and act.op_type != "Relu":
        return None
    bounds = clamp(graph, act, yq[0], yq[1], yq[2])
    if bounds is None:
        return None
    attrs = {"a_scale": a[1][0], "a_zero_point": a[1][1], "a_signed": int(a[1][2] == "int8"),
             "b_scale": b[1][0], "b_zero_point": b[1][1], "b_signed": int(b[1][2] == "int8"),
             "y_scale": yq[0], "y_zero_point": yq[1], "y_signed": int(yq[2] == "int8"),
             "qmin": bounds[0], "qmax": bounds[1]}
    node = Node("QAdd", [a[0], b[0]], [q.outputs[0]], attrs, names.fresh(f"{add.name}_qadd"), OPTCLI_DOMAIN)
    return node, [n for n in (act, q) if n is not None]


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"fused": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    matches = []
    for node in graph.nodes:
        found = _from_qdq(graph, node, producers, consumers, names) if is_std(node, "Add") else None
        if found is not None:
            matches.append((node, *found))
    if matches:
        replace_chains(graph, matches)
    return {"fused": len(matches)}
