"""Integer dense layers on the host: DequantizeLinear -> MatMul / Gemm -> [Add bias] -> [Relu / Clip] ->
QuantizeLinear chains (onnxruntime's quantize_static QDQ output), QLinearMatMul and onnxruntime's QGemm become one
``optcli.QMatMul`` step.

After ``fuse_qdq_conv`` a conv net's convs run on bytes, but its classifier head (and every dense layer of a
transformer- or recurrent-style model) still went through ``fold_qdq``: a FakeQuant, a float MatMul of
dequantized weights, another FakeQuant.  A QMatMul reads the quantized x (u8 / s8) and writes the quantized
output the QuantizeLinear would have written, accumulating exactly in int32 (ops/qmatmul.py).  The weight is
the model's int8 initializer, kept as MatMul's [K, M] (a Gemm's transB=1 weight is stored transposed once);
the bias becomes int32 in units of x_scale * w_scale (onnxruntime's Gemm bias already is); scales and zero
points become attributes the load checks see.

Only for plans with no GPU target (the GPU runs the float view, ``fold_qdq``), like fuse_qdq_conv.  What does
not match is left to ``fold_qdq``: per-channel activations, asymmetric or non-int8 weights, weights that are
not 2-D constants, per-channel scales along K, a Gemm with transA, alpha != 1 or beta != 1, a bias that is
not [M], a MatMul output with other readers or no QuantizeLinear after it (a float output).
"""

from __future__ import annotations

import numpy as np

from optcli.ir import OPTCLI_DOMAIN, Graph, Names, Node
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.qdq import (
    RANGE,
    clamp,
    dequantized,
    int8_weight,
    int32_bias,
    is_std,
    replace_chains,
    requantized,
    scalar_params,
)
from optcli.passes.base import PassContext

NAME = "fuse_qdq_matmul"
DESCRIPTION = ("turn DequantizeLinear -> MatMul/Gemm -> [Add] -> [Relu/Clip] -> QuantizeLinear chains into integer "
               "optcli.QMatMul steps (host-only plans)")


def _weight(graph: Graph, w_name: str, scale_name: str, zp_name: str, axis: int,
            transposed: bool) -> tuple[np.ndarray, list[float]] | None:
    """A constant symmetric int8 2-D weight (``transposed``: [M, K], a Gemm's transB=1; else [K, M]) and its
    scales (one, or one per output column M along ``axis``)."""
    return int8_weight(graph, w_name, scale_name, zp_name, 2, 0 if transposed else 1, axis)


def _dequantized_weight(graph: Graph, dq: Node | None, transposed: bool) -> tuple[np.ndarray, list[float]] | None:
    if not is_std(dq, "DequantizeLinear") or dq.attrs.get("block_size"):
        return None
    return _weight(graph, dq.input(0), dq.input(1), dq.input(2), int(dq.attrs.get("axis", 1)), transposed)


def _gemm_form(node: Node) -> tuple[bool, str] | None:
    """(transB, its bias input) for a Gemm the step can take: transA 0, alpha 1, beta 1 where C is given."""
    if int(node.attrs.get("transA", 0)) or float(node.attrs.get("alpha", 1.0)) != 1.0:
        return None
    if node.input(2) and float(node.attrs.get("beta", 1.0)) != 1.0:
        return None
    return bool(int(node.attrs.get("transB", 0))), node.input(2)


def _added_bias(graph: Graph, consumers: dict, producers: dict, name: str) -> tuple[Node, str] | None:
    """The Add reading MatMul's output ``name`` as its only reader, with a bias (constant or dequantized)
    as its other input: (the Add, the bias's name)."""
    add = graph_queries.sole_consumer(graph, consumers, name)
    if not is_std(add, "Add") or len(add.inputs) != 2:
        return None
    other = add.input(1) if add.input(0) == name else add.input(0)
    if other == name or (graph.const(other) is None and not is_std(producers.get(other), "DequantizeLinear")):
        return None
    return add, other


def _bias_length_ok(graph: Graph, producers: dict, name: str, m: int) -> bool:
    """A bias the step can take is 1-D [M] (broadcast over the rows and nothing else)."""
    dq = producers.get(name)
    value = graph.const(dq.input(0)) if is_std(dq, "DequantizeLinear") else graph.const(name)
    return value is not None and value.shape == (m,)


