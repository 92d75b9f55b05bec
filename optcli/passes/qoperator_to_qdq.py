"""Turn QOperator-format ops (QLinearConv, QLinearMatMul, onnxruntime's QLinearAdd, QGemm, ...)
into their float op between DequantizeLinear and QuantizeLinear.

That is the QDQ form, which ``fold_qdq`` then folds into FakeQuant and int8-stored weights, so a
model onnxruntime quantized in QOperator format runs on the GPU as a float view (as the
TensorFlow Lite GPU delegate runs quantized models) instead of crossing to the host at every op.
The result differs from integer arithmetic only where a float accumulation lands exactly on a
rounding tie of the requantization.  With no GPU target the ops stay: the host's integer kernels
(``optcli.ops.quant``, ``quant_contrib``) reproduce onnxruntime's arithmetic exactly.

Either way the quantized arithmetic over constants (run-time 'same' padding) is folded first,
with those integer kernels.
"""

from __future__ import annotations

import numpy as np

from optcli.ir import Graph, Names, Node, Value
from optcli.passes import fold_constants
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


def _weight_axis(node: Node) -> int:
    """The axis per-channel scales of the second operand run along: the output channels.

    Conv weights are [M, C/g, ...] (axis 0); a MatMul's right operand is [..., K, N] (axis -1);
    QGemm's B is [K, N], or [N, K] with transB (axis 0): DequantizeLinear's default axis 1 would
    broadcast an [N] scale against K.
    """
    if node.op_type == "QLinearConv":
        return 0
    if node.op_type == "QGemm":
        return 0 if int(node.attrs.get("transB", 0)) else 1
    return -1


def _rewrite(graph: Graph, node: Node, names: Names) -> list[Node] | None:
    """The DequantizeLinear -> float op -> QuantizeLinear nodes that replace ``node``, or None."""
    float_op, triples, out = _TABLE[_key(node)]
    if node.attrs.get("channels_last"):
        return None
    has_bias = node.op_type in _BIAS and bool(node.input(_BIAS[node.op_type][0]))
    bias = _float_bias(graph, node) if has_bias else None
    if has_bias and bias is None:
        return None  # a bias we cannot rescale at optimize time: left to the exact integer kernel
    new: list[Node] = []
    float_inputs = []
    for k, (x, s, z) in enumerate(triples):
        deq = names.fresh(f"{node.name}_in{k}_dq")
        inputs = [node.input(x), node.input(s)] + ([node.input(z)] if node.input(z) else [])
        attrs = {"axis": _weight_axis(node)} if k == 1 and float_op in ("Conv", "MatMul", "Gemm") else {}
        new.append(Node("DequantizeLinear", inputs, [deq], attrs, names.fresh(f"{node.name}_dq{k}")))
        graph.values[deq] = Value(deq, "float32", graph.shape_of(node.input(x)))
        float_inputs.append(deq)
    if bias is not None:
        float_inputs.append(names.initializer(f"{node.name}_bias", bias))
    result = names.fresh(f"{node.name}_float")
    graph.values[result] = Value(result, "float32", graph.shape_of(node.outputs[0]))
    attrs = {k: v for k, v in node.attrs.items() if k != "channels_last"}
    new.append(Node(float_op, float_inputs, [result], attrs, names.fresh(f"{node.name}_{float_op}")))
    if node.input(out[0]):
        q_inputs = [result, node.input(out[0])] + ([node.input(out[1])] if node.input(out[1]) else [])
        new.append(Node("QuantizeLinear", q_inputs, [node.outputs[0]], {}, names.fresh(f"{node.name}_q")))
    else:  # QGemm without y_scale has a float output
        new[-1].outputs = [node.outputs[0]]
    return new


def _key(node: Node) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if not any(_key(n) in _TABLE for n in graph.nodes):
        return {"rewritten": 0}
    # Quantized arithmetic over constants (exporters' run-time 'same' padding: Shape -> ... ->
    # QLinearMul -> QLinearAdd -> QLinearConcat -> Pad) folds first, with the integer kernels that
    # reproduce onnxruntime's rounding: the float view could land one step off on a pad size and
    # shift the whole image.  ONNX inference knows no contrib op, so the shapes after the first
    # one come from running the graph once.
    fold_constants.run(graph, ctx)
    if fill_shapes_by_running(graph):
        fold_constants.run(graph, ctx)
    if not any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        # No GPU to run the float view: the host's integer kernels give onnxruntime's results
        # bit for bit (the float view differs wherever a float accumulation lands on the other
        # side of a rounding tie, and the flips compound over a deep network).
        return {"rewritten": 0}
    names, nodes, rewritten = Names(graph), [], 0
    for node in graph.nodes:
        replacement = _rewrite(graph, node, names) if _key(node) in _TABLE and node.proto is None else None
        nodes.extend(replacement or [node])
        rewritten += replacement is not None
    graph.nodes = nodes
    if rewritten:
        fill_shapes_by_running(graph)
    return {"rewritten": rewritten}


def fill_shapes_by_running(graph: Graph) -> int:
    """Shapes ONNX inference could not give (outputs of contrib ops, and all that follows them):
    run the graph once on zeros, when every input shape is static, and record what comes out.
    GPU placement needs static shapes."""
    if not all(v.is_static for v in graph.inputs):
        return 0
    from optcli.ops.evaluate import evaluate_node

    env = {**graph.initializers, **{v.name: np.zeros(v.shape, v.dtype if v.dtype != "unknown" else "float32")
                                    for v in graph.inputs}}
    filled = 0
    for node in graph.nodes:
        try:
            outs = evaluate_node(node, [env[i] if i else None for i in node.inputs], graph.opsets)
        except Exception:
            return filled  # leave the rest unknown: they simply stay on the host
        for name, value in zip(node.outputs, outs):
            if name and isinstance(value, (np.ndarray, np.generic)):
                value = np.asarray(value)  # kernels may give a numpy scalar for a 0-d result
                env[name] = value
                known = graph.values.get(name)
                if known is None or not known.is_static:
                    graph.values[name] = Value(name, value.dtype.name, tuple(value.shape))
                    filled += 1
    return filled
