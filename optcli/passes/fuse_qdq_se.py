"""The squeeze-excite block of a QDQ model in integers (host-only plans): DequantizeLinear -> GlobalAveragePool ->
QuantizeLinear becomes ``optcli.QGlobalAveragePool``, DequantizeLinear x2 -> Mul -> [Relu / Clip] ->
QuantizeLinear of a feature map [N, C, ...] by a per-channel gate [N, C, 1...] becomes ``optcli.QMul``
(onnxruntime's QLinearGlobalAveragePool and QLinearMul arithmetic, ops/qmul.py).

After ``fuse_qdq_conv`` the squeeze-excite convs and (``fuse_qdq_lookup``) the hard-sigmoid gate run on bytes,
but the pool and the multiply dequantized the feature map twice and quantized their results: with these two
steps the block hands bytes from conv to conv.  Per-tensor parameters, 8-bit tensors, ranks 3 and more with
static N and C; anything else is left to ``fold_qdq``'s float view.  The Mul must have one operand of the gate's
shape and the other of the feature map's: a Mul of two same-shape tensors (hard-swish) is ``fuse_qdq_lookup``'s
when it is a function of one tensor, and stays float when not.
"""

from __future__ import annotations

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import clamp, dequantized, is_std, replace_chains, requantized
from optcli.passes.base import PassContext

NAME = "fuse_qdq_se"
DESCRIPTION = ("turn the squeeze-excite GlobalAveragePool and per-channel Mul of QDQ chains into integer "
               "optcli.QGlobalAveragePool / optcli.QMul steps (host-only plans)")


def _output(graph: Graph, node: Node, consumers: dict) -> tuple[list[Node], Node, dict] | None:
    """The absorbed Relu / Clip and QuantizeLinear after ``node``, the new step's output and y attributes."""
    out = requantized(graph, consumers, node.outputs[0]) if len(node.outputs) == 1 else None
    if out is None:
        return None
    act, q, yq = out
    bounds = clamp(graph, act, yq[0], yq[1], yq[2])
    if bounds is None:
        return None
    attrs = {"y_scale": yq[0], "y_zero_point": yq[1], "y_signed": int(yq[2] == "int8"), "qmin": bounds[0],
             "qmax": bounds[1]}
    return [n for n in (act, q) if n is not None], q, attrs


def _in_attrs(which: str, params: tuple[float, int, str]) -> dict:
    return {f"{which}_scale": params[0], f"{which}_zero_point": params[1], f"{which}_signed": int(params[2] == "int8")}


def _pool(graph: Graph, gap: Node, producers: dict, consumers: dict, names: Names) -> tuple[Node, list] | None:
    x = dequantized(graph, producers, gap.input(0))
    shape = graph.shape_of(x[0]) if x is not None else None
    out = _output(graph, gap, consumers)
    if x is None or out is None or shape is None or len(shape) < 3:
        return None
    absorbed, q, attrs = out
    node = Node("QGlobalAveragePool", [x[0]], [q.outputs[0]], {**_in_attrs("x", x[1]), **attrs},
                names.fresh(f"{gap.name}_qpool"), OPTCLI_DOMAIN)
    return node, absorbed


def _gate_shape(feature: tuple | None) -> tuple | None:
    if feature is None or len(feature) < 3 or not all(isinstance(d, int) for d in feature[:2]):
        return None
    return (*feature[:2], *([1] * (len(feature) - 2)))


def _mul(graph: Graph, mul: Node, producers: dict, consumers: dict, names: Names) -> tuple[Node, list] | None:
    if len(mul.inputs) != 2:
        return None
    a, b = dequantized(graph, producers, mul.input(0)), dequantized(graph, producers, mul.input(1))
    out = _output(graph, mul, consumers)
    if a is None or b is None or out is None:
        return None
    sa, sb = graph.shape_of(a[0]), graph.shape_of(b[0])
    if sa is not None and sb is not None and _gate_shape(sa) is not None and tuple(sb) == _gate_shape(sa):
        x, g = a, b
    elif sa is not None and sb is not None and _gate_shape(sb) is not None and tuple(sa) == _gate_shape(sb):
        x, g = b, a
    else:
        return None
    absorbed, q, attrs = out
    node = Node("QMul", [x[0], g[0]], [q.outputs[0]], {**_in_attrs("x", x[1]), **_in_attrs("g", g[1]), **attrs},
                names.fresh(f"{mul.name}_qmul"), OPTCLI_DOMAIN)
    return node, absorbed


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"pools": 0, "muls": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    matches = []
    for node in graph.nodes:
        found = _pool(graph, node, producers, consumers, names) if is_std(node, "GlobalAveragePool") else \
            _mul(graph, node, producers, consumers, names) if is_std(node, "Mul") else None
        if found is not None:
            matches.append((node, *found))
    if matches:
        replace_chains(graph, matches)
    pools = sum(new.op_type == "QGlobalAveragePool" for _, new, _ in matches)
    return {"pools": pools, "muls": len(matches) - pools}
