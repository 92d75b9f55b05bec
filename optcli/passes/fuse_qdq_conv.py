"""Integer convolutions on the host: DequantizeLinear -> Conv -> [Relu / Clip] -> QuantizeLinear chains
(onnxruntime's quantize_static QDQ output) and QLinearConv nodes become one ``optcli.QConv`` step.

A QDQ model run as float ops with FakeQuant steps costs more than the float model it came from
(issue 26).  A QConv reads the quantized tensor (u8 / s8) that the QuantizeLinear before the
DequantizeLinear wrote, accumulates in int32 and writes the quantized tensor the QuantizeLinear after
the Conv would have written: consecutive quantized convs hand each other bytes, with no float and no
FakeQuant in between.  The weights are the model's own int8 initializers; the bias becomes int32 in
units of x_scale * w_scale (onnxruntime's quantizer already stores it that way: it is taken as is when
its scale is that product); scales and zero points become attributes the load checks see.

Only for plans with no GPU target: the GPU runs the float view of a quantized model (``fold_qdq``),
as the TensorFlow Lite GPU delegate does.  What does not match (per-channel activations, asymmetric
weights, blocked scales, 1-D or 3-D convs, a Conv output with other readers) is left to ``fold_qdq``.
The DequantizeLinear nodes other ops still read (a residual Add) stay; the others go.
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

NAME = "fuse_qdq_conv"
DESCRIPTION = ("turn DequantizeLinear -> Conv -> [Relu/Clip] -> QuantizeLinear chains and QLinearConv into "
               "integer optcli.QConv steps (host-only plans)")

_CONV_ATTRS = ("strides", "pads", "dilations", "group", "kernel_shape", "auto_pad")


def _weight(graph: Graph, w_name: str, scale_name: str, zp_name: str, axis: int) -> tuple[str, list[float]] | None:
    """A constant symmetric int8 [M, C/g, KH, KW] weight and its scales (one, or one per output channel)."""
    found = int8_weight(graph, w_name, scale_name, zp_name, 4, 0, axis)
    return None if found is None else (w_name, found[1])


def _qconv(name: str, x: str, w: str, bias: str, y: str, conv_attrs: dict, xq: tuple, w_scale: list[float],
           yq: tuple, bounds: tuple[int, int]) -> Node:
    attrs = {k: v for k, v in conv_attrs.items() if k in _CONV_ATTRS}
    attrs.update(x_scale=xq[0], x_zero_point=xq[1], x_signed=int(xq[2] == "int8"), w_scale=w_scale,
                 y_scale=yq[0], y_zero_point=yq[1], y_signed=int(yq[2] == "int8"), qmin=bounds[0], qmax=bounds[1])
    return Node("QConv", [x, w] + ([bias] if bias else []), [y], attrs, name, OPTCLI_DOMAIN)


def _from_qdq(graph: Graph, conv: Node, producers: dict, consumers: dict, names: Names) -> tuple[Node, list] | None:
    x, dq_w = dequantized(graph, producers, conv.input(0)), producers.get(conv.input(1))
    if x is None or not is_std(dq_w, "DequantizeLinear") or dq_w.attrs.get("block_size") or len(conv.outputs) != 1:
        return None
    weight = _weight(graph, dq_w.input(0), dq_w.input(1), dq_w.input(2), int(dq_w.attrs.get("axis", 1)))
    out = requantized(graph, consumers, conv.outputs[0])
    if weight is None or out is None:
        return None
    act, q, yq = out
    bounds = clamp(graph, act, yq[0], yq[1], yq[2])
    bias = int32_bias(graph, names, conv, conv.input(2), x[1][0], weight[1], producers)
    if bounds is None or bias is None:
        return None
    node = _qconv(names.fresh(f"{conv.name}_qconv"), x[0], weight[0], bias, q.outputs[0], conv.attrs, x[1],
                  weight[1], yq, bounds)
    return node, [n for n in (act, q) if n is not None]


def _from_qlinear(graph: Graph, node: Node, names: Names) -> Node | None:
    xq = scalar_params(graph, node.input(1), node.input(2))
    yq = scalar_params(graph, node.input(6), node.input(7))
    weight = _weight(graph, node.input(3), node.input(4), node.input(5), 0)
    b = graph.const(node.input(8)) if node.input(8) else None
    if xq is None or yq is None or weight is None or graph.dtype_of(node.input(0)) != xq[2]:
        return None
    if node.input(8) and (b is None or b.dtype != np.int32 or b.ndim != 1) or node.attrs.get("channels_last"):
        return None
    return _qconv(names.fresh(f"{node.name}_qconv"), node.input(0), weight[0], node.input(8), node.outputs[0],
                  node.attrs, xq, weight[1], yq, RANGE[yq[2]])


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    if any(getattr(t, "device", "cpu") == "gpu" for t in ctx.targets):
        return {"fused": 0, "qlinear": 0}
    names = Names(graph)
    producers, consumers = graph.producers(), graph_queries.consumers(graph)
    matches: list[tuple[Node, Node, list[Node]]] = []
    for node in graph.nodes:
        if is_std(node, "Conv"):
            found = _from_qdq(graph, node, producers, consumers, names)
            if found is not None:
                matches.append((node, *found))
        elif is_std(node, "QLinearConv"):
            new = _from_qlinear(graph, node, names)
            if new is not None:
                matches.append((node, new, []))
    qlinear = sum(old.op_type == "QLinearConv" for old, _, _ in matches)
    if matches:
        replace_chains(graph, matches)  # with the DequantizeLinear nodes of the weights, of inputs only convs read
    return {"fused": len(matches) - qlinear, "qlinear": qlinear}