def _from_qdq(graph: Graph, node: Node, producers: dict, consumers: dict, names: Names) -> tuple[Node, list] | None:
    x = dequantized(graph, producers, node.input(0))
    if x is None or len(node.outputs) != 1 or len(node.inputs) < 2:
        return None
    if node.op_type == "Gemm":
        form = _gemm_form(node)
        if form is None:
            return None
        transposed, bias_name = form
        tail: list[Node] = []
    else:
        transposed, bias_name, tail = False, "", []
        added = _added_bias(graph, consumers, producers, node.outputs[0])
        if added is not None:
            tail, bias_name = [added[0]], added[1]
    w_dq = producers.get(node.input(1))
    w_const = graph.const(w_dq.input(0)) if is_std(w_dq, "DequantizeLinear") else None
    if w_const is None or w_const.ndim != 2:
        return None
    m = w_const.shape[0 if transposed else 1]
    if bias_name and not _bias_length_ok(graph, producers, bias_name, m):
        return None
    out = requantized(graph, consumers, (tail[-1] if tail else node).outputs[0])
    if out is None:
        return None
    act, q, yq = out
    bounds = clamp(graph, act, yq[0], yq[1], yq[2])
    weight = _dequantized_weight(graph, w_dq, transposed) if bounds is not None else None
    bias = int32_bias(graph, names, node, bias_name, x[1][0], weight[1], producers) if weight is not None else None
    if bias is None:
        return None
    w_name = _kxm(names, w_dq.input(0), weight[0], transposed)
    step = _qmatmul(names.fresh(f"{node.name}_qmatmul"), x[0], w_name, bias, q.outputs[0], x[1], weight[1], yq,
                    bounds)
    return step, [n for n in (*tail, act, q) if n is not None]


def _kxm(names: Names, w_name: str, w: np.ndarray, transposed: bool) -> str:
    """The weight as the step reads it, [K, M]: a transposed one stored once more, transposed."""
    return names.initializer(f"{w_name}_kxm", np.ascontiguousarray(w.T)) if transposed else w_name


def _qmatmul(name: str, x: str, w: str, bias: str, y: str, xq: tuple, w_scale: list[float], yq: tuple,
             bounds: tuple[int, int]) -> Node:
    attrs = dict(x_scale=xq[0], x_zero_point=xq[1], x_signed=int(xq[2] == "int8"), w_scale=w_scale, y_scale=yq[0],
                 y_zero_point=yq[1], y_signed=int(yq[2] == "int8"), qmin=bounds[0], qmax=bounds[1])
    return Node("QMatMul", [x, w] + ([bias] if bias else []), [y], attrs, name, OPTCLI_DOMAIN)


def _from_qlinear(graph: Graph, node: Node, names: Names) -> Node | None:
    """QLinearMatMul, and onnxruntime's QGemm (com.microsoft: transA 0, alpha 1, an int32 bias in units of
    x_scale * w_scale, a quantized output), with a constant int8 B: one QMatMul (with the host alone
    qoperator_to_qdq leaves them as they are)."""
    gemm = node.op_type == "QGemm"
    if gemm and (int(node.attrs.get("transA", 0)) or float(node.attrs.get("alpha", 1.0)) != 1.0 or not node.input(8)):
        return None
    transposed = gemm and bool(int(node.attrs.get("transB", 0)))
    xq = scalar_params(graph, node.input(1), node.input(2))
    yq = scalar_params(graph, *((node.input(7), node.input(8)) if gemm else (node.input(6), node.input(7))))
    weight = _weight(graph, node.input(3), node.input(4), node.input(5), 0 if transposed else 1, transposed)
    # (x's dtype is its zero point's by the op's type constraint: unknown only after a contrib op)
    if xq is None or yq is None or weight is None or graph.dtype_of(node.input(0)) not in (None, xq[2]) \
            or len(node.outputs) != 1:
        return None
    bias = node.input(6) if gemm else ""
    b = graph.const(bias) if bias else None
    if bias and (b is None or b.dtype != np.int32 or b.shape != (weight[0].shape[0 if transposed else 1],)):
        return None
    return _qmatmul(names.fresh(f"{node.name}_qmatmul"), node.input(0), _kxm(names, node.input(3), weight[0],
                    transposed), bias, node.outputs[0], xq, weight[1], yq, RANGE[yq[2]])


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"fused": 0, "qlinear": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    matches: list[tuple[Node, Node, list[Node]]] = []
    for node in graph.nodes:
        if is_std(node, "MatMul") or is_std(node, "Gemm"):
            found = _from_qdq(graph, node, producers, consumers, names)
            if found is not None:
                matches.append((node, *found))
        elif is_std(node, "QLinearMatMul") or (node.op_type == "QGemm" and node.domain == "com.microsoft"
                                               and node.proto is None):
            new = _from_qlinear(graph, node, names)
            if new is not None:
                matches.append((node, new, []))
    qlinear = sum(old.op_type in ("QLinearMatMul", "QGemm") for old, _, _ in matches)
    if matches:
        replace_chains(graph, matches)  # with the weights' DequantizeLinear nodes, and inputs only they read
    return {"fused": len(matches) - qlinear, "qlinear": qlinear}
