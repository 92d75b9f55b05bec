"""Turn QOperator-format ops (QLinearConv, QLinearMatMul, onnxruntime's QLinearAdd, QGemm, ...)
into their float op between DequantizeLinear and QuantizeLinear.

That is the QDQ form, which ``fold_qdq`` then folds into FakeQuant and int8-stored weights, so a
model onnxruntime quantized in QOperator format runs on the GPU as a float view (as the
TensorFlow Lite GPU delegate runs quantized models) instead of crossing to the host at every op.
The result differs from integer arithmetic only where a float accumulation lands exactly on a
rounding tie of the requantization.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Graph, Node, Value
from optcli.passes.base import PassContext

NAME = "qoperator_to_qdq"
DESCRIPTION = "rewrite QLinearConv/QLinearMatMul/QLinearAdd/... as DequantizeLinear -> float op -> QuantizeLinear"

MS = "com.microsoft"
# (domain, op) -> (float op, positions of (x, scale, zero point) triples, (y scale, y zp) positions)
_TABLE = {
    ("", "QLinearConv"): ("Conv", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    ("", "QLinearMatMul"): ("MatMul", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    (MS, "QLinearAdd"): ("Add", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    (MS, "QLinearMul"): ("Mul", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    (MS, "QLinearSigmoid"): ("Sigmoid", [(0, 1, 2)], (3, 4)),
    (MS, "QLinearLeakyRelu"): ("LeakyRelu", [(0, 1, 2)], (3, 4)),
    (MS, "QLinearGlobalAveragePool"): ("GlobalAveragePool", [(0, 1, 2)], (3, 4)),
    (MS, "QLinearAveragePool"): ("AveragePool", [(0, 1, 2)], (3, 4)),
    (MS, "QGemm"): ("Gemm", [(0, 1, 2), (3, 4, 5)], (7, 8)),
}
_BIAS = {"QLinearConv": (8, 1, 4), "QGemm": (6, 1, 4)}  # op -> (int32 bias, x scale, w scale) positions


def _float_bias(graph: Graph, node: Node) -> np.ndarray | None:
    """An int32 bias (QLinearConv, QGemm) is in the scale of the product, x_scale * w_scale."""
    b_at, xs_at, ws_at = _BIAS[node.op_type]
    b, xs, ws = graph.const(node.input(b_at)), graph.const(node.input(xs_at)), graph.const(node.input(ws_at))
    if b is None or xs is None or ws is None or xs.size != 1 or ws.size not in (1, b.size):
        return None
    return (b.astype(np.float64) * float(xs.reshape(-1)[0]) * ws.astype(np.float64).reshape(-1)).astype(np.float32)


def _rewrite(graph: Graph, node: Node) -> bool:
    float_op, triples, out = _TABLE[(node.domain, node.op_type)]
    if node.attrs.get("channels_last"):
        return False
    has_bias = node.op_type in _BIAS and bool(node.input(_BIAS[node.op_type][0]))
    bias = _float_bias(graph, node) if has_bias else None
    if has_bias and bias is None:
        return False  # a bias we cannot rescale at optimize time: left to the exact integer kernel
    new: list[Node] = []
    float_inputs = []
    for k, (x, s, z) in enumerate(triples):
        deq = graph.unique_name(f"{node.name}_in{k}_dq")
        inputs = [node.input(x), node.input(s)] + ([node.input(z)] if node.input(z) else [])
        attrs = {"axis": 0} if float_op == "Conv" and k == 1 else {}
        if float_op == "MatMul" and k == 1 and graph.const(node.input(s)) is not None and \
                graph.const(node.input(s)).size > 1:
            attrs = {"axis": 1}  # per-column scales of the right operand
        new.append(Node("DequantizeLinear", inputs, [deq], attrs, graph.unique_name(f"{node.name}_dq{k}")))
        graph.values[deq] = Value(deq, "float32", graph.shape_of(node.input(x)))
        float_inputs.append(deq)
    if bias is not None:
        float_inputs.append(graph.add_initializer(f"{node.name}_bias", bias))
    result = graph.unique_name(f"{node.name}_float")
    graph.values[result] = Value(result, "float32", graph.shape_of(node.outputs[0]))
    attrs = {k: v for k, v in node.attrs.items() if k != "channels_last"}
    new.append(Node(float_op, float_inputs, [result], attrs, graph.unique_name(f"{node.name}_{float_op}")))
    if node.input(out[0]):
        q_inputs = [result, node.input(out[0])] + ([node.input(out[1])] if node.input(out[1]) else [])
        new.append(Node("QuantizeLinear", q_inputs, [node.outputs[0]], {}, graph.unique_name(f"{node.name}_q")))
    else:  # QGemm without y_scale has a float output
        new[-1].outputs = [node.outputs[0]]
    index = next(i for i, n in enumerate(graph.nodes) if n is node)
    graph.nodes[index:index + 1] = new
    return True


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    rewritten = 0
    for node in list(graph.nodes):
        key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
        if key in _TABLE and node.proto is None and _rewrite(graph, node):
            rewritten += 1
    if rewritten:
        fill_shapes_by_running(graph)
    return {"rewritten": rewritten}


def fill_shapes_by_running(graph: Graph) -> int:
    """Shapes ONNX inference could not give (outputs of contrib ops, and all that follows them):
    run the graph once on zeros, when every input shape is static, and record what comes out.
    GPU placement needs static shapes."""
    if not all(v.is_static for v in graph.inputs):
        return 0
    from optcli.runtime.evaluate import evaluate_node

    env = {**graph.initializers, **{v.name: np.zeros(v.shape, v.dtype if v.dtype != "unknown" else "float32")
                                    for v in graph.inputs}}
    filled = 0
    for node in graph.nodes:
        try:
            outs = evaluate_node(node, [env[i] if i else None for i in node.inputs], graph.opsets)
        except Exception:
            return filled  # leave the rest unknown: they simply stay on the host
        for name, value in zip(node.outputs, outs):
            if name and isinstance(value, np.ndarray):
                env[name] = value
                known = graph.values.get(name)
                if known is None or not known.is_static:
                    graph.values[name] = Value(name, value.dtype.name, tuple(value.shape))
                    filled += 1
    return filled
