"""Fold a following per-channel constant ``Mul`` into the Conv or ConvTranspose before it.

ConvNeXt's layer scale (``gamma * block(x)``, ``gamma`` of shape ``[1, C, 1, 1]`` or ``[C, 1, 1]``)
and models exported with BatchNormalization already split into ``Mul`` and ``Add`` leave a
``Conv -> Mul(constant)`` in every block.  Multiplying a conv's output channel by ``s`` is the
same as multiplying that channel's filter and bias by ``s``, so the Mul costs nothing once folded
(onnxruntime: ConvMulFusion).  A following per-channel ``Add`` is then taken by
``fuse_conv_bias_activation`` as before.

Only when the conv has no fused epilogue yet, its output is read by the Mul alone, and the
constant only varies along the channel axis without growing the output.  The scaled weights are
new initializers (``fuse_conv_bn``'s folding), so a weight shared with another conv is left alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from optcli.ir import Graph, Names
from optcli.passes._helpers import graph_queries
from optcli.passes._helpers.graph_queries import channel_vector, has_epilogue, is_float, rank_of, sole_consumer
from optcli.passes.fuse_conv_bn import fold_scale_shift

NAME = "fuse_conv_scale"
DESCRIPTION = "fold Mul by a per-output-channel constant into the preceding Conv/ConvTranspose weights"


def run(graph: Graph, ctx: Any) -> dict[str, int]:
    # Folding one Mul never changes who reads another conv's output, so one snapshot serves all.
    consumers = graph_queries.consumers(graph)
    names = Names(graph)
    folded: set[int] = set()
    for conv in list(graph.nodes):
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx"):
            continue
        w = graph.const(conv.input(1))
        if has_epilogue(conv) or not is_float(w) or w.ndim < 3:
            continue
        mul = sole_consumer(graph, consumers, conv.outputs[0])
        if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or has_epilogue(mul):
            continue
        if len(mul.inputs) != 2 or conv.outputs[0] not in mul.inputs:
            continue
        other = mul.input(1) if mul.input(0) == conv.outputs[0] else mul.input(0)
        c = graph.const(other)
        if not is_float(c):
            continue
        channels = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1))
        scale = channel_vector(c, rank_of(graph, conv.outputs[0]), 1, channels)
        if scale is None:
            continue
        scale = scale.astype(np.float64)
        if fold_scale_shift(graph, names, conv, mul, scale, np.zeros(channels)):
            folded.add(id(mul))
    graph.nodes = [n for n in graph.nodes if id(n) not in folded]
    return {"fused": len(folded)}
